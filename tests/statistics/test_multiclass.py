"""Multiclass calibration beyond the top label (issue 24, contract section 6 v3), driven
through the daemon's policy on simulated event time (tests/statistics/sim.py): 5 classes,
12,000 predictions a day, a check every 5 minutes, a calibrated day before the change.
True ECEs (top-label and classwise) come from the true class probabilities on fresh
samples, computed in sim.py with plain numpy, never from calmon's metrics.

The numbers are quoted in the README ("Multiclass models"); the printed lines (pytest
-s) are where they come from.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.special import softmax

from calmon.engine.buffer import SampleSet
from calmon.recal.detect import Detector, tilt_log_lr
from calmon.recal.refit import refit
from tests.statistics.sim import (
    DAY,
    T0,
    Simulation,
    draw_labels,
    prior_shift,
    sim_config,
    true_classwise_ece,
    true_ece,
)

ALL = "__all__"
K, PER_DAY, CHANGE = 5, 12_000, T0 + DAY
HOURS_8 = 8 * 3600


def _served(sim: Simulation, t: float) -> tuple[float, float, float, float]:
    """(raw top-label, raw classwise, served top-label, served classwise) true ECEs on
    100,000 fresh samples of the scenario at time t."""
    scores, truth = sim.fresh(t, 0, 100_000)
    live = sim.policy.live("m", ALL)
    cal = None if live is None else live.calibrator
    return (true_ece(None, scores, truth), true_classwise_ece(None, scores, truth),
            true_ece(cal, scores, truth), true_classwise_ece(cal, scores, truth))


def _line(e) -> str:
    return f"{e.kind}@{(e.ts - CHANGE) / 3600:+.2f}h({e.fields.get('trigger')})"


def test_the_prior_shift_scenario_has_the_issues_numbers() -> None:
    """+2.0 on one class's true logit, the model's logits unchanged: the top-label ECE
    is over the default ece_above (0.05) and the classwise ECE is larger still."""
    scores, truth = prior_shift(K, change_at=0.0, shift=2.0, cls=1)(
        1.0, 0, 200_000, np.random.default_rng(0))
    top, cw = true_ece(None, scores, truth), true_classwise_ece(None, scores, truth)
    assert 0.06 <= top <= 0.09 and cw >= 0.1


@pytest.mark.parametrize("method", ["temperature", "auto"])
@pytest.mark.parametrize("seed", [1, 2])
def test_a_class_prior_shift_is_flagged_and_corrected_classwise(method: str,
                                                                seed: int) -> None:
    """A calibrated day, then +2.0 on class 1's true logit. No alarm before the change;
    a drift within 8 h; what is served a day later has at most 0.6x the raw model's
    true classwise ECE, and a top-label ECE no worse than raw. ``temperature`` is the
    default method."""
    cfg = sim_config(method=method)
    sim = Simulation(cfg, prior_shift(K, change_at=CHANGE, shift=2.0, cls=1),
                     segments=1, per_day=PER_DAY, seed=seed)
    run = sim.run(2.0)
    assert [e for e in run.events if e.ts < CHANGE] == []
    drifts, pubs = run.of("drift"), run.of("published")
    assert drifts and drifts[0].ts - CHANGE <= HOURS_8, run.events
    assert pubs and pubs[0].ts - CHANGE <= HOURS_8, run.events
    raw_top, raw_cw, top, cw = _served(sim, CHANGE + DAY)
    print(f"\n+2.0 prior shift, {method}, seed {seed}: {' '.join(map(_line, run.events))}; "
          f"true top-label ECE {raw_top:.4f} -> {top:.4f}, classwise {raw_cw:.4f} -> {cw:.4f}")
    assert cw <= 0.6 * raw_cw
    assert top <= raw_top


@pytest.mark.parametrize("seed", [1, 2])
def test_a_smaller_shift_is_flagged_through_the_classwise_trigger(seed: int) -> None:
    """+1.5: the true top-label ECE (~0.04) is under ece_above's 0.05, the classwise one
    (~0.08) is not. With metrics.classwise and classwise_ece_above: 0.05 as the only
    effect-size trigger, the drift event names it, within 8 h, and the refit fixes the
    classwise ECE (config.py refuses classwise_ece_above without metrics.classwise)."""
    triggers = {"ece_above": None, "ece_increase": None, "observed_over_expected": None,
                "classwise_ece_above": 0.05}
    scenario = prior_shift(K, change_at=CHANGE, shift=1.5, cls=3)
    sim = Simulation(sim_config(classwise=True, triggers=triggers), scenario, 1, PER_DAY,
                     seed)
    run = sim.run(2.0)
    assert [e for e in run.events if e.ts < CHANGE] == []
    drifts = run.of("drift")
    assert drifts and drifts[0].fields["trigger"] == "classwise_ece_above", run.events
    assert drifts[0].ts - CHANGE <= HOURS_8
    raw_top, raw_cw, top, cw = _served(sim, CHANGE + DAY)
    print(f"\n+1.5 prior shift, classwise trigger, seed {seed}: "
          f"{' '.join(map(_line, run.events))}; true top-label ECE {raw_top:.4f} -> "
          f"{top:.4f}, classwise {raw_cw:.4f} -> {cw:.4f}")
    assert raw_top < 0.05 < raw_cw
    assert cw <= 0.6 * raw_cw


def test_a_prior_shift_in_one_segment_is_corrected_there_only() -> None:
    """per_segment with four countries (6,000 predictions a day each): +2.0 on class 2's
    true logit in country c1 only. c1 gets its own calibrator with class biases; the
    other countries keep serving the raw model (nothing published for them)."""

    def scenario(t: float, seg: int, n: int, rng: np.random.Generator):
        z = rng.normal(0.0, 1.5, (n, K))
        shift = 2.0 * np.eye(K)[2] if t >= CHANGE and seg == 1 else np.zeros(K)
        return z, softmax(z + shift, axis=1)

    sim = Simulation(sim_config(per_segment=True), scenario, 4, 6000, seed=3)
    run = sim.run(2.5)
    assert {e.segment for e in run.events} == {"country=c1"}, run.events
    assert run.of("published") and run.of("published")[0].ts - CHANGE <= HOURS_8
    for seg in range(4):
        scores, truth = sim.fresh(CHANGE + DAY, seg, 50_000)
        live = sim.policy.live("m", f"country=c{seg}")
        raw = true_classwise_ece(None, scores, truth)
        if seg == 1:
            assert live is not None and live.doc["segment"] == "country=c1"
            served = true_classwise_ece(live.calibrator, scores, truth)
            print(f"\nsegment prior shift: c1 true classwise ECE {raw:.4f} -> {served:.4f}")
            assert served <= 0.25 * raw
        else:
            assert live is None


@pytest.mark.parametrize("method", ["isotonic", "histogram", "auto"])
def test_an_under_confident_multiclass_model_is_fixed_by_every_method(method: str) -> None:
    """A calibrated day, then the model reports logits x 0.5 (true top-label ECE ~0.17):
    in at least 2 of 3 seeds a publish within 8 h and a served true top-label ECE of at
    most 0.03 a day after the change."""
    good = []
    for seed in (1, 2, 3):
        sim = Simulation(sim_config(method=method),
                         prior_shift(K, change_at=CHANGE, shift=0.0, scale=0.5),
                         1, PER_DAY, seed)
        run = sim.run(2.0)
        pubs = run.of("published")
        raw_top, _, top, _ = _served(sim, CHANGE + DAY)
        print(f"\nlogits x 0.5, {method}, seed {seed}: {' '.join(map(_line, run.events))}; "
              f"true top-label ECE {raw_top:.4f} -> {top:.4f}")
        assert [e for e in run.events if e.ts < CHANGE] == []
        good.append(bool(pubs) and pubs[0].ts - CHANGE <= HOURS_8 and top <= 0.03)
    assert sum(good) >= 2, good


@pytest.mark.parametrize("method", ["temperature", "platt", "isotonic", "histogram", "auto"])
def test_forced_refits_of_a_calibrated_5_class_model_are_published_at_most_at_rate_alpha(
        method: str) -> None:
    """Refits forced on calibrated 5-class samples (1,000 each) at alpha = 0.05: every
    method publishes at most alpha of them (binomial allowance of 2 standard deviations)."""
    rng = np.random.default_rng(31)
    alpha, n, runs = 0.05, 1000, 120
    published = 0
    for _ in range(runs):
        z = rng.normal(0.0, 1.5, (n, K))
        y = draw_labels(softmax(z, axis=1), rng)
        s = SampleSet(T0 + np.arange(n, dtype=float), y, np.full(n, 3, np.int8), z)
        published += refit(s, method, None, 0.3, 15, alpha).outcome == "published"
    print(f"\nforced refits of a calibrated 5-class model, {method}: {published}/{runs} "
          f"published (alpha {alpha})")
    assert published / runs <= alpha + 2 * math.sqrt(alpha * (1 - alpha) / runs)


def test_tilts_keep_the_false_alarm_bound_and_find_a_prior_shift_sooner() -> None:
    """The detector with one-class tilts on calibrated 5-class streams at alpha = 0.2
    (2,000 samples each) alarms on at most 20% of them (Ville); on a +1.5 prior shift it
    alarms after fewer samples than the top-label alternatives alone (same streams)."""
    rng = np.random.default_rng(7)
    thr = math.log(1 / 0.2)
    alarms = 0
    runs = 150
    for _ in range(runs):
        d = Detector.new()
        for _ in range(40):
            z = rng.normal(0.0, 1.5, (50, K))
            p = softmax(z, axis=1)
            y = draw_labels(p, rng)
            d.update(p.max(axis=1), (p.argmax(axis=1) == y).astype(float), thr,
                     tilt_log_lr(p, y))
        alarms += d.alarmed
    assert alarms / runs <= 0.2
    delays = {"tilts": [], "top-label only": []}
    for seed in range(12):
        r = np.random.default_rng(100 + seed)
        z = r.normal(0.0, 1.5, (2000, K))
        p = softmax(z, axis=1)
        y = draw_labels(softmax(z + 1.5 * np.eye(K)[3], axis=1), r)
        conf, correct = p.max(axis=1), (p.argmax(axis=1) == y).astype(float)
        for name in delays:
            d = Detector.new()
            for i in range(0, 2000, 20):
                sl = slice(i, i + 20)
                d.update(conf[sl], correct[sl], math.log(100),
                         tilt_log_lr(p[sl], y[sl]) if name == "tilts" else None)
                if d.alarmed:
                    break
            delays[name].append(d.alarm_k or 10_000)
    med = {k: float(np.median(v)) for k, v in delays.items()}
    print(f"\ndetector at alpha 0.2: {alarms}/{runs} calibrated streams alarmed; +1.5 "
          f"prior shift at alpha 0.01, median samples to alarm: {med}")
    assert med["tilts"] < 0.7 * med["top-label only"]


def test_replay_recalibrate_corrects_a_prior_shift_end_to_end(tmp_path) -> None:
    """The same scenario through ``replay --recalibrate``'s code path (engine, sample
    rings, policy, registry) from JSONL files, metrics.classwise on: 6,000 predictions a
    day with labels 1-10 minutes late, +2.0 on class 1 after a day. A drift, then a
    published temperature document whose largest bias is class 1's; its true classwise
    ECE on fresh samples is at most 0.6x the raw model's."""
    import json

    from calmon import config as config_mod
    from calmon.calibrators import load
    from calmon.replay import replay_recalibrate

    rng = np.random.default_rng(8)
    n = 12_000
    ts = np.sort(T0 + rng.uniform(0, 2 * DAY, n))
    z = rng.normal(0.0, 1.5, (n, K))
    truth = softmax(z + 2.0 * np.eye(K)[1] * (ts >= CHANGE)[:, None], axis=1)
    y = draw_labels(truth, rng)
    p, lab = tmp_path / "p.jsonl", tmp_path / "l.jsonl"
    p.write_text("".join(json.dumps({"id": f"r{i}", "model": "mc", "ts": float(ts[i]),
                                     "logits": z[i].tolist()}) + "\n" for i in range(n)))
    lab.write_text("".join(json.dumps({"id": f"r{i}", "label": int(y[i]),
                                       "ts": float(ts[i] + rng.uniform(60, 600))}) + "\n"
                           for i in range(n)))
    cfg = config_mod.from_dict({
        "metrics": {"bins": 15, "windows": ["1h", "24h"], "classwise": True},
        "segments": {"slices": []},
        "recalibration": {"interval": "5m", "min_samples": 1000, "window": "24h",
                          "triggers": {"classwise_ece_above": 0.05}}})
    out = tmp_path / "cal"
    bt = replay_recalibrate(cfg, p, lab, out)
    kinds = [e.kind for e in bt.events]
    assert "drift" in kinds and "published" in kinds, bt.events
    assert all(e.ts >= CHANGE for e in bt.events)
    doc = json.loads(next(out.rglob("latest.json")).read_text())
    assert doc["method"] == "temperature" and len(doc["params"]["bias"]) == K
    assert int(np.argmax(doc["params"]["bias"])) == 1
    fresh = np.random.default_rng(9).normal(0.0, 1.5, (100_000, K))
    fresh_truth = softmax(fresh + 2.0 * np.eye(K)[1], axis=1)
    raw_cw = true_classwise_ece(None, fresh, fresh_truth)
    served = true_classwise_ece(load(doc), fresh, fresh_truth)
    events = [(e.kind, e.fields.get("trigger")) for e in bt.events]
    print(f"\nreplay --recalibrate, +2.0 prior shift: {events}; "
          f"true classwise ECE {raw_cw:.4f} -> {served:.4f}")
    assert served <= 0.6 * raw_cw
