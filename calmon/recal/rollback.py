"""Rollback candidates (contract section 6, v3: "Rollback is a candidate"): whenever a
series' own live calibrator is tested, the identity and its last ``ROLLBACK_VERSIONS``
earlier versions compete with it on the post-change samples. A candidate wins when its
likelihood ratio over the live calibrator reaches len(candidates) / alpha (an e-value:
the candidates are fixed before these samples) and the detector's mixture finds nothing
wrong with it there; the largest ratio wins."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from calmon.calibrators import Calibrator, CalibratorError, load
from calmon.calibrators.identity import IdentityCalibrator
from calmon.engine.buffer import SampleSet
from calmon.engine.metrics import confidence_and_correct
from calmon.recal.detect import Detector, tilt_log_lr
from calmon.recal.refit import (
    Evaluation,
    apply_or_identity,
    evaluate,
    input_kind,
    per_sample_nll,
    reference_counts,
    scores_as,
)
from calmon.recal.registry import Live, Registry

ROLLBACK_VERSIONS = 5  # earlier versions a rollback may go back to (newest first)

# (log-likelihood ratio over the live calibrator, version (None: the identity), the
# candidate, its document (None: the identity), its probabilities, the live ones)
Winner = tuple[float, int | None, Calibrator, dict[str, Any] | None, np.ndarray, np.ndarray]


def candidates(own: Live, registry: Registry, model: str, segment: str, kind: str,
               skip_upto: int = -1
               ) -> list[tuple[int | None, Calibrator, dict[str, Any] | None]]:
    """The identity (unless live) and the newest earlier versions that differ from the
    live one, newest first; none up to ``skip_upto`` (a class reset set them aside)."""
    cands: list[tuple[int | None, Calibrator, dict[str, Any] | None]] = []
    if own.doc.get("method") != "identity":
        cands.append((None, IdentityCalibrator(kind), None))
    for ver in sorted(registry.versions(model, segment), reverse=True):
        if len(cands) > ROLLBACK_VERSIONS:
            break
        if ver == own.version or ver <= skip_upto:
            continue  # the live one, or one scoring a class count reset since
        try:
            earlier = registry.read(model, segment, ver)
            cal = load(earlier)
        except (CalibratorError, OSError):
            continue
        if earlier.get("method") == "identity" or (
                earlier.get("method"), earlier.get("params")) == (
                own.doc.get("method"), own.doc.get("params")):
            continue
        cands.append((ver, cal, earlier))
    return cands


def best_rollback(own: Live, registry: Registry, model: str, segment: str, post: SampleSet,
                  alpha: float, spacing: float, log_threshold: float, *,
                  skip_upto: int = -1) -> Winner | None:
    """The winning candidate on ``post``, or None."""
    kind = input_kind(post)
    x = scores_as(post, kind)
    labels = post.label.astype(np.int64)
    live_probs = apply_or_identity(own.calibrator, x, kind)
    nll_live = per_sample_nll(live_probs, labels)
    cands = candidates(own, registry, model, segment, kind, skip_upto)
    if not cands:
        return None
    need = math.log(len(cands) / alpha)
    best: Winner | None = None
    for v, cal, doc in cands:
        probs = apply_or_identity(cal, x, kind)
        gain = float((nll_live - per_sample_nll(probs, labels)).sum())
        if gain < need or (best is not None and gain <= best[0]):
            continue
        check = Detector.new(None, spacing)
        p, y = confidence_and_correct(probs, labels)
        check.update(p, y, log_threshold, tilt_log_lr(probs, labels), ts=post.ts)
        if not check.alarmed:
            best = (gain, v, cal, doc, probs, live_probs)
    return best


def rollback_document(model: str, segment: str, fitted_at: str, change_ts: float | None,
                      best: Winner, post: SampleSet, bins: int
                      ) -> tuple[dict[str, Any], Evaluation, Evaluation]:
    """The winner's new document (``trigger: rollback``, ``rollback_of`` its version,
    null for the identity), with the live calibrator's and its own evaluation on
    ``post``."""
    _gain, version, cal, old, probs, live_probs = best
    kind = input_kind(post)
    labels = post.label.astype(np.int64)
    before, after = evaluate(live_probs, labels, bins), evaluate(probs, labels, bins)
    fit = {"samples": 0, "holdout_samples": len(post), "holdout_before": before.as_dict(),
           "holdout_after": after.as_dict()}
    meta = {"fitted_at": fitted_at, "trigger": "rollback", "rollback_of": version,
            "change_ts": change_ts, "fit": fit}
    if old is None:
        doc = cal.to_json(model=model, segment=segment,
                          reference=reference_counts(scores_as(post, kind), kind, bins), **meta)
    else:
        doc = {k: v for k, v in old.items() if k not in ("version", "signature")} | meta
    return doc, before, after
