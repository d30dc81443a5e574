"""Effect-size triggers: pure decisions on the samples after an estimated change.

Significance comes from the sequential detector (calmon.recal.detect); these
triggers say whether the change is large enough to act on. They read the samples
predicted since the estimated change time, after the live calibrator, and are
symmetric in the classes (contract section 6, v4):

- ``ece_above``: the bias-corrected ECE (plug-in less its noise floor, the mean ECE a
  calibrated model shows on the same bins) over the threshold. The plug-in ECE of a
  few hundred samples sits far above the true one (0.069 on 314 samples against a true
  0.030), and falls as samples come: a trigger on it announces alarms that vanish.
- ``ece_increase``: the same bias-corrected ECE over the live calibrator's holdout ECE
  at publish time (bias-corrected too) plus a margin.
- ``observed_over_expected`` (binary): observed over expected count of the MINORITY
  class (the class the model gives the smaller total probability) outside a band. A
  99.9%-positive model is read through its 0.1% negatives, exactly as its mirror image
  is through its positives; sum y / sum p of a majority class hardly moves.
- ``classwise_ece_above`` (multiclass with ``metrics.classwise``): the worst class's
  one-vs-rest ECE of p_k against [y = k], bias-corrected, over a threshold, and only for
  a class whose miscalibration is significant by itself (a Hosmer-Lemeshow chi-square
  over its bins at alpha / K): the mean over classes dilutes a shift of a few classes
  by few/K, and the maximum of K noisy readings is noise unless a test backs it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

import numpy as np

from calmon.config import RecalibrationConfig
from calmon.engine.metrics import Bins, binomial_mad, ece, noise_floor
from calmon.engine.windows import bin_index

TRIGGERS = ("ece_above", "ece_increase", "observed_over_expected", "classwise_ece_above")


@dataclass(frozen=True)
class Reading:
    """What the triggers look at for one model/segment."""

    bins: Bins  # after the live calibrator, samples since the estimated change
    binary: bool
    # the live calibrator's holdout ECE at publish, bias-corrected (less its noise floor),
    # as ``ece_increase`` compares it with the bias-corrected ECE of these bins
    last_publish_ece: float | None
    # multiclass with metrics.classwise, same samples: the worst significant class's
    # bias-corrected one-vs-rest ECE (``worst_class_ece``), 0.0 when none is significant
    classwise_ece: float | None = None

    @property
    def samples(self) -> int:
        return int(self.bins.count.sum())


@dataclass(frozen=True)
class Decision:
    ece: float  # plug-in
    fired: tuple[str, ...]
    observed_over_expected: float | None  # sum y / sum p (the gauge's reading)
    ece_debiased: float = 0.0  # what ece_above and ece_increase read
    minority_ratio: float | None = None  # observed / expected of the minority class


def minority_ratio(b: Bins) -> float | None:
    """Binary bins: observed over expected count of the class with the smaller
    expected count (positives when sum p <= n / 2, else negatives)."""
    n, sum_p, sum_y = float(b.count.sum()), float(b.conf.sum()), float(b.correct.sum())
    if sum_p <= n / 2:
        return sum_y / sum_p if sum_p > 0 else None
    return (n - sum_y) / (n - sum_p) if n > sum_p else None


def decide(cfg: RecalibrationConfig, r: Reading) -> Decision:
    """Which triggers' effect sizes are exceeded (call only once the detector alarms)."""
    t = cfg.triggers
    if r.samples == 0:
        return Decision(0.0, (), None)
    b = r.bins
    value = ece(b.count, b.conf, b.correct)
    debiased = value - noise_floor(b.count, b.conf)
    sum_p = float(b.conf.sum())
    oe = float(b.correct.sum()) / sum_p if r.binary and sum_p > 0 else None
    rare = minority_ratio(b) if r.binary else None
    fired: list[str] = []
    if t.ece_above is not None and debiased > t.ece_above:
        fired.append("ece_above")
    if (t.ece_increase is not None and r.last_publish_ece is not None
            and debiased > r.last_publish_ece + t.ece_increase):
        fired.append("ece_increase")
    band = t.observed_over_expected
    if band is not None and rare is not None and not band[0] <= rare <= band[1]:
        fired.append("observed_over_expected")
    if (t.classwise_ece_above is not None and r.classwise_ece is not None
            and r.classwise_ece > t.classwise_ece_above):
        fired.append("classwise_ece_above")
    if (t.ece_above is None and t.ece_increase is None and band is None
            and t.classwise_ece_above is None):
        fired.append("evidence")  # no effect-size triggers configured: the detector decides
    return Decision(value, tuple(fired), oe, debiased, rare)


