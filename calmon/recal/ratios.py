"""The detectors' log-likelihood ratios, shared between a model's series in a check.

``detect.log_lr`` is elementwise in (p, y), and its ``logaddexp`` per alternative and
sample is the largest part of a detector update. With per-segment recalibration every
sample is in two series, its segment's and the model's ``__all__``, and both score it
the same way when the segment has no calibrator of its own (or the same one): the
model's detector would compute ratios its segments' detectors computed moments before
in the same check (segments are checked first). ``SharedRatios`` keeps the segments'
ratios of the check and hands the model's detector those of the pairs it finds there,
by the exact bits of p and the side of y; an elementwise function gives a pair the same
floats in any array, so the detector is the same to the last bit.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from calmon.recal.detect import log_lr

FEW = 16  # a batch this small costs less to compute than to look up


class SharedRatios:
    """``log_lr(p, y)`` of one check's series, a model's after its segments'."""

    def __init__(self) -> None:
        self.kept: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # (p, y, ratios)
        self.cals: list[Any] = []  # the calibrator each kept batch was scored with

    def of(self, p: np.ndarray, y: np.ndarray, cal: Any, whole: bool) -> np.ndarray:
        """The ratios of (p, y), scored with ``cal`` (None: as given): a segment's
        (``whole`` False) computed and kept, the model's read from the kept ones scored
        with the same calibrator (only those can hold its pairs) where they have them."""
        kept = [k for k, c in zip(self.kept, self.cals) if c is cal] if whole else []
        if not kept or len(p) < FEW:
            ll = log_lr(p, y)
            if not whole:
                self.kept.append((np.asarray(p, dtype=np.float64), np.asarray(y), ll))
                self.cals.append(cal)
            return ll
        p = np.asarray(p, dtype=np.float64)
        kp = np.concatenate([k[0] for k in kept])
        if np.signbit(kp).any() or np.signbit(p).any():  # the key needs the sign bit
            return log_lr(p, y)
        keys = _key(kp, np.concatenate([k[1] for k in kept]))
        order = keys.argsort(kind="stable")
        keys = keys[order]
        want = _key(p, y)
        at = np.minimum(keys.searchsorted(want), len(keys) - 1)
        hit = keys[at] == want
        cols = order[at]
        ratios = np.concatenate([k[2] for k in kept], axis=1)
        if hit.all():
            out: np.ndarray = ratios[:, cols]
            return out
        out = np.empty((len(ratios), len(p)))
        out[:, hit] = ratios[:, cols[hit]]
        miss = ~hit
        out[:, miss] = log_lr(p[miss], np.asarray(y)[miss])
        return out


def _key(p: np.ndarray, y: np.ndarray) -> np.ndarray:
    """What log_lr reads of a pair: the bits of p (sign bit clear) and y > 0.5."""
    pos = (np.asarray(y, dtype=np.float64) > 0.5).astype(np.uint64)
    out: np.ndarray = (p.view(np.uint64) << np.uint64(1)) | pos
    return out
