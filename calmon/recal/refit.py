"""Refit a calibrator on recent samples and decide whether it may go live.

Pure numpy. The buffer is split in time: the older part fits, the newest
``holdout_fraction`` judges. A candidate is published only if it beats the
live calibrator (identity when there is none) on BOTH holdout ECE and NLL.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from calmon.calibrators import METHODS, Calibrator, fit, to_probs
from calmon.calibrators.scores import to_logits
from calmon.engine.buffer import SampleSet
from calmon.engine.metrics import (
    bins_from_samples,
    confidence_and_correct,
    ece,
    nll_from_samples,
)
from calmon.engine.records import SCORE_KINDS
from calmon.errors import CalibratorError

MIN_FIT = 20  # below this a fit is noise, whatever the config says


@dataclass(frozen=True)
class Evaluation:
    ece: float
    nll: float

    def as_dict(self) -> dict[str, float]:
        return {"ece": self.ece, "nll": self.nll}


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


def input_kind(samples: SampleSet) -> str:
    """The score kind most samples came as: what the calibrator will be fed."""
    counts = np.bincount(samples.kind.astype(np.int64), minlength=4)
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


def evaluate(probs: np.ndarray, labels: np.ndarray, bins: int) -> Evaluation:
    conf, correct = confidence_and_correct(probs, labels)
    b = bins_from_samples(conf, correct, bins)
    return Evaluation(ece(b.count, b.conf, b.correct), nll_from_samples(probs, labels))


def apply_or_identity(cal: Calibrator | None, scores: np.ndarray, kind: str) -> np.ndarray:
    if cal is None:
        return to_probs(scores, kind)
    if cal.input != kind:  # the live calibrator was fitted on another spelling of the scores
        scores = to_logits(scores, kind) if cal.input in ("logit", "logits") else to_probs(
            scores, kind)
    return cal.apply(scores)


def refit(samples: SampleSet, method: str, live: Calibrator | None, holdout_fraction: float,
          bins: int) -> Refit:
    """Fit ``method`` (or every method for ``auto``, best holdout NLL) and gate it."""
    order = np.argsort(samples.ts, kind="stable")
    kind = input_kind(samples)
    scores = scores_as(samples, kind)[order]
    labels = samples.label[order].astype(np.int64)
    n_hold = round(len(labels) * holdout_fraction)
    n_fit = len(labels) - n_hold
    if n_fit < MIN_FIT or n_hold < MIN_FIT:
        return Refit("failed", method, None, n_fit, n_hold, None, None,
                     f"too few samples to split ({n_fit} fit, {n_hold} holdout)")
    fit_x, fit_y = scores[:n_fit], labels[:n_fit]
    hold_x, hold_y = scores[n_fit:], labels[n_fit:]
    before = evaluate(apply_or_identity(live, hold_x, kind), hold_y, bins)
    candidates: list[tuple[Evaluation, Calibrator]] = []
    errors: list[str] = []
    for m in (METHODS if method == "auto" else (method,)):
        try:
            cal = fit(m, fit_x, fit_y, input=kind)
        except CalibratorError as e:
            errors.append(f"{m}: {e}")
            continue
        candidates.append((evaluate(cal.apply(hold_x), hold_y, bins), cal))
    if not candidates:
        return Refit("failed", method, None, n_fit, n_hold, before, None, "; ".join(errors))
    after, best = min(candidates, key=lambda c: c[0].nll)
    better = after.ece < before.ece and after.nll < before.nll
    return Refit("published" if better else "rejected", best.method, best, n_fit, n_hold,
                 before, after, "" if better else "does not beat the live calibrator")
