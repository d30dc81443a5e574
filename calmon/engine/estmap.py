"""The estimation map: label-free estimates that hold when the scores are off.

Each series keeps one map from the raw confidence (binary: P(y=1) as reported;
multiclass: top-label confidence) to the frequency observed on its labelled samples
(binary: of y = 1; multiclass: of a correct top label): the isotonic regression of
their fine-bin counts, as scikit-learn's ``IsotonicRegression(out_of_bounds="clip",
y_min=0, y_max=1)`` fits the bins' mean confidences weighted by their counts and
predicts by linear interpolation between them (held flat outside). The pending
predictions, kept as fine-bin counts too, are read through it, so an estimate costs
O(fine_bins) per series and window, whatever is pending. This is CBPE (NannyML) with
its reference kept current: it assumes P(y | score) as learned still holds, and cannot
see a concept shift until labels show it.

The band counts two errors of the estimated number correct S = sum_i q_i, q_i each
pending prediction's map value for its decision (binary: g for a decided positive, 1 - g
for a decided negative):

- the pending predictions are finitely many: Var = sum_i q_i (1 - q_i) (the variance of
  a Poisson-binomial count);
- the map is itself an estimate: each isotonic block (a level set of the fit, value v
  over N labelled samples) carries a binomial variance v (1 - v) / N, which reaches S
  through the interpolation weights of the predictions read off that block.

Pure numpy; no state. The fit runs pool-adjacent-violators on a stack of series at once
(``fit_stack``): each pass pools every maximal decreasing run of adjacent blocks, which
converges to the unique isotonic solution whatever the order of pooling.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

TIE = 1e-12  # adjacent block values closer than this are one level set


@dataclass(frozen=True)
class Fit:
    """An isotonic fit of one series' labelled fine bins."""

    x: np.ndarray  # (P,) the non-empty fine bins' mean confidences, increasing
    y: np.ndarray  # (P,) the fitted frequency at each, non-decreasing in [0, 1]
    block: np.ndarray  # (P,) int64: the level set each point belongs to, 0..blocks-1
    weight: np.ndarray  # (blocks,) labelled samples behind each level set

    @property
    def samples(self) -> int:
        return round(float(self.weight.sum()))

    def value(self) -> np.ndarray:
        """Each level set's fitted value."""
        out = np.empty(len(self.weight))
        out[self.block] = self.y
        return out


def fit_stack(count: np.ndarray, conf: np.ndarray, correct: np.ndarray) -> list[Fit | None]:
    """The isotonic fit of each row of (S, F) fine-bin sums (count, summed confidence,
    summed correct); None for a row with no samples."""
    count = np.asarray(count, np.float64)
    rows, cols = np.nonzero(count > 0)  # row-major: each row's bins in increasing order
    out: list[Fit | None] = [None] * len(count)
    if len(rows) == 0:
        return out
    w = count[rows, cols]
    x = np.asarray(conf, np.float64)[rows, cols] / w
    y = np.asarray(correct, np.float64)[rows, cols] / w
    fitted = _pava(y, w, rows)
    fitted = np.clip(fitted, 0.0, 1.0)  # y_min, y_max (already inside: frequencies)
    # level sets: a new one where the row or the fitted value changes
    new = np.ones(len(rows), bool)
    new[1:] = (rows[1:] != rows[:-1]) | (fitted[1:] - fitted[:-1] > TIE)
    set_of = np.cumsum(new) - 1
    weight = np.bincount(set_of, w)
    bounds = np.flatnonzero(np.concatenate(([True], rows[1:] != rows[:-1], [True])))
    for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
        first = set_of[a]
        out[int(rows[a])] = Fit(x[a:b], fitted[a:b], set_of[a:b] - first,
                                weight[first:set_of[b - 1] + 1])
    return out


def _pava(y: np.ndarray, w: np.ndarray, group: np.ndarray) -> np.ndarray:
    """Weighted pool-adjacent-violators of each group (consecutive runs of ``group``):
    the non-decreasing fit minimising sum w (fit - y)^2, per point."""
    swy, sw = y * w, w.astype(np.float64)
    size = np.ones(len(y), np.int64)
    grp = group
    while True:
        mean = swy / sw
        pool = (mean[:-1] > mean[1:]) & (grp[:-1] == grp[1:])
        if not pool.any():
            return np.repeat(mean, size)
        starts = np.flatnonzero(np.concatenate(([True], ~pool)))
        swy = np.add.reduceat(swy, starts)
        sw = np.add.reduceat(sw, starts)
        size = np.add.reduceat(size, starts)
        grp = grp[starts]


