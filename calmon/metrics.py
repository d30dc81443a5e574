"""Calibration metrics from arrays: the numbers the daemon exports, for notebooks and CI.

Every function takes ``scores`` and ``labels`` for one model and computes what
``calmon_*`` would show for the same joined samples, with the same definitions
(contract section 2) and the same code (``calmon.engine.metrics``)::

    import numpy as np
    from calmon import metrics

    p = np.array([0.1, 0.8, 0.35, 0.9]); y = np.array([0, 1, 1, 1])
    metrics.ece(p, y)                       # 15 equal-width, right-closed bins
    metrics.reliability_curve(p, y, bins=10)  # what a reliability diagram plots
    metrics.ece_interval(p, y, level=0.9)   # (lower, upper) for the population ECE

``scores`` is one of:

- a 1-D array of P(y=1) (a binary model; ``labels`` 0/1), scored against y;
- a 2-D array of class probabilities, shape (N, K) (``labels`` class indices),
  scored on the top-label confidence against correctness (Guo et al. 2017);
- logits of either shape with ``logits=True`` (sigmoid or softmax first).

Bins are equal-width over [0, 1] and right-closed, as scikit-learn's
``calibration_curve``: its ``prob_true`` and ``prob_pred`` are this module's
``accuracy`` and ``mean_confidence`` of the non-empty bins.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from calmon.calibrators.scores import sigmoid, softmax
from calmon.engine import metrics as _m
from calmon.engine.windows import bin_index

__all__ = ["ReliabilityCurve", "ace", "brier", "ece", "ece_interval", "mce", "nll",
           "noise_floor", "reliability_curve", "smece"]

ArrayLike = npt.ArrayLike


@dataclass(frozen=True)
class ReliabilityCurve:
    """Per bin: edges, sample count, mean confidence and accuracy (NaN where empty)."""

    edges: np.ndarray  # B + 1 edges, 0 .. 1
    count: np.ndarray  # B sample counts
    mean_confidence: np.ndarray  # B values, NaN for empty bins
    accuracy: np.ndarray  # B values, NaN for empty bins

    @property
    def gap(self) -> np.ndarray:
        """accuracy - mean confidence per bin (negative: over-confident)."""
        return np.asarray(self.accuracy - self.mean_confidence)


def _target(scores: ArrayLike, labels: ArrayLike,
            logits: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(probabilities, confidence, correct) with shapes checked."""
    s = np.asarray(scores, dtype=np.float64)
    y = np.asarray(labels)
    if s.ndim not in (1, 2) or len(s) != len(y) or len(s) == 0:
        raise ValueError("scores must be (N,) or (N, K) and labels (N,), with N > 0")
    if not np.all(np.isfinite(s)):
        raise ValueError("scores must be finite")
    if logits:
        s = sigmoid(s) if s.ndim == 1 else softmax(s)
    if np.any(s < 0) or np.any(s > 1):
        raise ValueError("probabilities must lie in [0, 1] (pass logits=True for logits)")
    if s.ndim == 2:
        s = s / s.sum(axis=1, keepdims=True)
    yi = y.astype(np.int64)
    if not np.array_equal(yi, y.astype(np.float64)):
        raise ValueError("labels must be class indices (0/1 for a binary model)")
    k = 2 if s.ndim == 1 else s.shape[1]
    if np.any(yi < 0) or np.any(yi >= k):
        raise ValueError(f"labels must lie in 0..{k - 1}")
    conf, correct = _m.confidence_and_correct(s, yi)
    return s, conf, correct


def _bins(scores: ArrayLike, labels: ArrayLike, bins: int,
          logits: bool) -> _m.Bins:
    _, conf, correct = _target(scores, labels, logits)
    return _m.bins_from_samples(conf, correct, bins)


def reliability_curve(scores: ArrayLike, labels: ArrayLike, bins: int = 15, *,
                      logits: bool = False) -> ReliabilityCurve:
    """The reliability diagram's points on ``bins`` equal-width, right-closed bins."""
    b = _bins(scores, labels, bins, logits)
    with np.errstate(invalid="ignore", divide="ignore"):
        conf = np.where(b.count > 0, b.conf / b.count, np.nan)
        acc = np.where(b.count > 0, b.correct / b.count, np.nan)
    return ReliabilityCurve(np.linspace(0.0, 1.0, bins + 1), b.count.astype(np.int64), conf, acc)


def ece(scores: ArrayLike, labels: ArrayLike, bins: int = 15, *, logits: bool = False) -> float:
    """Expected calibration error: sum over bins of (n_b / N) |conf_b - acc_b|."""
    b = _bins(scores, labels, bins, logits)
    return _m.ece(b.count, b.conf, b.correct)


def mce(scores: ArrayLike, labels: ArrayLike, bins: int = 15, *, min_samples: int = 30,
        logits: bool = False) -> float | None:
    """Largest bin gap over bins of at least ``min_samples`` samples (None if none)."""
    b = _bins(scores, labels, bins, logits)
    return _m.mce(b.count, b.conf, b.correct, min_samples)


def ace(scores: ArrayLike, labels: ArrayLike, bins: int = 15, *, fine_bins: int = 1000,
        logits: bool = False) -> float:
    """Adaptive ECE over ``bins`` equal-mass groups of ``fine_bins`` fine bins."""
    fb = _bins(scores, labels, fine_bins, logits)
    return _m.ace(fb.count, fb.conf, fb.correct, bins)


def noise_floor(scores: ArrayLike, labels: ArrayLike, bins: int = 15, *,
                logits: bool = False) -> float:
    """The mean ECE a perfectly calibrated model would show with these bins."""
    b = _bins(scores, labels, bins, logits)
    return _m.noise_floor(b.count, b.conf)


def ece_interval(scores: ArrayLike, labels: ArrayLike, bins: int = 15, *, level: float = 0.9,
                 logits: bool = False) -> tuple[float, float]:
    """An interval at ``level`` for the population binned ECE (deterministic)."""
    b = _bins(scores, labels, bins, logits)
    return _m.ece_interval(b.count, b.conf, b.correct, level)


def smece(scores: ArrayLike, labels: ArrayLike, *, fine_bins: int = 1000,
          logits: bool = False) -> float:
    """Smooth ECE (Blasiok and Nakkiran 2023), each score at its fine bin's mean."""
    fb = _bins(scores, labels, fine_bins, logits)
    return _m.smece(fb.count, fb.conf, fb.correct)


def brier(scores: ArrayLike, labels: ArrayLike, *, logits: bool = False) -> float:
    """Binary mean (p - y)^2; multiclass mean of sum_k (p_k - [y = k])^2."""
    p, _, _ = _target(scores, labels, logits)
    y = np.asarray(labels).astype(np.int64)
    if p.ndim == 1:
        return float(np.mean((p - y) ** 2))
    onehot = np.eye(p.shape[1])[y]
    return float(np.mean(np.sum((p - onehot) ** 2, axis=1)))


def nll(scores: ArrayLike, labels: ArrayLike, *, logits: bool = False) -> float:
    """Mean -log p(y), p clipped to [1e-15, 1]."""
    p, _, _ = _target(scores, labels, logits)
    return _m.nll_from_samples(p, np.asarray(labels).astype(np.int64))


# bin_index is how the daemon bins a confidence; exposed for plotting code that bins alike
bin_of = bin_index
