"""Refit a calibrator on post-change samples and decide whether it may go live.

Pure numpy. The samples (already only those after the estimated change) are sorted by
prediction time and split in time: the newest ``holdout_fraction`` is the holdout, kept
for the ECE check only; the calibrator is fitted on the rest. The gate publishes only
when
- the NLL improvement over the live calibrator is significant at ``alpha`` on ALL the
  samples, out of fold: the samples are cut into ``FOLDS`` contiguous blocks in time,
  each block is scored by the method fitted on the other blocks, and a one-sided paired
  z-test runs on the per-sample differences nll_live_i - nll_oof_i (cross-fitting: no
  sample is scored by a fit that saw it, and none is wasted on a holdout, so 600
  samples fix a model whose true ECE is 0.08 with probability 0.9; a holdout of 30%
  had 0.30). ``auto`` tests each method at alpha / 4 and takes the lowest out-of-fold
  NLL among those that pass, so picking costs no size;
- the ECE does not get worse beyond noise on the time-ordered holdout (the newest
  ``holdout_fraction``): the new calibrator's ECE is at most the live one's, or
  within the (1 - alpha) quantile of the ECE a calibrated model shows on these bins;
- and no guard objects (a model-level fit must not make a large segment significantly
  worse: the same paired test, the other way round).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

from calmon.calibrators import METHODS, Calibrator, fit, to_probs
from calmon.calibrators.platt import PlattCalibrator, logistic_toward
from calmon.calibrators.scores import is_binary, to_logits
from calmon.calibrators.temperature import TemperatureCalibrator
from calmon.calibrators.validate import BIAS_MAX, T_MAX, T_MIN
from calmon.engine.buffer import SampleSet
from calmon.engine.metrics import (
    bins_from_samples,
    confidence_and_correct,
    ece,
    noise_floor,
    null_ece_quantile,
)
from calmon.engine.records import SCORE_KINDS
from calmon.errors import CalibratorError

MIN_FIT = 20  # below this a fit is noise, whatever the config says
FOLDS = 5  # cross-fitting folds of the publish gate
_EPS = 1e-15


@dataclass(frozen=True)
class Evaluation:
    ece: float
    nll: float
    # the plug-in ECE less what a calibrated model shows on the same bins (its noise
    # floor): what ``ece_increase`` compares, like with like, across sample sizes
    ece_debiased: float | None = None

    def as_dict(self) -> dict[str, float]:
        out = {"ece": self.ece, "nll": self.nll}
        if self.ece_debiased is not None:
            out["ece_debiased"] = self.ece_debiased
        return out


@dataclass(frozen=True)
class Refit:
    outcome: str  # published | rejected | failed
    method: str
    calibrator: Calibrator | None
    fit_samples: int
    holdout_samples: int
    before: Evaluation | None
    after: Evaluation | None
    reason: str = ""
    reference: list[int] | None = None  # bin counts of the fit samples' raw confidences


@dataclass(frozen=True)
class Prior:
    """Platt-form (a, b) a segment fit is shrunk toward (the model's calibrator)."""

    a: float
    b: float
    strength: float


# A guard looks at a candidate calibrator and returns why it must not be published.
Guard = Callable[[Calibrator], str | None]


def input_kind(samples: SampleSet) -> str:
    """The score kind most samples came as: what the calibrator will be fed."""
    counts = np.bincount(samples.kind.astype(np.int64), minlength=len(SCORE_KINDS))
    return SCORE_KINDS[int(counts.argmax())]


def scores_as(samples: SampleSet, kind: str) -> np.ndarray:
    """Every sample's score converted to ``kind`` (prob <-> logit, probs <-> logits)."""
    out = samples.score.astype(np.float64).copy()
    for k in np.unique(samples.kind).tolist():
        given = SCORE_KINDS[k]
        if given == kind:
            continue
        rows = samples.kind == k
        if kind in ("prob", "probs"):
            out[rows] = to_probs(samples.score[rows], given)
        else:
            out[rows] = to_logits(samples.score[rows], given)
    return out


def per_sample_nll(probs: np.ndarray, labels: np.ndarray) -> np.ndarray:
    if probs.ndim == 1:
        py = np.where(labels == 1, probs, 1.0 - probs)
    else:
        py = probs[np.arange(len(labels)), labels]
    out: np.ndarray = -np.log(np.clip(py, _EPS, 1.0))
    return out


def evaluate(probs: np.ndarray, labels: np.ndarray, bins: int) -> Evaluation:
    conf, correct = confidence_and_correct(probs, labels)
    b = bins_from_samples(conf, correct, bins)
    value = ece(b.count, b.conf, b.correct)
    return Evaluation(value, float(per_sample_nll(probs, labels).mean()),
                      max(0.0, value - noise_floor(b.count, b.conf)))


def apply_or_identity(cal: Calibrator | None, scores: np.ndarray, kind: str) -> np.ndarray:
    if cal is None:
        return to_probs(scores, kind)
    if cal.input != kind:  # the live calibrator was fitted on another spelling of the scores
        scores = to_logits(scores, kind) if cal.input in ("logit", "logits") else to_probs(
            scores, kind)
    return cal.apply(scores)


def significantly_better(nll_old: np.ndarray, nll_new: np.ndarray, alpha: float) -> bool:
    """One-sided paired z-test: is mean(nll_old - nll_new) > 0 at level alpha?"""
    d = nll_old - nll_new
    n = len(d)
    if n < 2:
        return False
    mean, sd = float(d.mean()), float(d.std(ddof=1))
    if not sd > 0:
        return mean > 0
    return mean / (sd / math.sqrt(n)) > NormalDist().inv_cdf(1.0 - alpha)


def platt_form(cal: Calibrator | None) -> tuple[float, float] | None:
    """(a, b) of a binary calibrator of Platt form: sigmoid(a z + b); identity is (1, 0)."""
    if cal is None:
        return 1.0, 0.0
    if isinstance(cal, TemperatureCalibrator) and is_binary(cal.input):
        return 1.0 / cal.temperature, cal.bias
    if isinstance(cal, PlattCalibrator) and is_binary(cal.input):
        return cal.a, cal.b
    return None


def fit_one(method: str, x: np.ndarray, y: np.ndarray, kind: str, bins: int,
            prior: Prior | None) -> Calibrator:
    """Fit ``method``; binary temperature/platt shrunk toward ``prior`` when given."""
    if prior is not None and is_binary(kind) and method in ("temperature", "platt"):
        z = to_logits(x, kind)
        yf = y.astype(np.float64)
        a, b = logistic_toward(z, yf, prior.a, prior.b, prior.strength)
        # within what load() accepts (calibrators.validate), or the publish would fail
        a = min(max(a, 1.0 / T_MAX), 1.0 / T_MIN)
        b = min(max(b, -BIAS_MAX), BIAS_MAX)
        if method == "platt":
            return PlattCalibrator(a, b, kind)
        return TemperatureCalibrator(1.0 / a, kind, b)
    if method == "histogram":
        return fit(method, x, y, input=kind, bins=bins)
    return fit(method, x, y, input=kind)


def refit(samples: SampleSet, method: str, live: Calibrator | None, holdout_fraction: float,
          bins: int, alpha: float = 0.01, prior: Prior | None = None,
          guards: tuple[Guard, ...] = (), *, folds: int = FOLDS) -> Refit:
    """Fit ``method`` on the older samples and gate it: cross-fitted NLL on all samples,
    ECE on the time-ordered holdout (module docstring)."""
    order = np.argsort(samples.ts, kind="stable")
    kind = input_kind(samples)
    scores = scores_as(samples, kind)[order]
    labels = samples.label[order].astype(np.int64)
    n = len(labels)
    n_hold = round(n * holdout_fraction)
    n_fit = n - n_hold
    if n_fit < MIN_FIT or n_hold < MIN_FIT or n < folds * MIN_FIT:
        return Refit("failed", method, None, 0, 0, None, None,
                     f"too few samples to split ({n_fit} fit, {n_hold} holdout)")
    live_probs = apply_or_identity(live, scores, kind)
    nll_live = per_sample_nll(live_probs, labels)
    before = evaluate(live_probs[n_fit:], labels[n_fit:], bins)
    reference = reference_counts(scores[:n_fit], kind, bins)
    # auto: every method is tested at alpha / 4 (a union bound, so choosing among them
    # costs no size); the one with the lowest out-of-fold NLL among those that pass wins
    methods = METHODS if method == "auto" else (method,)
    level = alpha / len(methods)
    errors: list[str] = []
    best: tuple[bool, float, str] | None = None  # (passes, out-of-fold NLL, method)
    for m in methods:
        try:
            oof = cross_fit(m, scores, labels, kind, bins, prior, folds)
        except CalibratorError as e:
            errors.append(f"{m}: {e}")
            continue
        nll_oof = per_sample_nll(oof, labels)
        cand = (significantly_better(nll_live, nll_oof, level), float(nll_oof.mean()), m)
        if best is None or (cand[0], -cand[1]) > (best[0], -best[1]):
            best = cand
    if best is None:
        return Refit("failed", method, None, 0, 0, before, None, "; ".join(errors))
    passes, _, chosen = best
    try:
        cal = fit_one(chosen, scores[:n_fit], labels[:n_fit], kind, bins, prior)
    except CalibratorError as e:
        return Refit("failed", chosen, None, 0, 0, before, None, f"{chosen}: {e}")
    hold_probs = cal.apply(scores[n_fit:])
    after = evaluate(hold_probs, labels[n_fit:], bins)
    reason = ""
    if not passes:
        reason = "cross-fitted NLL improvement not significant"
    elif after.ece > before.ece:
        conf, correct = confidence_and_correct(hold_probs, labels[n_fit:])
        b = bins_from_samples(conf, correct, bins)
        if after.ece > null_ece_quantile(b.count, b.conf, 1.0 - alpha):
            reason = "holdout ECE worse beyond its noise"
    if not reason:
        for guard in guards:
            why = guard(cal)
            if why:
                reason = why
                break
    return Refit("rejected" if reason else "published", chosen, cal, n_fit, n_hold, before,
                 after, reason, reference)


def cross_fit(method: str, x: np.ndarray, y: np.ndarray, kind: str, bins: int,
              prior: Prior | None, folds: int = FOLDS) -> np.ndarray:
    """Out-of-fold calibrated probabilities: ``folds`` contiguous blocks in time, each
    predicted by ``method`` fitted on the others."""
    edges = np.linspace(0, len(y), folds + 1).round().astype(np.int64)
    out: np.ndarray | None = None
    for lo, hi in zip(edges[:-1].tolist(), edges[1:].tolist()):
        rest = np.r_[0:lo, hi:len(y)]
        probs = fit_one(method, x[rest], y[rest], kind, bins, prior).apply(x[lo:hi])
        if out is None:
            out = np.empty((len(y), *probs.shape[1:]))
        out[lo:hi] = probs
    assert out is not None
    return out


def reference_counts(x: np.ndarray, kind: str, bins: int) -> list[int]:
    """Bin counts of the raw confidences (binary P(y=1), multiclass top label)."""
    probs = to_probs(x, kind)
    conf = probs if probs.ndim == 1 else probs.max(axis=1)
    b = bins_from_samples(conf, np.zeros(len(conf)), bins)
    return [int(v) for v in b.count]
