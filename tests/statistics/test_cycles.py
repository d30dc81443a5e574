"""A daily covariate cycle (issue 34 point 5): 1,000 predictions an hour, labels 30-90
minutes late, 6 days, the default policy (min_samples 2,000). The true logit is
z ~ N(mu(t), 1) with mu(t) = -2 + 1.5 cos(2 pi (h - 15) / 24) (h the hour of the day:
low at 03:00, high at 15:00). Miscalibrated outside the Platt family, the model reports
z below -1 as it is and -1 + 2 (z + 1) above (over-confident only at high scores): it is
calibrated at night and over-confident in the afternoon, every day alike (the map from
score to truth never changes; only the phase of the day picks which part of it shows).

Without cycle detection a refit saw one phase: 11 publishes in 6 days (a temperature fit
on the afternoon at ~11:00-16:00, rolled back to the identity at ~02:30 and forward again
every day, 6 of them in the last 3 days). With it (calmon.recal.cycle), after the second
rollback to the calibrator live two publishes before, the series is refitted and its
rollbacks judged on a full day:

- calibrated all along: no alarm, no publish;
- miscalibrated: at most 4 publishes in 6 days and at most 1 in the last 3; served true
  ECE averaged over the last 3 days at most max(1.5x, +0.01) that of the one-day fit of
  the same method (the configured one, temperature; and isotonic for ``method: auto``),
  and below the raw model's.

The label-free estimates (CBPE: the engine's estimated accuracy and positive rate of
the pending predictions, read through ``replay --recalibrate``, the daemon's engine and
policy on event time, in the 24h window, which holds every pending prediction) are
compared with their expectation (the mean true probability of the model's decision,
and of a positive): within 0.02 at 03:00 and 15:00 for the calibrated model, within
0.03 at the end of the 6 days for the miscalibrated one.

True ECEs are exact (15 bins on 10,000 fresh samples of each hour, against their true
probabilities), averaged over every hour of the last 3 days; the one-day fits are
fitted (calmon.recal.refit.fit_one, the method alone) on every labelled sample of the
first day.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np
import pytest
from scipy.special import expit

from calmon import config as config_mod
from calmon.recal.refit import fit_one
from calmon.replay import replay_recalibrate
from tests.statistics.sim import DAY, T0, Simulation, sim_config, true_ece, uniform_delay

ALL = "__all__"
HOUR = 3600.0
KNEE, SLOPE = -1.0, 2.0  # over-confident above logit -1 only
DAYS = 6


def mu(t: float) -> float:
    h = ((t - T0) % DAY) / HOUR
    return float(-2.0 + 1.5 * np.cos(2 * np.pi * (h - 15) / 24))


def cycle(miscalibrated: bool):
    def draw(t: float, seg: int, n: int, rng: np.random.Generator):
        z = rng.normal(mu(t), 1.0, n)
        reported = np.where(z > KNEE, KNEE + SLOPE * (z - KNEE), z) if miscalibrated else z
        return reported, expit(z)

    return draw


@dataclass(frozen=True)
class Outcome:
    events: list
    served: float  # true ECE averaged over the hours of the last 3 days
    raw: float
    oracle: float  # the one-day fit's, same hours


@cache
def outcome(miscalibrated: bool, method: str, oracle_method: str, seed: int = 0) -> Outcome:
    sim = Simulation(sim_config(min_samples=2000, method=method), cycle(miscalibrated), 1,
                     24_000, seed, delay=uniform_delay(1800, 5400), shares=np.ones(1),
                     record=True)
    events: list = []
    served: list[tuple[float, float]] = []
    while sim.t < T0 + DAYS * DAY - 1:
        sim.run(HOUR / DAY, lambda s, new: events.extend(new))
        if sim.t > T0 + (DAYS - 3) * DAY:
            live = sim.policy.live("m", ALL)
            scores, truth = sim.fresh(sim.t - HOUR / 2, 0, 10_000, seed=int(sim.t) % 1000)
            served.append((sim.t, true_ece(None if live is None else live.calibrator,
                                           scores, truth)))
    d = sim.drawn()
    day = d["ts"] < T0 + DAY
    cal = fit_one(oracle_method, d["score"][day], d["label"][day], "logit", 15, None)
    raw, oracle = [], []
    for t, _ in served:
        scores, truth = sim.fresh(t - HOUR / 2, 0, 10_000, seed=int(t) % 1000)
        raw.append(true_ece(None, scores, truth))
        oracle.append(true_ece(cal, scores, truth))
    return Outcome(events, float(np.mean([v for _, v in served])), float(np.mean(raw)),
                   float(np.mean(oracle)))


def _line(o: Outcome) -> str:
    return " ".join(f"{e.kind}@{(e.ts - T0) / HOUR:.1f}h({e.fields.get('trigger')})"
                    for e in o.events)


def test_a_calibrated_model_with_a_daily_covariate_cycle_is_left_alone() -> None:
    o = outcome(False, "temperature", "temperature")
    print(f"\ncalibrated cycle: {_line(o) or 'no events'}; served {o.served:.4f}")
    assert o.events == []


@pytest.mark.parametrize("method, oracle_method", [
    pytest.param("temperature", "temperature", marks=pytest.mark.slow),  # 12 refits
    ("auto", "isotonic")])
def test_a_daily_cycle_outside_platt_does_not_churn(method: str, oracle_method: str) -> None:
    o = outcome(True, method, oracle_method)
    pubs = [e for e in o.events if e.kind == "published"]
    last = [e for e in pubs if e.ts > T0 + (DAYS - 3) * DAY]
    print(f"\n{method}: {len(pubs)} publishes, {len(last)} in the last 3 days; served "
          f"{o.served:.4f}, raw {o.raw:.4f}, one-day {oracle_method} fit {o.oracle:.4f}\n"
          f"{_line(o)}")
    assert len(pubs) <= 4 and len(last) <= 1
    assert o.served <= max(1.5 * o.oracle, o.oracle + 0.01)
    assert o.served < o.raw


def _replay(tmp: Path, hours: float, miscalibrated: bool, method: str, seed: int = 5
            ) -> tuple[list, float, float, float, float]:
    """The scenario's records to ``hours`` through ``replay --recalibrate``: (events,
    estimated accuracy and positive rate of the pending predictions, their expected
    accuracy and positive rate from the true probabilities)."""
    rng = np.random.default_rng(seed)
    n = int(rng.poisson(1000 * hours))
    ts = np.sort(T0 + rng.uniform(0, hours * HOUR, n))
    z = rng.normal([mu(t) for t in ts.tolist()], 1.0)
    score = np.where(z > KNEE, KNEE + SLOPE * (z - KNEE), z) if miscalibrated else z
    true = expit(z)
    y = (rng.random(n) < true).astype(int)
    arrival = ts + rng.uniform(1800, 5400, n)
    (tmp / "p.jsonl").write_text("".join(
        f'{{"id":"r{i}","model":"m","ts":{ts[i]:.3f},"logit":{score[i]:.6f}}}\n'
        for i in range(n)))
    (tmp / "l.jsonl").write_text("".join(  # the files end with the last prediction
        f'{{"id":"r{i}","label":{y[i]},"ts":{arrival[i]:.3f}}}\n'
        for i in np.argsort(arrival).tolist() if arrival[i] <= ts[-1]))
    cfg = config_mod.from_dict({"metrics": {"windows": ["1h", "24h"]},
                                "segments": {"slices": []},
                                "recalibration": {"window": "24h", "method": method,
                                                  "output_dir": str(tmp / "cal")}})
    bt = replay_recalibrate(cfg, tmp / "p.jsonl", tmp / "l.jsonl")
    pending = arrival > ts[-1]
    est = next(r.estimates for r in bt.view.rows if r.model == "m" and r.window == "24h")
    assert est.pending_samples == int(pending.sum())
    acc = float(np.where(score[pending] >= 0, true[pending], 1 - true[pending]).mean())
    return (bt.events, float(est.estimated_accuracy), float(est.estimated_positive_rate),
            acc, float(true[pending].mean()))


@pytest.mark.parametrize("hour", [3, 15])
def test_the_estimates_of_a_calibrated_cycle_hold_at_night_and_in_the_afternoon(
        tmp_path: Path, hour: int) -> None:
    events, est_acc, est_pos, acc, pos = _replay(tmp_path, 48 + hour, False, "temperature")
    print(f"\n{hour:02d}:00: estimated accuracy {est_acc:.4f} vs {acc:.4f}, positive rate "
          f"{est_pos:.4f} vs {pos:.4f}")
    assert events == []
    assert abs(est_acc - acc) <= 0.02 and abs(est_pos - pos) <= 0.02


@pytest.mark.slow  # 6 days of records through the engine: 30-60 s
@pytest.mark.parametrize("method", ["temperature", "auto"])
def test_the_estimates_after_a_cycle_s_refits_hold(tmp_path: Path, method: str) -> None:
    """End to end through replay (the engine's held refits included): the same churn
    bars, and the estimates through the calibrator live at the end."""
    events, est_acc, est_pos, acc, pos = _replay(tmp_path, DAYS * 24, True, method)
    pubs = [e for e in events if e.kind == "published"]
    print(f"\n{method}: {len(pubs)} publishes; estimated accuracy {est_acc:.4f} vs "
          f"{acc:.4f}, positive rate {est_pos:.4f} vs {pos:.4f}")
    assert len(pubs) <= 4 and len([e for e in pubs if e.ts > T0 + (DAYS - 3) * DAY]) <= 1
    assert abs(est_acc - acc) <= 0.03 and abs(est_pos - pos) <= 0.03
