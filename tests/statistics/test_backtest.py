"""Backtests of the recalibration policy on streams with a known truth (acceptance (a)-(d)
of issue 10). The policy is the daemon's (calmon.recal.policy), fed through the engine's
sample rings every 5 minutes of event time; true ECEs come from the true probabilities
on fresh samples (tests/statistics/sim.py), never from calmon's own metrics.

The numbers these tests measure are quoted in the README ("How alarms and refits are
decided"); the printed lines (pytest -s) are where they come from.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from calmon.engine.buffer import SampleSet
from calmon.recal.refit import refit
from tests.statistics.sim import (
    DAY,
    T0,
    Simulation,
    binary,
    draw_labels,
    multiclass,
    sim_config,
    true_ece,
)

ALL = "__all__"


@pytest.mark.slow
def test_a_calibrated_model_with_20_segments_raises_no_alarm_in_a_week() -> None:
    """(a) 20 segments at a 3% base rate, 5k samples a day each, per-segment detection,
    a simulated week of 5-minute checks (2016 checks x 21 series): no alarm. The bound is
    alpha = 0.01 for all series together; the largest evidence any series reached is
    printed (and must stay far below the threshold 1)."""
    cfg = sim_config(per_segment=True)
    sim = Simulation(cfg, binary(mu=-3.8, sd=1.0), segments=20, per_day=5000, seed=2,
                     readers=True)
    run = sim.run(7)
    assert run.events == []
    worst = max(run.max_evidence.values())
    print(f"\n(a) week, 21 series: 0 alarms, largest evidence {worst:.4f} of 1")
    assert worst < 0.2
    assert len(run.max_evidence) == 21


def test_a_the_detector_false_alarm_rate_is_at_most_alpha() -> None:
    """(a) The bound itself, measured where it can be seen: alpha = 0.2, one series,
    300 independent calibrated streams of 3,000 samples at a 5% base rate, checked in
    batches of 60, each batch predicted in its own slot of time (as the policy feeds it,
    by prediction time). Ville's inequality says at most 20% of them may ever alarm."""
    from calmon.recal.detect import Detector

    rng = np.random.default_rng(5)
    alarms = 0
    runs = 300
    for _ in range(runs):
        d = Detector.new()
        for b in range(50):
            z = rng.normal(-3.0, 1.0, 60)
            p = 1 / (1 + np.exp(-z))
            d.update(p, (rng.random(60) < p).astype(float), math.log(1 / 0.2),
                     ts=np.full(60, float(b)))
        alarms += d.alarmed
    rate = alarms / runs
    print(f"\n(a) detector alone at alpha 0.2: {alarms}/{runs} streams alarmed")
    assert rate <= 0.2


CHANGES = {
    "binary sharpened 2.5x": (binary(mu=-2.0, sd=1.2, change_at=T0 + DAY, scale=2.5), 1),
    "binary softened 0.5x": (binary(mu=-2.0, sd=1.2, change_at=T0 + DAY, scale=0.5), 1),
    "multiclass sharpened 2.5x": (multiclass(k=4, sd=1.5, change_at=T0 + DAY, scale=2.5), 4),
    "multiclass softened 0.5x": (multiclass(k=4, sd=1.5, change_at=T0 + DAY, scale=0.5), 4),
}


@pytest.mark.parametrize("name", list(CHANGES))
def test_b_a_change_is_caught_fast_and_fixed(name: str) -> None:
    """(b) One day calibrated, then the change; 5k samples a day; min_samples 1000. The
    alarm comes within a few hundred post-change samples, its change time is close to
    the truth, the refit is published within hours, and the live calibrator's TRUE ECE
    is a small fraction of the raw one."""
    scenario, _ = CHANGES[name]
    cfg = sim_config()
    sim = Simulation(cfg, scenario, segments=1, per_day=5000, seed=11)
    run = sim.run(2.5)
    drifts, pubs = run.of("drift"), run.of("published")
    assert len(drifts) >= 1 and len(pubs) >= 1, run.events
    change = T0 + DAY
    per_second = 5000 / DAY
    delay_samples = (drifts[0].ts - change) * per_second
    published_after_h = (pubs[0].ts - change) / 3600
    est_error_min = abs(drifts[0].fields["change_ts"] - change) / 60
    scores, truth = sim.fresh(change + DAY, 0, 100_000)
    raw = true_ece(None, scores, truth)
    live = sim.policy.live("m", ALL)
    assert live is not None
    fixed = true_ece(live.calibrator, scores, truth)
    print(f"\n(b) {name}: alarm after {delay_samples:.0f} samples, change time off by "
          f"{est_error_min:.0f} min, published after {published_after_h:.1f} h, "
          f"true ECE {raw:.3f} -> {fixed:.4f} (v{live.version})")
    assert delay_samples <= 600
    assert est_error_min <= 120
    assert published_after_h <= 12
    assert raw >= 0.05
    assert fixed <= 0.2 * raw and fixed <= 0.03
    assert run.of("failed") == []


def test_c_a_prior_shift_in_one_segment_is_fixed_there_only() -> None:
    """(c) Five countries (20% of traffic each), per-segment recalibration with the
    default method; after a day the base rate of country c2 shifts by +1.5 logits. c2
    gets its own calibrator and its true ECE drops; the other four keep serving exactly
    what they had (their true ECE does not move)."""
    cfg = sim_config(per_segment=True)
    sim = Simulation(cfg, binary(mu=-3.0, change_at=T0 + DAY, shift=1.5, shift_segment=2),
                     segments=5, per_day=5000, seed=3)
    run = sim.run(3)
    assert [e.segment for e in run.of("published")] == ["country=c2"], run.events
    for seg in range(5):
        name = f"country=c{seg}"
        scores, truth = sim.fresh(T0 + 4 * DAY, seg, 100_000)
        live = sim.policy.live("m", name)
        before, after = true_ece(None, scores, truth), true_ece(
            None if live is None else live.calibrator, scores, truth)
        print(f"\n(c) {name}: true ECE raw {before:.4f}, served {after:.4f}")
        if seg == 2:
            assert live is not None and live.doc["segment"] == name
            assert before > 0.1 and after < 0.25 * before
        else:
            assert live is None and after == before  # nothing changed for them


def test_d_forced_refits_on_a_calibrated_model_are_published_at_most_at_rate_alpha() -> None:
    """(d) 400 refits forced on calibrated samples (2,000 each, binary 5% base rate,
    default method) at alpha = 0.05: the gate publishes at most alpha of them (with a
    binomial allowance of 2 standard deviations); auto at the same alpha likewise."""
    rng = np.random.default_rng(21)
    alpha, n, runs = 0.05, 2000, 400
    counts = {"temperature": 0, "auto": 0}
    for i in range(runs):
        z = rng.normal(-3.0, 1.2, n)
        y = draw_labels(1 / (1 + np.exp(-z)), rng)
        s = SampleSet(T0 + np.arange(n, dtype=float), y, np.ones(n, np.int8), z)
        method = "auto" if i % 2 else "temperature"
        r = refit(s, method, None, 0.3, 15, alpha)
        counts[method] += r.outcome == "published"
    half = runs // 2
    allowance = alpha + 2 * math.sqrt(alpha * (1 - alpha) / half)
    print(f"\n(d) forced refits published: temperature {counts['temperature']}/{half}, "
          f"auto {counts['auto']}/{half} (alpha {alpha})")
    assert counts["temperature"] / half <= allowance
    assert counts["auto"] / half <= allowance
