"""Calibration metrics from binned counts: pure numpy, no state.

Definitions are the contract's (section 2): right-closed equal-width bins,
ECE/MCE over them, ACE over equal-mass groups of fine bins, Brier, NLL,
accuracy, observed/expected, and the noise floor of a perfectly calibrated
model with the same bin counts and mean confidences.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from calmon.engine.windows import CONF_SCALE, NLL_SCALE, Layout, bin_index


@dataclass(frozen=True)
class Bins:
    """Per-bin sums: samples, summed confidence, summed correctness."""

    count: np.ndarray
    conf: np.ndarray
    correct: np.ndarray


@dataclass(frozen=True)
class Stats:
    samples: int
    ece: float | None
    mce: float | None
    ace: float | None
    brier: float | None
    nll: float | None
    accuracy: float | None
    mean_confidence: float | None
    observed_rate: float | None
    observed_over_expected: float | None
    noise_floor: float | None
    bins: Bins

    def as_row(self) -> dict[str, float | int | None]:
        return {name: getattr(self, name) for name in METRIC_NAMES}


METRIC_NAMES = ("samples", "ece", "mce", "ace", "brier", "nll", "accuracy", "mean_confidence",
                "observed_rate", "observed_over_expected", "noise_floor")


def ece(count: np.ndarray, conf: np.ndarray, correct: np.ndarray) -> float:
    """sum over bins of (n_b / N) * |mean confidence_b - accuracy_b|."""
    n = count.sum()
    nz = count > 0
    gap = np.abs(conf[nz] / count[nz] - correct[nz] / count[nz])
    return float(np.sum(count[nz] / n * gap))


def mce(count: np.ndarray, conf: np.ndarray, correct: np.ndarray) -> float:
    nz = count > 0
    return float(np.max(np.abs(conf[nz] / count[nz] - correct[nz] / count[nz])))


def ace(fcount: np.ndarray, fconf: np.ndarray, fcorrect: np.ndarray, groups: int) -> float:
    """Adaptive ECE: fine bins merged into ``groups`` equal-mass groups; a group
    closes after the first fine bin where the running count reaches k*N/B."""
    n = fcount.sum()
    running = np.cumsum(fcount)
    thresholds = np.arange(1, groups) * n / groups
    ends = np.unique(np.searchsorted(running, thresholds, side="left"))
    ends = np.append(ends[ends < len(fcount) - 1], len(fcount) - 1)
    starts = np.concatenate(([0], ends[:-1] + 1))
    gc = np.add.reduceat(fcount, starts)
    gconf = np.add.reduceat(fconf, starts)
    gcorr = np.add.reduceat(fcorrect, starts)
    return ece(gc, gconf, gcorr)


def binomial_mad(n: int, p: float) -> float:
    """E|X - np| for X ~ Binomial(n, p), de Moivre's closed form (in log space)."""
    if n <= 0 or p <= 0.0 or p >= 1.0:
        return 0.0
    m = math.floor(n * p)
    if m >= n:
        return 0.0
    log = (math.log(2.0) + (n - m) * math.log1p(-p) + (m + 1) * math.log(p) + math.log(m + 1)
           + math.lgamma(n + 1) - math.lgamma(m + 2) - math.lgamma(n - m))
    return math.exp(log)


def noise_floor(count: np.ndarray, conf: np.ndarray) -> float:
    """Mean ECE of a perfectly calibrated model with the same bin counts and mean
    confidences: labels ~ Bernoulli(mean confidence of the bin)."""
    n = count.sum()
    total = 0.0
    for nb, cb in zip(count.tolist(), conf.tolist()):
        if nb > 0:
            total += binomial_mad(round(nb), cb / nb)
    return total / n


def null_ece_quantile(count: np.ndarray, conf: np.ndarray, q: float,
                      draws: int = 4000, seed: int = 0) -> float:
    """The q-quantile of the ECE a perfectly calibrated model would show with these
    bin counts and mean confidences (Monte Carlo, seeded so it is repeatable)."""
    nz = count > 0
    nb = count[nz].astype(np.int64)
    pb = np.clip(conf[nz] / count[nz], 0.0, 1.0)
    rng = np.random.default_rng(seed)
    x = rng.binomial(nb, pb, size=(draws, len(nb)))
    null = np.abs(x - nb * pb).sum(axis=1) / nb.sum()
    return float(np.quantile(null, q))


def from_vector(vec: np.ndarray, layout: Layout, binary: bool) -> Stats:
    """Stats of one window from its summed bucket vector (see ``windows.Layout``)."""
    lay = layout
    b, f = lay.bins, lay.fine_bins
    count = vec[lay.count:lay.count + b]
    conf = vec[lay.conf:lay.conf + b] / CONF_SCALE
    correct = vec[lay.correct:lay.correct + b]
    bins = Bins(count, conf, correct)
    n = round(count.sum())
    if n == 0:
        return Stats(0, *([None] * 10), bins=bins)  # type: ignore[arg-type]
    fcount = vec[lay.fcount:lay.fcount + f]
    fconf = vec[lay.fconf:lay.fconf + f] / CONF_SCALE
    fcorrect = vec[lay.fcorrect:lay.fcorrect + f]
    sum_conf = float(conf.sum())
    sum_correct = float(correct.sum())
    return Stats(
        samples=n,
        ece=ece(count, conf, correct),
        mce=mce(count, conf, correct),
        ace=ace(fcount, fconf, fcorrect, b),
        brier=float(vec[lay.brier] / CONF_SCALE / n),
        nll=float(vec[lay.nll] / NLL_SCALE / n),
        accuracy=float(vec[lay.acc] / n),
        mean_confidence=sum_conf / n,
        observed_rate=sum_correct / n if binary else None,
        observed_over_expected=(sum_correct / sum_conf if binary and sum_conf > 0 else None),
        noise_floor=noise_floor(count, conf),
        bins=bins,
    )


def confidence_and_correct(probs: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-sample calibration target: binary P(y=1) against y; multiclass top-label
    confidence against correctness (Guo et al. 2017)."""
    if probs.ndim == 1:
        return probs, labels.astype(np.float64)
    return probs.max(axis=1), (probs.argmax(axis=1) == labels).astype(np.float64)


def bins_from_samples(conf: np.ndarray, correct: np.ndarray, bins: int) -> Bins:
    b = bin_index(conf, bins)
    return Bins(np.bincount(b, minlength=bins).astype(np.float64),
                np.bincount(b, conf, minlength=bins), np.bincount(b, correct, minlength=bins))


def nll_from_samples(probs: np.ndarray, labels: np.ndarray) -> float:
    if probs.ndim == 1:
        py = np.where(labels == 1, probs, 1.0 - probs)
    else:
        py = probs[np.arange(len(labels)), labels]
    return float(np.mean(-np.log(np.clip(py, 1e-15, 1.0))))
