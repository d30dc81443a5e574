"""Bucketed rolling counts per series, by prediction event time.

Each configured window of length W is a ring of ``BUCKETS`` buckets of width
W / BUCKETS; bucket ``i`` holds samples with ``floor(ts / width) == i``. With
``cur = floor(now / width)``, the window holds buckets ``cur - BUCKETS < i <= cur``,
so it slides in steps of one bucket and spans between W - width and W. Memory
per series is bounded by the bucket count, whatever the event rate, and buckets
are allocated only when a sample lands in them.

A bucket is one int64 vector (see ``Layout``). Sums of confidences, Brier and
NLL terms are kept in fixed point (``CONF_SCALE``, ``NLL_SCALE``), so they are
exact integers: the state after any interleaving of the same samples is
bit-identical, which is what makes restarts after a crash exactly-once. The
rounding is below 2**-33 per confidence and 2**-31 per NLL term, far inside the
contract's 1e-9.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from calmon.config import Window

BUCKETS = 16
CONF_SCALE = float(2**32)  # confidence and Brier terms (<= 2)
NLL_SCALE = float(2**30)  # NLL terms (<= -log 1e-15 ~ 34.5)


@dataclass(frozen=True)
class Layout:
    """Offsets into a bucket vector: coarse bins, fine bins, then three scalars."""

    bins: int
    fine_bins: int

    @property
    def count(self) -> int:
        return 0

    @property
    def conf(self) -> int:
        return self.bins

    @property
    def correct(self) -> int:
        return 2 * self.bins

    @property
    def fcount(self) -> int:
        return 3 * self.bins

    @property
    def fconf(self) -> int:
        return 3 * self.bins + self.fine_bins

    @property
    def fcorrect(self) -> int:
        return 3 * self.bins + 2 * self.fine_bins

    @property
    def acc(self) -> int:
        return 3 * self.bins + 3 * self.fine_bins

    @property
    def brier(self) -> int:
        return self.acc + 1

    @property
    def nll(self) -> int:
        return self.acc + 2

    @property
    def size(self) -> int:
        return self.acc + 3


def bin_index(conf: np.ndarray, bins: int) -> np.ndarray:
    """Right-closed equal-width bins, exactly as scikit-learn's ``calibration_curve``:
    bin i holds (i/B, (i+1)/B], bin 0 also holds 0."""
    inner = _EDGES.get(bins)
    if inner is None:
        inner = _EDGES[bins] = np.linspace(0.0, 1.0, bins + 1)[1:-1].copy()
    return np.searchsorted(inner, conf, side="left")


_EDGES: dict[int, np.ndarray] = {}


@dataclass
class Samples:
    """Per-sample values of one batch, already fanned out to series."""

    sid: np.ndarray  # int64 series ids
    ts: np.ndarray  # float64 prediction event time
    conf: np.ndarray  # float64 confidence (binary: P(y=1); multiclass: top-label)
    correct: np.ndarray  # 0/1 (binary: y; multiclass: argmax == y)
    acc: np.ndarray  # 0/1 accuracy
    brier: np.ndarray  # float64 Brier term
    nll: np.ndarray  # float64 NLL term


def in_window(ts: np.ndarray, seconds: float, now: float) -> np.ndarray:
    """Which of these prediction times the window of ``seconds`` holds at ``now``: the
    samples of its last BUCKETS buckets, exactly as a window's row counts them. The one
    definition of window membership (the recalibration loop reads samples with it)."""
    width = seconds / BUCKETS
    out: np.ndarray = np.floor(ts / width) > math.floor(now / width) - BUCKETS
    return out


class BucketTables:
    """Per window length W, per series: int64 vectors in buckets of W / BUCKETS of event
    time. ``keep`` buckets are kept (the window itself, or more); the subclasses say
    what a vector holds and how it is read back."""

    keep = BUCKETS

    def __init__(self, windows: tuple[Window, ...], width: int) -> None:
        self.windows = windows
        self.widths = [w.seconds / BUCKETS for w in windows]
        self._width = width  # the length of one vector
        # [window][series] -> {bucket index: int64 vector}
        self._data: list[dict[int, dict[int, np.ndarray]]] = [{} for _ in windows]

    def current(self, w: int, now: float) -> int:
        return math.floor(now / self.widths[w]) if math.isfinite(now) else -(2**62)

    def evict(self, now: float) -> None:
        """Drop buckets that slid out of what is kept, and series left empty."""
        for w in range(len(self.windows)):
            floor_ = self.current(w, now) - self.keep
            tab = self._data[w]
            for sid in list(tab):
                buckets = tab[sid]
                for idx in [i for i in buckets if i <= floor_]:
                    del buckets[idx]
                if not buckets:
                    del tab[sid]

    def forget(self, sids: list[int]) -> None:
        """Drop everything kept for these series (a model's class count was reset)."""
        for tab in self._data:
            for sid in sids:
                tab.pop(sid, None)

    def series(self) -> set[int]:
        """Series with data in at least one window (call ``evict`` first)."""
        out: set[int] = set()
        for tab in self._data:
            out.update(tab)
        return out

    def snapshot(self) -> list[Any]:
        out = []
        for tab in self._data:
            items = [(sid, idx, vec) for sid, buckets in tab.items()
                     for idx, vec in buckets.items()]
            if items:
                keys = np.array([(a, b) for a, b, _ in items], dtype=np.int64)
                vecs = np.stack([v for _, _, v in items])
            else:
                keys = np.zeros((0, 2), np.int64)
                vecs = np.zeros((0, self._width), np.int64)
            out.append({"keys": keys, "vecs": vecs})
        return out

    def restore(self, snap: list[Any]) -> None:
        self._data = [{} for _ in self.windows]
        for tab, part in zip(self._data, snap):
            for (sid, idx), vec in zip(part["keys"].tolist(), part["vecs"]):
                tab.setdefault(sid, {})[idx] = vec.astype(np.int64).copy()


class Windows(BucketTables):
    """All windows of all series; read back as float64 totals per (series, window)."""

    def __init__(self, windows: tuple[Window, ...], bins: int, fine_bins: int) -> None:
        self.layout = Layout(bins, fine_bins)
        super().__init__(windows, self.layout.size)

    def add(self, s: Samples, now: float) -> None:
        if len(s.sid) == 0:
            return
        lay = self.layout
        size = lay.size
        b = bin_index(s.conf, lay.bins)
        f = bin_index(s.conf, lay.fine_bins)
        confq = np.rint(s.conf * CONF_SCALE)
        correct = s.correct.astype(np.float64)
        nw = len(self.widths)
        bkt = [np.floor(s.ts / width).astype(np.int64) for width in self.widths]
        keeps = [b_ > self.current(w, now) - BUCKETS for w, b_ in enumerate(bkt)]
        all_kept = all(k.all() for k in keeps)
        # one joint partition (series, bucket in every window) when it packs in an int64:
        # the dense per-group sums are then computed once for all windows
        key = s.sid.astype(np.int64)
        span = int(key.max()) + 1
        bases = []
        spans = []
        for b_ in bkt:
            lo = int(b_.min())
            bases.append(lo)
            width_b = int(b_.max()) - lo + 1
            spans.append(width_b)
            span *= width_b
            key = key * width_b + (b_ - lo)
        if not all_kept or span >= 2**62:
            # (m, 9) column offsets and weights, identical for every window
            cols = np.stack([b + lay.count, b + lay.conf, b + lay.correct,
                             f + lay.fcount, f + lay.fconf, f + lay.fcorrect,
                             np.full_like(b, lay.acc), np.full_like(b, lay.brier),
                             np.full_like(b, lay.nll)], axis=1)
            weights = np.stack([np.ones_like(confq), confq, correct,
                                np.ones_like(confq), confq, correct,
                                s.acc.astype(np.float64), np.rint(s.brier * CONF_SCALE),
                                np.rint(s.nll * NLL_SCALE)], axis=1)
            self._add_per_window(s, cols, weights, bkt, keeps, size)
            return
        if span <= 1 << 16:  # small key space: bincount instead of a sort
            present = np.bincount(key, minlength=span) > 0
            groups = np.flatnonzero(present)
            remap = np.zeros(span, np.int64)
            remap[groups] = np.arange(len(groups))
            inv = remap[key]
        else:
            groups, inv = np.unique(key, return_inverse=True)
        # decode (sid, bucket per window) from the group keys
        gb = []
        rest = groups
        for b_lo, width_b in zip(reversed(bases), reversed(spans)):
            rest, r = np.divmod(rest, width_b)
            gb.append(r + b_lo)
        gb.reverse()
        rows = self._group_rows(len(groups), inv, b, f, confq, correct, s)
        gsid = rest.tolist()
        for w in range(nw):
            series_tab = self._data[w]
            for g, idx, row in zip(gsid, gb[w].tolist(), rows):
                buckets = series_tab.get(g)
                if buckets is None:
                    buckets = series_tab[g] = {}
                vec = buckets.get(idx)
                if vec is None:
                    buckets[idx] = row.copy()
                else:
                    vec += row

    def _group_rows(self, ngroups: int, inv: np.ndarray, b: np.ndarray, f: np.ndarray,
                    confq: np.ndarray, correct: np.ndarray, s: Samples) -> np.ndarray:
        """(groups, size) int64 sums, one small bincount per column kind (no dense
        (samples x 9) stacks, no float64 (groups x size) intermediate)."""
        lay = self.layout
        rows = np.empty((ngroups, lay.size), np.int64)
        kb = inv * lay.bins + b
        nb = ngroups * lay.bins
        rows[:, lay.count:lay.count + lay.bins] = np.bincount(kb, minlength=nb).reshape(ngroups, -1)
        rows[:, lay.conf:lay.conf + lay.bins] = np.bincount(kb, confq, nb).reshape(ngroups, -1)
        rows[:, lay.correct:lay.correct + lay.bins] = np.bincount(kb, correct, nb).reshape(
            ngroups, -1)
        kf = inv * lay.fine_bins + f
        nf = ngroups * lay.fine_bins
        rows[:, lay.fcount:lay.fcount + lay.fine_bins] = np.bincount(kf, minlength=nf).reshape(
            ngroups, -1)
        rows[:, lay.fconf:lay.fconf + lay.fine_bins] = np.bincount(kf, confq, nf).reshape(
            ngroups, -1)
        rows[:, lay.fcorrect:lay.fcorrect + lay.fine_bins] = np.bincount(kf, correct, nf).reshape(
            ngroups, -1)
        rows[:, lay.acc] = np.bincount(inv, s.acc, ngroups)
        rows[:, lay.brier] = np.bincount(inv, np.rint(s.brier * CONF_SCALE), ngroups)
        rows[:, lay.nll] = np.bincount(inv, np.rint(s.nll * NLL_SCALE), ngroups)
        return rows

    def _add_per_window(self, s: Samples, cols: np.ndarray, weights: np.ndarray,
                        bkt: list[np.ndarray], keeps: list[np.ndarray], size: int) -> None:
        """The general path (samples too old for some window, or a huge bucket span)."""
        # sorted once by (series, ts): then every window's buckets form contiguous runs
        order = np.lexsort((s.ts, s.sid))
        sid_all = s.sid[order]
        cols, weights = cols[order], weights[order]
        for w in range(len(self.widths)):
            bucket, keep = bkt[w][order], keeps[w][order]
            if not keep.all():  # too old for this window: it would be evicted at once
                if not keep.any():
                    continue
                sid, bucket, c, wt = sid_all[keep], bucket[keep], cols[keep], weights[keep]
            else:
                sid, c, wt = sid_all, cols, weights
            change = (sid[1:] != sid[:-1]) | (bucket[1:] != bucket[:-1])
            first = np.flatnonzero(np.concatenate(([True], change)))
            inv = np.cumsum(np.concatenate(([0], change)))  # group of each sample
            n_groups = len(first)
            flat = (inv * size)[:, None] + c
            # float64 sums of integers stay exact below 2**53: batches are far smaller
            sums = np.bincount(flat.ravel(), wt.ravel(), minlength=n_groups * size)
            rows = sums.reshape(n_groups, size).astype(np.int64)
            series_tab = self._data[w]
            for g_sid, idx, row in zip(sid[first].tolist(), bucket[first].tolist(), rows):
                buckets = series_tab.setdefault(g_sid, {})
                vec = buckets.get(idx)
                if vec is None:
                    buckets[idx] = row.copy()  # not a view: that would pin the whole batch
                else:
                    vec += row

    def totals(self, sid: int, w: int, now: float) -> np.ndarray | None:
        """The window's summed vector as float64 (fixed point not yet undone), or None."""
        buckets = self._data[w].get(sid)
        if not buckets:
            return None
        floor_ = self.current(w, now) - BUCKETS
        vecs = [buckets[i] for i in sorted(buckets) if i > floor_]
        if not vecs:
            return None
        # summed in bucket order as float64: deterministic, and no int64 overflow
        out: np.ndarray = np.sum(np.asarray(vecs, dtype=np.float64), axis=0)
        return out