def class_bins(probs: np.ndarray, labels: np.ndarray, bins: int
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(count, conf, correct), each (K, bins): every class's one-vs-rest bins of p_k
    against [y = k], in one pass (cost O(n K))."""
    n, k = probs.shape
    idx = bin_index(probs, bins) + bins * np.arange(k)[None, :]  # (n, K) flat bin ids
    hit = np.zeros((n, k))
    hit[np.arange(n), np.asarray(labels, dtype=np.int64)] = 1.0
    size = k * bins
    flat = idx.ravel()
    count = np.bincount(flat, minlength=size).astype(np.float64).reshape(k, bins)
    conf = np.bincount(flat, probs.ravel(), minlength=size).reshape(k, bins)
    correct = np.bincount(flat, hit.ravel(), minlength=size).reshape(k, bins)
    return count, conf, correct


def chi2_quantile(q: float, df: int) -> float:
    """Wilson-Hilferty approximation of the chi-square quantile (within ~4% for df >= 3 up
    to q = 0.9999, above rather than below)."""
    z = NormalDist().inv_cdf(q)
    h = 2.0 / (9.0 * df)
    return float(df * (1.0 - h + z * math.sqrt(h)) ** 3)


def worst_class_ece(probs: np.ndarray, labels: np.ndarray, bins: int, alpha: float
                    ) -> tuple[float, int | None]:
    """(bias-corrected one-vs-rest ECE, class) of the worst class among those whose own
    calibration test rejects at alpha / K: sum over its bins of (O - E)^2 / V, O the
    class's count, E = sum p_k, V = E (1 - E / n) (at least sum p (1 - p), so the
    statistic is at most chi-square with as many degrees of freedom as bins under
    calibration). (0.0, None) when no class is significant."""
    count, conf, correct = class_bins(probs, labels, bins)
    k = probs.shape[1]
    with np.errstate(divide="ignore", invalid="ignore"):
        var = conf * (1.0 - conf / np.where(count > 0, count, 1.0))
        terms = np.where(var > 1e-12, (correct - conf) ** 2 / var, 0.0)
    stat = terms.sum(axis=1)
    df = np.maximum((var > 1e-12).sum(axis=1), 1)
    worst, which = 0.0, None
    level = 1.0 - alpha / k
    n = float(count[0].sum())
    for c in np.argsort(-np.abs(correct - conf).sum(axis=1)).tolist():
        gap = float(np.abs(correct[c] - conf[c]).sum()) / n  # plug-in ECE of class c
        if gap <= worst:
            break  # sorted by plug-in ECE: no later class can beat ``worst``
        if stat[c] <= chi2_quantile(level, int(df[c])):
            continue
        floor = sum(binomial_mad(round(nb), cb / nb)
                    for nb, cb in zip(count[c].tolist(), conf[c].tolist()) if nb > 0) / n
        if gap - floor > worst:
            worst, which = gap - floor, c
    return worst, which


def baseline(live: Any, published: float | None) -> float | None:
    """The ECE ``ece_increase`` compares with: the live document's (``live``, a
    registry.Live or None) bias-corrected holdout ECE (so a rollback by the CLI moves it
    too), else ``published``, the last publish this process made; None (the trigger is
    off) for a document without one, whose plug-in ECE would not compare like with like."""
    try:
        return float(live.doc["fit"]["holdout_after"]["ece_debiased"])
    except (AttributeError, KeyError, TypeError, ValueError):
        return published if live is not None else None
