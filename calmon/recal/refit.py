"""Refit a calibrator on post-change samples and decide whether it may go live.

Pure numpy. The samples (already only those after the estimated change) are sorted by
prediction time and split in time: the newest ``holdout_fraction`` is the holdout, kept
for the ECE check only; the calibrator is fitted on the rest. The gate publishes only
when
- the NLL improvement over the live calibrator is significant at ``alpha`` on ALL the
  samples, out of sample and forward in time: the samples are cut into ``FOLDS``
  contiguous blocks in time, each block after the first is scored by the method fitted
  on the blocks BEFORE it, and the likelihood ratios over the live calibrator multiply
  into an e-value (prequential: each block's predictor is fixed before its labels, so
  under a calibrated live calibrator the product has mean 1 and reaches 1/alpha with
  probability at most alpha, by Markov's inequality, for any method and any n). It
  asks what serving will see, whether a fit on the past beats the live calibrator on
  the future; the cross-fitted paired z-test it replaced needed ~11 nats of improvement
  where this needs log(1/alpha) = 4.6 (a fix of a true ECE 0.08 from 300 samples:
  power 0.84 against 0.37; a 0.1%-positive model whose odds doubled, from 40,000:
  0.85 against 0.47). ``auto`` tests each method at alpha / 4 and takes the largest
  e-value among those that pass, so picking costs no size;
- the ECE does not get worse beyond noise on the time-ordered holdout (the newest
  ``holdout_fraction``): the new calibrator's ECE is at most the live one's, or
  within the (1 - alpha) quantile of the ECE a calibrated model shows on these bins;
- and no guard objects (a model-level fit must not make a large segment significantly
  worse: a one-sided paired z-test, the other way round).
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
FOLDS = 5  # blocks in time of the publish gate (the first is only fitted on)
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
    # the gate's evidence: log e-value of the held-out NLL gain and the log(1/alpha) it
    # needed, and the (1 - alpha) quantile of a calibrated model's holdout ECE on the
    # after-bins (an ECE under it is within noise)
    log_e: float | None = None
    need: float | None = None
    ece_noise: float | None = None


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
          guards: tuple[Guard, ...] = (), *, folds: int = FOLDS,
          interleave: float | None = None) -> Refit:
    """Fit ``method`` on the older samples and gate it: the prequential e-value on all
    samples, ECE on the time-ordered holdout (module docstring).

    ``interleave`` (seconds): for samples that span a cycle (a daily one, say) on
    purpose, the blocks in time are that long and dealt round-robin to the folds and
    to the holdout, so every fold, the fit part and the holdout each span the cycle:
    a fit on the night alone must not be judged on the afternoon. The e-value is as
    valid (each fold's predictor is still fitted on earlier folds' labels only)."""
    order = np.argsort(samples.ts, kind="stable")
    kind = input_kind(samples)
    scores = scores_as(samples, kind)[order]
    labels = samples.label[order].astype(np.int64)
    ts = samples.ts[order]
    n = len(labels)
    fold_of, hold = _split(ts, holdout_fraction, folds, interleave)
    n_hold = int(hold.sum())
    n_fit = n - n_hold
    if n_fit < MIN_FIT or n_hold < MIN_FIT or n < folds * MIN_FIT:
        return Refit("failed", method, None, 0, 0, None, None,
                     f"too few samples to split ({n_fit} fit, {n_hold} holdout)")
    live_probs = apply_or_identity(live, scores, kind)
    nll_live = per_sample_nll(live_probs, labels)
    before = evaluate(live_probs[hold], labels[hold], bins)
    reference = reference_counts(scores[~hold], kind, bins)
    # auto: every method is tested at alpha / 4 (a union bound, so choosing among them
    # costs no size); the one with the largest e-value among those that pass wins
    methods = METHODS if method == "auto" else (method,)
    need = math.log(len(methods) / alpha)
    errors: list[str] = []
    best: tuple[bool, float, str] | None = None  # (passes, log e-value, method)
    for m in methods:
        try:
            log_e = prequential(m, scores, labels, kind, bins, prior, nll_live, folds,
                                fold_of=fold_of)
        except CalibratorError as e:
            errors.append(f"{m}: {e}")
            continue
        cand = (log_e >= need, log_e, m)
        if best is None or cand[:2] > best[:2]:
            best = cand
    if best is None:
        return Refit("failed", method, None, 0, 0, before, None, "; ".join(errors))
    passes, log_e, chosen = best
    try:
        cal = fit_one(chosen, scores[~hold], labels[~hold], kind, bins, prior)
    except CalibratorError as e:
        return Refit("failed", chosen, None, 0, 0, before, None, f"{chosen}: {e}")
    hold_probs = cal.apply(scores[hold])
    after = evaluate(hold_probs, labels[hold], bins)
    conf, correct = confidence_and_correct(hold_probs, labels[hold])
    b = bins_from_samples(conf, correct, bins)
    noise = null_ece_quantile(b.count, b.conf, 1.0 - alpha)
    reason = ""
    if not passes:
        reason = (f"NLL improvement not significant (log e-value {log_e:.1f} < "
                  f"{need:.1f})")
    elif after.ece > before.ece and after.ece > noise:
        reason = "holdout ECE worse beyond its noise"
    if not reason:
        for guard in guards:
            why = guard(cal)
            if why:
                reason = why
                break
    return Refit("rejected" if reason else "published", chosen, cal, n_fit, n_hold, before,
                 after, reason, reference, log_e, need, noise)


def _split(ts: np.ndarray, holdout_fraction: float, folds: int, interleave: float | None
           ) -> tuple[np.ndarray, np.ndarray]:
    """(fold of each sample, holdout mask) for samples sorted by ts: contiguous blocks
    in time and the newest ``holdout_fraction`` as the holdout; with ``interleave``,
    blocks of that many seconds dealt round-robin to the folds, and to the holdout
    evenly (block b when floor((b + 1) f) > floor(b f))."""
    n = len(ts)
    if interleave is None or n == 0:
        edges = np.linspace(0, n, folds + 1).round().astype(np.int64)
        fold_of = np.searchsorted(edges, np.arange(n), side="right") - 1
        hold = np.arange(n) >= n - round(n * holdout_fraction)
        return fold_of, hold
    block = np.floor((ts - ts[0]) / interleave).astype(np.int64)
    fold_of = block % folds
    f = holdout_fraction
    hold = np.floor((block + 1) * f) > np.floor(block * f)
    return fold_of, hold


def prequential(method: str, x: np.ndarray, y: np.ndarray, kind: str, bins: int,
                prior: Prior | None, nll_live: np.ndarray, folds: int = FOLDS, *,
                fold_of: np.ndarray | None = None) -> float:
    """log of the gate's e-value: the samples in ``folds`` folds (contiguous blocks in
    time unless ``fold_of`` says otherwise); each fold after the first is scored by
    ``method`` fitted on every earlier fold, and its log-likelihood ratio over the live
    calibrator (``nll_live``) is added. A fold whose past cannot be fitted (one class
    only, say) is scored by the live calibrator (ratio 1), as is decided before its
    labels are read. Raises CalibratorError when no fold could be fitted."""
    if fold_of is None:
        edges = np.linspace(0, len(y), folds + 1).round().astype(np.int64)
        fold_of = np.searchsorted(edges, np.arange(len(y)), side="right") - 1
    total, fitted, error = 0.0, 0, None
    for k in range(1, folds):
        past, mine = fold_of < k, fold_of == k
        if not mine.any() or not past.any():
            continue
        try:
            cal = fit_one(method, x[past], y[past], kind, bins, prior)
        except CalibratorError as e:
            error = e
            continue
        fitted += 1
        total += float((nll_live[mine] - per_sample_nll(cal.apply(x[mine]), y[mine])).sum())
    if not fitted and error is not None:
        raise error
    return total


def reference_counts(x: np.ndarray, kind: str, bins: int) -> list[int]:
    """Bin counts of the raw confidences (binary P(y=1), multiclass top label)."""
    probs = to_probs(x, kind)
    conf = probs if probs.ndim == 1 else probs.max(axis=1)
    b = bins_from_samples(conf, np.zeros(len(conf)), bins)
    return [int(v) for v in b.count]
