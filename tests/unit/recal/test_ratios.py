"""A model's __all__ detector reads the log-likelihood ratios its segments computed in
the same check (calmon.recal.ratios): bit for bit what computing them gives, and the
grid weights' table (calmon.recal.detect._weights) the floats of computing them."""

from __future__ import annotations

import math

import numpy as np

from calmon.recal.detect import Detector, _log_weights_at, _weights, log_lr
from calmon.recal.ratios import FEW, SharedRatios


def _pairs(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    p = rng.random(n)
    p[rng.random(n) < 0.1] = 0.0  # the capped cases: p = 0 or 1 with either label
    p[rng.random(n) < 0.1] = 1.0
    return p, (rng.random(n) < 0.5).astype(np.float64)


def test_the_model_s_ratios_are_bitwise_those_computed_from_its_pairs() -> None:
    rng = np.random.default_rng(4)
    for _ in range(50):
        share = SharedRatios()
        parts = [_pairs(rng, int(rng.integers(1, 40))) for _ in range(int(rng.integers(1, 5)))]
        for p, y in parts:  # the segments first, as a check orders them
            assert share.of(p, y, None, whole=False).tobytes() == log_lr(p, y).tobytes()
        p = np.concatenate([q for q, _ in parts])
        y = np.concatenate([v for _, v in parts])
        extra = _pairs(rng, int(rng.integers(0, 10)))  # samples no segment had this check
        p, y = np.concatenate((p, extra[0])), np.concatenate((y, extra[1]))
        flip = rng.random(len(y)) < 0.05  # the same p with the other label is another pair
        y[flip] = 1.0 - y[flip]
        order = rng.permutation(len(p))
        got = share.of(p[order], y[order], None, whole=True)
        assert got.shape == (len(log_lr(p[:1], y[:1])), len(p))
        assert got.tobytes() == log_lr(p[order], y[order]).tobytes()


def test_a_negative_p_is_not_read_as_the_positive_one() -> None:
    """The look-up key drops p's sign bit: a p with it set (no calibrator gives one, but
    a ratio must never be another pair's) is computed, not looked up."""
    share = SharedRatios()
    p, y = np.full(FEW, 0.3), np.zeros(FEW)
    share.of(p, y, None, whole=False)
    q = -p
    assert share.of(q, y, None, whole=True).tobytes() == log_lr(q, y).tobytes()
    assert not np.array_equal(log_lr(q, y), log_lr(p, y))


def test_a_detector_fed_shared_ratios_is_the_same_detector() -> None:
    rng = np.random.default_rng(7)
    a, b = Detector.new(None, 300.0), Detector.new(None, 300.0)
    for c in range(400):
        p, y = _pairs(rng, int(rng.integers(1, 60)))
        ts = 1.7e9 + 300.0 * (c + rng.random(len(p)))
        a.update(p, y, math.log(1e4), ts=ts, now=1.7e9 + 300.0 * (c + 1))
        b.update(p, y, math.log(1e4), ts=ts, now=1.7e9 + 300.0 * (c + 1), ll=log_lr(p, y))
    sa, sb = a.snapshot(), b.snapshot()
    assert a.log_m == b.log_m and a.change_ts() == b.change_ts()
    for key in sa:
        assert np.asarray(sa[key]).tobytes() == np.asarray(sb[key]).tobytes(), key


def test_the_weights_table_gives_the_computed_floats() -> None:
    for lo, hi in [(0, 1), (5, 9), (4000, 4100), (100_000, 100_003), (262_140, 262_150)]:
        lw, w = _weights(lo, hi)
        ref = _log_weights_at(np.arange(lo, hi, dtype=np.int64))
        assert lw.tobytes() == ref.tobytes()
        assert w == float(np.exp(ref).sum())
