"""The newest regime inside the post-change samples (issue 34: "before a publish, a
CUSUM inside the post-change samples so only the newest regime is fitted").

The change-time search dates the FIRST change since the live calibrator; when the
stream changed again since (a drift that reverted, a second step), a fit on every
post-change sample averages two regimes and suits neither. Before a refit, a candidate
of the configured method (``isotonic`` for ``auto``: it absorbs any fixed map, so only
a change in time is left to find) is fitted on all of them and the e-detector
(calmon.recal.detect.newest_regime) runs over them in prediction time against it, one
look at the series' threshold; when it alarms, the samples predicted from the late end
of its change-time set on are the newest regime, and the refit takes only those,
provided they are at least ``min_samples`` (else all: a refit never waits for this).
"""

from __future__ import annotations

import logging

import numpy as np

from calmon.engine.buffer import SampleSet
from calmon.engine.metrics import confidence_and_correct
from calmon.errors import CalibratorError
from calmon.recal.detect import TILTS, newest_regime, tilt_log_lr
from calmon.recal.refit import MIN_FIT, fit_one, input_kind, scores_as

log = logging.getLogger(__name__)

MAX_TILT_CELLS = 4_000_000


def newest(post: SampleSet, method: str, bins: int, log_threshold: float, spacing: float,
           need: int) -> SampleSet:
    """The samples of ``post`` in its newest regime when a later change shows inside it
    and leaves at least ``need`` of them; else ``post`` itself."""
    if len(post) <= max(need, 2 * MIN_FIT):  # no cut could leave need and drop any
        return post
    kind = input_kind(post)
    x = scores_as(post, kind)
    labels = post.label.astype(np.int64)
    try:
        cand = fit_one("isotonic" if method == "auto" else method, x, labels, kind, bins, None)
    except CalibratorError:
        return post
    probs = cand.apply(x)
    p, y = confidence_and_correct(probs, labels)
    # the one-class tilts too while their (4 K, n) ratios stay small (K = 100 at 10,000)
    tilt = tilt_log_lr(probs, labels) if probs.size * len(TILTS) <= MAX_TILT_CELLS else None
    start = newest_regime(p, y, post.ts, log_threshold, spacing, tilt)
    if start is None:
        return post
    mine = post.ts >= start
    kept = int(mine.sum())
    if kept < need:
        return post
    log.info("a newer regime inside %d post-change samples: the %d predicted from %.0f on "
             "are fitted", len(post), kept, start)
    return post.select(mine)