@dataclass(frozen=True)
class Side:
    """Pending predictions of one decision, as fine-bin counts: how many in each fine
    bin and their summed raw confidence. ``flip``: they are right when y = 0 (a binary
    model's decided negatives), so each counts 1 - g."""

    count: np.ndarray  # (F,)
    conf: np.ndarray  # (F,) summed confidence
    flip: bool = False
    bins: np.ndarray | None = None  # the fine bin of each entry, when only some are held


@dataclass(frozen=True)
class Reading:
    """What a map says of pending predictions: their number, the expected number right
    and (binary) of positives, and the two variances of the band."""

    pending: int
    correct: float
    positive: float | None
    variance_pending: float  # sum q (1 - q): their finite number
    variance_fit: float  # the map's own error, 0 when read raw or through a calibrator

    @property
    def variance(self) -> float:
        return self.variance_pending + self.variance_fit

    @property
    def accuracy(self) -> float | None:
        return self.correct / self.pending if self.pending else None

    @property
    def positive_rate(self) -> float | None:
        return None if self.positive is None or not self.pending else self.positive / self.pending

    def band(self, level: float) -> tuple[float | None, float | None]:
        """The normal band at ``level`` for the accuracy they will realize, in [0, 1]."""
        if not self.pending:
            return None, None
        z = NormalDist().inv_cdf(0.5 + level / 2)
        half = z * math.sqrt(max(self.variance, 0.0)) / self.pending
        acc = self.correct / self.pending
        return max(0.0, acc - half), min(1.0, acc + half)


def read(fit: Fit | None, sides: list[Side], binary: bool) -> Reading:
    """The pending predictions of ``sides`` read through ``fit`` (None: their raw
    confidence, the identity map with no fit error). Each fine bin's predictions take
    the map's value at their mean confidence."""
    pending = 0
    correct = positive = var_p = 0.0
    reach = None if fit is None else np.zeros(len(fit.weight))
    for side in sides:
        nz = np.flatnonzero(side.count > 0)
        if not len(nz):
            continue
        n = np.asarray(side.count, np.float64)[nz]
        m = np.asarray(side.conf, np.float64)[nz] / n
        g = m if fit is None else np.interp(m, fit.x, fit.y)
        q = 1.0 - g if side.flip else g
        pending += round(float(n.sum()))
        correct += float(n @ q)
        positive += float(n @ g)
        var_p += float(n @ (q * (1.0 - q)))
        if fit is not None and reach is not None:
            _reach(fit, m, -n if side.flip else n, reach)
    var_f = 0.0
    if fit is not None and reach is not None:
        v = fit.value()
        var_f = float(np.sum(reach * reach * v * (1.0 - v) / fit.weight))
    return Reading(pending, correct, positive if binary else None, var_p, var_f)


def _reach(fit: Fit, m: np.ndarray, n: np.ndarray, out: np.ndarray) -> None:
    """Add to ``out`` each level set's weight in the signed sum sum n g(m): g(m)
    interpolates between the two fitted points around m (one outside the ends)."""
    x = fit.x
    hi = np.searchsorted(x, m, side="right")  # first point above m
    lo = np.clip(hi - 1, 0, len(x) - 1)
    hi = np.clip(hi, 0, len(x) - 1)
    span = x[hi] - x[lo]
    t = np.where(span > 0, (m - x[lo]) / np.where(span > 0, span, 1.0), 0.0)
    t = np.clip(t, 0.0, 1.0)
    np.add.at(out, fit.block[lo], n * (1.0 - t))
    np.add.at(out, fit.block[hi], n * t)


def read_values(q: np.ndarray, p1: np.ndarray | None) -> Reading:
    """Pending predictions read one by one (through a live calibrator): ``q`` each one's
    probability of being right, ``p1`` (binary) of y = 1. No fit error is counted."""
    q = np.asarray(q, np.float64)
    return Reading(len(q), float(q.sum()),
                   None if p1 is None else float(np.asarray(p1, np.float64).sum()),
                   float(np.sum(q * (1.0 - q))), 0.0)
