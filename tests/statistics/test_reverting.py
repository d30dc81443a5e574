"""A drift that reverts (issue 34): the model turns 2.5x over-confident for 2 hours
after a calibrated day, then the upstream fix lands and it is calibrated again. True
logit z ~ N(-2, 1.2). Three streams: 3,000 or 1,000 predictions an hour with labels
20-40 minutes late, and 3,000 an hour with labels 1.5-2.5 hours late. Default policy.

A calibrator fitted on the drift is wrong once it has ended (true ECE 0.14-0.16 on the
regime in force): publishing it after the revert doubles the error of doing nothing.
The unlabelled predictions made since the revert already show it (their score spread
is back to the old one against the fit's reference histogram): the refit is held, then
refitted on the newest regime once their labels come (without the hold, the two slower
streams published a calibrator 0.16 off the regime in force 0.5-0.75 h after the
revert, with 500-2,250 of its predictions made, and undid it an hour later).

- at most 2 publishes after the change and none in the last 12 hours;
- a wrong calibrator (true ECE > 0.02 on the regime in force) is undone within 1.5 h of
  the first post-revert labels;
- served true ECE <= 0.01 at the end;
- no publish of a calibrator wrong for the regime in force while 200 or more labelled
  samples of that regime are in hand, nor (held) while 300 of its predictions exist.
The day's time-averaged served true ECE is printed against the raw model's.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import numpy as np
import pytest

from tests.statistics.sim import DAY, T0, Simulation, sim_config, true_ece, uniform_delay

ALL = "__all__"
HOUR = 3600.0
CHANGE = T0 + DAY
REVERT = CHANGE + 2 * HOUR
STREAMS = {"3000/h, labels 20-40 min": (3000, 20 * 60, 40 * 60),
           "1000/h, labels 20-40 min": (1000, 20 * 60, 40 * 60),
           "3000/h, labels 1.5-2.5 h": (3000, 1.5 * HOUR, 2.5 * HOUR)}


def reverting(t: float, seg: int, n: int, rng: np.random.Generator):
    z = rng.normal(-2.0, 1.2, n)
    return (2.5 * z if CHANGE <= t < REVERT else z), 1.0 / (1.0 + np.exp(-z))


def regime_at(t: float) -> float:
    """A time inside the regime in force at t (for fresh samples of it)."""
    return CHANGE if CHANGE <= t < REVERT else t


@dataclass(frozen=True)
class Outcome:
    events: list
    times: list[float]
    served: list[float]  # true ECE on the regime in force, every 10 minutes
    raw: list[float]
    # per publish: (ts, true ECE on the regime in force, labelled samples of that regime,
    # predictions of that regime made so far, labelled or not)
    publishes: list[tuple[float, float, int, int]]
    wrong_h: float  # longest stretch a wrong calibrator stayed live past the first
    # post-revert labels (hours)


@cache
def outcome(name: str, seed: int = 0) -> Outcome:
    per_hour, lo, hi = STREAMS[name]
    sim = Simulation(sim_config(min_samples=2000), reverting, 1, per_hour * 24, seed,
                     delay=uniform_delay(lo, hi), shares=np.ones(1), record=True)
    pubs: list[tuple[float, float, int, int]] = []
    events: list = []

    def at_check(s: Simulation, new: list) -> None:
        events.extend(new)
        for e in new:
            if e.kind != "published":
                continue
            live = s.policy.live("m", ALL)
            assert live is not None
            scores, truth = s.fresh(regime_at(e.ts), 0, 30_000, seed=int(e.ts) % 1000)
            d = s.drawn()
            start = CHANGE if CHANGE <= e.ts < REVERT else (REVERT if e.ts >= REVERT else T0)
            n = int(((d["ts"] >= start) & (d["arrival"] < e.ts)).sum())
            made = int(((d["ts"] >= start) & (d["ts"] < e.ts)).sum())
            pubs.append((e.ts, true_ece(live.calibrator, scores, truth), n, made))

    times, served, raw, wrong = [], [], [], []
    end = sim.t + 2 * DAY
    while sim.t < end - 1:
        sim.run(600 / DAY, at_check)
        live = sim.policy.live("m", ALL)
        scores, truth = sim.fresh(regime_at(sim.t), 0, 20_000, seed=int(sim.t) % 1000)
        times.append(sim.t)
        served.append(true_ece(None if live is None else live.calibrator, scores, truth))
        raw.append(true_ece(None, scores, truth))
        wrong.append(live is not None and served[-1] > 0.02 and sim.t > REVERT + lo)
    longest = run = 0
    for w in wrong:
        run = run + 1 if w else 0
        longest = max(longest, run)
    return Outcome(events, times, served, raw, pubs, longest * 600 / HOUR)


@pytest.mark.parametrize("name", list(STREAMS))
def test_a_drift_that_reverts_does_no_harm(name: str) -> None:
    o = outcome(name)
    t = np.array(o.times)
    day = (t > CHANGE) & (t <= CHANGE + DAY)
    served_day, raw_day = float(np.mean(np.array(o.served)[day])), float(
        np.mean(np.array(o.raw)[day]))
    pubs = ", ".join(f"{(p[0] - CHANGE) / HOUR:+.2f} h (true ECE {p[1]:.3f}, {p[2]} samples)"
                     for p in o.publishes) or "none"
    print(f"\n{name}: publishes at {pubs}; a wrong calibrator live for {o.wrong_h:.2f} h "
          f"at most; time-averaged true ECE over the day: served {served_day:.4f} vs raw "
          f"{raw_day:.4f}; at the end {o.served[-1]:.4f}")
    after = [p for p in o.publishes if p[0] >= CHANGE]
    assert len(after) <= 2
    assert all(p[0] < t[-1] - 12 * HOUR for p in after)
    assert o.wrong_h <= 1.5
    assert o.served[-1] <= 0.01
    for ts, wrong, n, _made in o.publishes:
        assert wrong <= 0.02 or n < 200, (ts - CHANGE, wrong, n)


@pytest.mark.parametrize("name", list(STREAMS))
def test_a_refit_of_a_regime_that_ended_is_held(name: str) -> None:
    """Contract section 6, v4 "Held, not published": once 300 predictions of the regime
    in force have been made (labelled or not), no calibrator wrong for it (true ECE >
    0.02) is published; a ``held`` event says why (PSI over 0.1) and the series is
    refitted on the newest regime."""
    o = outcome(name)
    held = [e for e in o.events if e.kind == "held"]
    print(f"\n{name}: " + " ".join(
        f"{e.kind}@{(e.ts - CHANGE) / HOUR:+.2f}h" + (f"(psi {e.fields['psi']:.2f})"
                                                    if e.kind == "held" else "")
        for e in o.events))
    for ts, wrong, _n, made in o.publishes:
        assert wrong <= 0.02 or made < 300, (ts - CHANGE, wrong, made)
    for e in held:
        assert e.fields["psi"] > e.fields["threshold"] >= 0.1
        assert e.fields["newer_samples"] >= 300 and e.fields["fit_samples"] > 0
        later = [x for x in o.events if x.ts > e.ts and x.kind in ("published", "rejected")]
        assert later, "a held refit is refitted on the newest regime"
