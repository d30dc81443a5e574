"""The newest regime inside post-change samples (calmon.recal.regime): a second change
since the first is found and only the samples after it are kept; a steady
miscalibration, however strong, keeps them all."""

from __future__ import annotations

import math

import numpy as np
from scipy.special import expit

from calmon.engine.buffer import SampleSet
from calmon.recal.regime import newest

HOUR = 3600.0
T0 = 1_764_460_800.0
THRESHOLD = math.log(1 / 0.01)


def _stream(scales: list[float], per_hour: int, hours: float, seed: int
            ) -> tuple[SampleSet, float]:
    """Regimes of ``hours`` each: the model reports scale * z of a true logit z."""
    rng = np.random.default_rng(seed)
    parts = []
    for i, scale in enumerate(scales):
        n = int(per_hour * hours)
        ts = np.sort(T0 + (i + rng.random(n)) * hours * HOUR)
        z = rng.normal(-2.0, 1.2, n)
        y = (rng.random(n) < expit(z)).astype(np.int64)
        parts.append((ts, y, np.ones(n, np.int8), scale * z))
    ts, y, kind, score = (np.concatenate(c) for c in zip(*parts))
    return SampleSet(ts, y, kind, score), T0 + (len(scales) - 1) * hours * HOUR


def test_a_drift_that_reverted_inside_the_samples_keeps_the_newest_regime() -> None:
    post, boundary = _stream([2.5, 1.0], 1000, 4.0, seed=3)
    kept = newest(post, "temperature", 15, THRESHOLD, 300.0, 2000)
    print(f"\nkept {len(kept)} of {len(post)}, from {(kept.ts.min() - boundary) / HOUR:+.2f} h")
    assert 2000 <= len(kept) < len(post)
    assert boundary <= kept.ts.min() <= boundary + HOUR


def test_one_steady_miscalibration_keeps_every_sample() -> None:
    post, _ = _stream([2.5, 2.5], 1000, 4.0, seed=4)
    assert len(newest(post, "temperature", 15, THRESHOLD, 300.0, 2000)) == len(post)
    assert len(newest(post, "auto", 15, THRESHOLD, 300.0, 2000)) == len(post)


def test_a_newest_regime_shorter_than_min_samples_keeps_every_sample() -> None:
    post, _ = _stream([2.5, 1.0], 1000, 1.5, seed=5)
    assert len(newest(post, "temperature", 15, THRESHOLD, 300.0, 2000)) == len(post)
