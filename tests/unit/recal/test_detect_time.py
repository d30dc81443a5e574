"""The detector indexed by prediction time (issue 23): its products and statistic
checked against a brute-force computation, and late labels of pre-change predictions
do not dilute the evidence."""

from __future__ import annotations

import math

import numpy as np
from scipy.special import expit, logsumexp

from calmon.engine.buffer import SampleSet
from calmon.recal.detect import ALTERNATIVES, Detector, log_lr, log_weights
from calmon.recal.refit import refit


def test_every_grid_point_holds_the_product_over_the_samples_predicted_after_it() -> None:
    rng = np.random.default_rng(3)
    d = Detector.new(spacing=10.0)
    ps, ys, ts = [], [], []
    for b in range(120):  # labels arrive up to 300 s late, in any order
        t = b * 10 + rng.random(40) * 10 - rng.random(40) * 300
        p = expit(rng.normal(-2, 1, 40))
        y = (rng.random(40) < p).astype(float)
        d.update(p, y, 100.0, ts=t)
        ps.append(p), ys.append(y), ts.append(t)
    p, y, t = (np.concatenate(x) for x in (ps, ys, ts))
    keep = t >= d.origin
    ll, t = log_lr(p[keep], y[keep]), t[keep]
    cols = d.cols[:d.ncols]
    assert cols.tolist() == list(range(d.opened))  # under RESOLUTION points: none thinned
    taus = d.origin + 10.0 * cols
    brute = np.stack([ll[:, t >= tau].sum(axis=1) for tau in taus], axis=1)
    np.testing.assert_allclose(d.log_p[:, :d.ncols] + d.off[:, None], brute, atol=1e-8)
    lw = log_weights(0, len(cols))
    mix = logsumexp(lw[None, :] + brute) - math.log(len(ALTERNATIVES))
    assert d.log_frozen == -math.inf  # nothing frozen: M is the mixture plus the unopened weight
    assert math.isclose(d.log_m, float(np.logaddexp(mix, math.log1p(-d.w_open))),
                        abs_tol=1e-9)


def test_thinned_points_keep_m_exact_and_reach_back_to_the_restart() -> None:
    """Past RESOLUTION points the older ones are thinned (a stopped term each): M still
    equals the brute-force mixture of the open products plus the frozen terms plus the
    unopened weight, recomputed here from every sample; point 0 (the restart) stays
    open, and the open points cover every octave of age."""
    from calmon.recal.detect import RESOLUTION

    rng = np.random.default_rng(8)
    d = Detector.new(spacing=1.0)
    ps, ys, ts = [], [], []
    for b in range(3000):
        t = b + rng.random(3)
        p = expit(rng.normal(-1, 1, 3))
        y = (rng.random(3) < p).astype(float)
        d.update(p, y, 100.0, ts=t)
        ps.append(p), ys.append(y), ts.append(t)
    p, y, t = (np.concatenate(x) for x in (ps, ys, ts))
    ll = log_lr(p, y)
    cols = d.cols[:d.ncols]
    assert cols[0] == 0 and d.opened == 3000
    assert d.ncols < 3000 // 2 and (np.diff(cols) > 0).all()
    assert (np.diff(cols)[-RESOLUTION + 1:] == 1).all()  # the newest at full resolution
    brute = np.stack([ll[:, t >= c].sum(axis=1) for c in cols.tolist()], axis=1)
    np.testing.assert_allclose(d.log_p[:, :d.ncols] + d.off[:, None], brute, atol=1e-7)
    ages = d.opened - 1 - cols
    gaps = np.diff(cols)
    assert (gaps <= np.maximum(1, 2 * ages[:-1] / RESOLUTION + 1)).all()  # ~1/64 of age


def test_late_pre_change_labels_do_not_dilute_a_change() -> None:
    """Logits sharpened 2.5x from t = 1000 s; each label 0-3000 s late. Fed in arrival
    order, the alarm comes and the change is dated to the grid point at the change."""
    rng = np.random.default_rng(4)
    n = 6000
    t = np.sort(rng.uniform(0, 2000, n))
    z = rng.normal(-2, 1.2, n)
    reported = np.where(t >= 1000, 2.5 * z, z)
    y = (rng.random(n) < expit(z)).astype(float)
    arrival = t + rng.uniform(0, 3000, n)
    order = np.argsort(arrival)
    d = Detector.new(spacing=50.0)
    for chunk in np.array_split(order, 100):
        d.update(expit(reported[chunk]), y[chunk], math.log(100), ts=t[chunk])
    assert d.alarmed
    assert abs(d.change_ts() - 1000) <= 50


def test_failed_refits_carry_zero_sample_counts_and_a_reason() -> None:
    s = SampleSet(np.arange(30.0), np.zeros(30, np.int64), np.ones(30, np.int8), np.zeros(30))
    r = refit(s, "temperature", None, 0.3, 15)
    assert r.outcome == "failed" and r.reason
    assert (r.fit_samples, r.holdout_samples) == (0, 0)
    assert isinstance(r.fit_samples, int) and isinstance(r.holdout_samples, int)


def test_one_drift_event_per_alarm_however_the_triggers_flap(monkeypatch) -> None:
    """The trigger set flapping under one latched alarm (fired, nothing, fired, ...) makes
    one drift event, not one per flap."""
    import calmon.recal.policy as policy_mod
    from calmon.recal.triggers import Decision
    from tests.statistics.sim import DAY, T0, Simulation, binary, sim_config

    flips = iter(range(10**6))
    monkeypatch.setattr(policy_mod, "decide", lambda cfg, r: Decision(
        0.1, ("ece_above",) if next(flips) % 2 == 0 else (), None))
    sim = Simulation(sim_config(min_samples=10**6, buffer=10**6), binary(
        mu=-2.0, sd=1.2, change_at=T0 + 0.2 * DAY, scale=2.5), segments=1, per_day=8000,
        seed=5)
    run = sim.run(1.0)
    assert sim.policy.states[("m", "__all__")].detector.alarmed
    assert len(run.of("drift")) == 1, run.events
