"""The segment guard (contract section 6, v2 "Segments"): a model-level refit is not
published when it makes a segment with ``min_samples`` post-change samples, which
would be served it, significantly worse than what that segment has now."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from calmon.calibrators import Calibrator
from calmon.config import RecalibrationConfig
from calmon.engine.buffer import SampleSet
from calmon.engine.series import ALL
from calmon.recal.calibrated import SamplesOf
from calmon.recal.refit import (
    Guard,
    apply_or_identity,
    input_kind,
    per_sample_nll,
    scores_as,
    significantly_better,
)
from calmon.recal.registry import Live


def segment_guards(rc: RecalibrationConfig, served: Callable[[str, str], Live | None],
                   live_of: Callable[[str, str], Live | None], model: str, post: SampleSet,
                   keys: list[tuple[str, str]], samples_of: SamplesOf,
                   change_ts: float | None) -> tuple[Guard, ...]:
    """One guard per segment of ``model`` without a calibrator of its own (so it would be
    served the model's new one; ``served``: a series' own live calibrator) and with
    ``min_samples`` post-change samples: the
    candidate must not be significantly worse than what it has now on that segment's
    samples of the holdout period."""
    ts = np.sort(post.ts)
    hold_start = float(ts[len(ts) - round(len(ts) * rc.holdout_fraction)]) if len(
        ts) else math.inf
    since = -math.inf if change_ts is None else change_ts
    guards = []
    for m, seg in keys:
        if m != model or seg == ALL or served(m, seg) is not None:
            continue
        s = samples_of(m, seg, None)
        if s is None or int((s.ts >= since).sum()) < rc.min_samples:
            continue
        hold = s.select(s.ts >= hold_start)
        if len(hold) < 2:
            continue
        guards.append(_guard(seg, hold, live_of(m, ALL), rc.alpha))
    return tuple(guards)


def _guard(segment: str, hold: SampleSet, current: Live | None, alpha: float) -> Guard:
    kind = input_kind(hold)
    x = scores_as(hold, kind)
    labels = hold.label.astype(np.int64)
    now_nll = per_sample_nll(
        apply_or_identity(None if current is None else current.calibrator, x, kind), labels)

    def check(cand: Calibrator) -> str | None:
        new_nll = per_sample_nll(apply_or_identity(cand, x, kind), labels)
        if significantly_better(new_nll, now_nll, alpha):  # i.e. the candidate is worse
            return f"makes segment {segment} significantly worse"
        return None

    return check
