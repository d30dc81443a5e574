"""The segment guard (contract section 6, v2 "Segments"): a model-level refit is not
published when it makes a segment with ``min_samples`` post-change samples, which
would be served it, significantly worse than what that segment has now."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping

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
from calmon.recal.state import SeriesState

log = logging.getLogger(__name__)


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


def deferred(per_segment: bool, states: Mapping[tuple[str, str], SeriesState],
             served: Callable[[str, str], Live | None], model: str, segment: str,
             keys: list[tuple[str, str]]) -> bool:
    """With per_segment, a model-level refit waits while the drift looks local: in
    some slice, some but fewer than half of the values drift or have a calibrator of
    their own. Those get their own fits; a model-level fit would move the segments
    that did not drift (they keep what they had). The caller lifts the wait once the
    alarm has been latched for retry_after (a drift of every value alarms only in
    the big ones of a Zipf slice): the gate and the segment guards decide then."""
    if segment != ALL or not per_segment:
        return False
    slices: dict[tuple[str, ...], list[bool]] = {}
    for m, seg in keys:
        if m != model or seg == ALL:
            continue
        st = states.get((model, seg))
        local = (st is not None and bool(st.drifting)) or served(model, seg) is not None
        slices.setdefault(_slice_of(seg), []).append(local)
    for flags in slices.values():
        if 0 < sum(flags) < len(flags) / 2:
            log.debug("model-level refit of %r deferred: %d of %d values of a slice "
                      "drift alone", model, sum(flags), len(flags))
            return True
    return False


def _slice_of(segment: str) -> tuple[str, ...]:
    """The keys of a segment label ``k1=v1,k2=v2`` (its slice)."""
    return tuple(part.split("=", 1)[0] for part in segment.split(","))
