"""Before the labels: what the pending predictions and the score histogram say.

Two label-free readings per model, segment and window (contract section 2):

- over the predictions still waiting for their label (they live in the join, so
  they are checkpointed with it): how many, the accuracy they will show and, for
  binary models, their positive rate, read through the series' estimation map, else
  the live calibrator, else the raw scores (``estimating``; NannyML's CBPE kept
  current). Like CBPE they assume P(y | score) as learned still holds: under a concept
  shift they are wrong until labels show it;
- over every admitted prediction, joined or not: the population stability index
  of the raw confidences against a reference histogram (the live calibrator's
  fit data, else the window of the same length just before). ``ScoreHist``
  keeps those counts in buckets like ``windows.Windows``, for two window lengths.

The engine knows nothing of calibrator documents: readers pass a mapping
(model, segment) -> (apply, reference), where ``apply(scores, kind)`` maps raw
scores of a kind in ``records.SCORE_KINDS`` to calibrated probabilities ((n,)
P(y=1) or (n, K)) and ``reference`` holds the B bin counts the calibrator was
fitted on, or None.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from calmon.config import Window
from calmon.engine.windows import BUCKETS, BucketTables, bin_index

Apply = Callable[[np.ndarray, str], np.ndarray]
LiveCalibrators = Mapping[tuple[str, str], tuple[Apply, "np.ndarray | None"]]
PSI_FLOOR = 1e-4  # a share of 0 would make the index infinite


BASES = ("series", "model", "last", "live", "raw")  # what an estimate was read through


@dataclass(frozen=True)
class Estimates:
    """The label-free numbers of one (model, segment, window). v5: the band of the
    estimated accuracy and the two sums that combine instances (the expected number
    right of the pending predictions and its variance), and what they were read
    through: ``estimate_basis`` (one of ``BASES``), the labelled samples behind the
    map used and the newest prediction ts among them."""

    pending_samples: int = 0
    estimated_accuracy: float | None = None
    estimated_positive_rate: float | None = None
    score_psi: float | None = None
    estimated_accuracy_lower: float | None = None
    estimated_accuracy_upper: float | None = None
    estimated_correct: float | None = None
    estimated_correct_variance: float | None = None
    estimate_basis: str = "raw"
    estimate_fit_samples: int = 0
    estimate_fit_newest_ts: float | None = None

    def as_row(self) -> dict[str, float | int | str | None]:
        return {"pending_samples": self.pending_samples,
                "estimated_accuracy": self.estimated_accuracy,
                "estimated_positive_rate": self.estimated_positive_rate,
                "score_psi": self.score_psi,
                "estimated_accuracy_lower": self.estimated_accuracy_lower,
                "estimated_accuracy_upper": self.estimated_accuracy_upper,
                "estimate_basis": self.estimate_basis,
                "estimate_fit_samples": self.estimate_fit_samples,
                "estimate_fit_newest_ts": self.estimate_fit_newest_ts}


ESTIMATE_NAMES = ("pending_samples", "estimated_accuracy", "estimated_positive_rate",
                  "score_psi", "estimated_accuracy_lower", "estimated_accuracy_upper",
                  "estimate_basis", "estimate_fit_samples", "estimate_fit_newest_ts")


def psi(current: np.ndarray, reference: np.ndarray) -> float | None:
    """sum_b (c_b - r_b) ln(c_b / r_b) over shares floored at ``PSI_FLOOR``; None when
    either histogram is empty."""
    nc, nr = float(current.sum()), float(reference.sum())
    if nc <= 0 or nr <= 0:
        return None
    c = np.maximum(current / nc, PSI_FLOOR)
    r = np.maximum(reference / nr, PSI_FLOOR)
    return float(np.sum((c - r) * np.log(c / r)))


class ScoreHist(BucketTables):
    """Per series and window length W: counts of raw confidences in the B equal-width
    bins, in buckets of W / BUCKETS, kept for 2 W (the window and the one before it)."""

    keep = 2 * BUCKETS

    def __init__(self, windows: tuple[Window, ...], bins: int) -> None:
        self.bins = bins
        super().__init__(windows, bins)

    def add(self, sid: np.ndarray, ts: np.ndarray, conf: np.ndarray,
            now: float | np.ndarray) -> None:
        if len(sid) == 0:
            return
        self.touched.update(np.unique(sid).tolist())
        b = bin_index(conf, self.bins)
        for w, width in enumerate(self.widths):
            bucket = np.floor(ts / width).astype(np.int64)
            keep = bucket > self.current(w, now) - 2 * BUCKETS
            if not keep.any():
                continue
            bk = bucket[keep]
            lo = int(bk.min())
            self._lower(w, lo)
            span = int(bk.max()) - lo + 1
            key = sid[keep] * span + (bk - lo)
            size = int(key.max()) + 1
            if size <= 1 << 16:  # small key space: a bincount instead of a sort
                keys = np.flatnonzero(np.bincount(key, minlength=size))
                remap = np.zeros(size, np.int64)
                remap[keys] = np.arange(len(keys))
                inv = remap[key]
            else:
                keys, inv = np.unique(key, return_inverse=True)
            counts = np.bincount(inv * self.bins + b[keep], minlength=len(keys) * self.bins)
            # as sparse entries (every group holds one at least), merged like the windows'
            at = np.flatnonzero(counts)
            group, pos = np.divmod(at, self.bins)
            starts = np.flatnonzero(np.concatenate(([True], group[1:] != group[:-1])))
            self._merge(self._data[w], (keys // span).tolist(), (keys % span + lo).tolist(),
                        starts, pos, counts[at])

    def counts(self, sid: int, w: int, now: float, previous: bool = False) -> np.ndarray:
        """The window's counts, or with ``previous`` those of the window just before."""
        cur = self.current(w, now) - (BUCKETS if previous else 0)
        out = np.zeros(self.bins, np.int64)
        for idx, cell in self._data[w].get(sid, {}).items():
            if cur - BUCKETS < idx <= cur:
                self._accumulate(out, cell)
        return out

    def since(self, sid: int, since: float, now: float) -> np.ndarray | None:
        """Counts of the predictions in the buckets that start at or after ``since``, up to
        ``now``'s (those of the bucket holding ``since`` are left out: not all of them
        are newer), read from the shortest window that still keeps those buckets; None
        when none reaches back that far."""
        for w in sorted(range(len(self.widths)), key=lambda i: self.widths[i]):
            first, cur = math.ceil(since / self.widths[w]), self.current(w, now)
            if first <= cur - self.keep:
                continue
            out = np.zeros(self.bins, np.int64)
            for idx, cell in self._data[w].get(sid, {}).items():
                if first <= idx <= cur:
                    self._accumulate(out, cell)
            return out
        return None
