"""With few positives a refit starts from the late end of the change time's confidence
set (issue 34), not from the point estimate: the set and the refit's start, checked
against brute-force computations."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.special import expit, logit

from calmon.recal.detect import Detector, fit_start, log_lr

SPACING = 10.0
CHANGE = 600.0  # of 1,200 s


def test_the_change_time_set_is_every_point_within_3_nats_of_the_best() -> None:
    """1% positives whose odds double at 600 s: the set is the grid points whose CUSUM
    profile (the best alternative's log-LR of the samples predicted since) is within 3
    nats of its maximum, recomputed here from every sample; it holds the change, and
    its late end lies after the point estimate."""
    rng = np.random.default_rng(5)
    d = Detector.new(spacing=SPACING)
    ps, ys, ts = [], [], []
    for b in range(120):
        t = b * SPACING + rng.random(400) * SPACING
        p = expit(rng.normal(-4.6, 1.0, 400))
        truth = expit(logit(p) + (math.log(2.0) if b * SPACING >= CHANGE else 0.0))
        y = (rng.random(400) < truth).astype(float)
        d.update(p, y, 1e6, ts=t)  # a threshold never reached: the set is read anyway
        ps.append(p), ys.append(y), ts.append(t)
    p, y, t = (np.concatenate(x) for x in (ps, ys, ts))
    ll = log_lr(p, y)
    cols = d.cols[:d.ncols]
    assert cols.tolist() == list(range(d.opened))  # none thinned
    taus = d.origin + SPACING * cols
    profile = np.array([ll[:, t >= tau].sum(axis=1).max() for tau in taus])
    inside = taus[profile >= profile.max() - 3.0]
    span = d.change_set()
    assert span is not None
    assert span[0] == pytest.approx(inside[0]) and span[1] == pytest.approx(inside[-1])
    assert span[0] <= CHANGE <= span[1]
    est = d.change_ts()
    assert est is not None and span[0] <= est <= span[1]
    assert est < span[1], (est, span)  # the late end: later than the estimate


def test_a_refit_starts_as_late_in_the_set_as_leaves_min_samples() -> None:
    """fit_start(ts, estimate, late, need) selects the samples from the latest time in
    [estimate, late] that still leaves ``need`` of them (from ``estimate`` when even it
    leaves fewer): brute force over every candidate start on random cases."""
    rng = np.random.default_rng(11)
    moved = 0
    for _ in range(500):
        ts = rng.uniform(0.0, 1000.0, int(rng.integers(0, 300)))
        est = float(rng.uniform(0.0, 1000.0))
        late = est + float(rng.uniform(-100.0, 500.0))
        need = int(rng.integers(1, 300))
        got = fit_start(ts, est, late, need)
        cands = [est, *ts[(ts >= est) & (ts <= late)].tolist(), *([late] if late > est else [])]
        ok = [c for c in cands if int((ts >= c).sum()) >= need]
        want = max(ok) if ok else est
        np.testing.assert_array_equal(ts >= got, ts >= want)
        moved += bool(((ts >= est) & (ts < got)).any())
    assert moved > 50  # not vacuous: many cases start after the point estimate
