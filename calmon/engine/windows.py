"""Bucketed rolling counts per series, by prediction event time.

Each configured window of length W is a ring of ``BUCKETS`` buckets of width
W / BUCKETS; bucket ``i`` holds samples with ``floor(ts / width) == i``. With
``cur = floor(now / width)``, the window holds buckets ``cur - BUCKETS < i <= cur``,
so it slides in steps of one bucket and spans between W - width and W. Memory
per series is bounded by the bucket count, whatever the event rate, and buckets
are allocated only when a sample lands in them.

A bucket is one int64 vector (see ``Layout``), stored sparsely while few of its
entries are nonzero (``BucketTables``): a bucket with one sample costs about 250
bytes, not the 24 KB of its dense vector, and a full one no more than that. Sums of
confidences, Brier and NLL terms are kept in fixed point (``CONF_SCALE``,
``NLL_SCALE``), so they are exact integers: the state after any interleaving of the
same samples is bit-identical, which is what makes restarts after a crash exactly-once. The
rounding is below 2**-33 per confidence and 2**-31 per NLL term, far inside the
contract's 1e-9.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from calmon.config import Window
from calmon.engine import sweep
from calmon.names import BUCKETS as BUCKETS  # re-exported: older imports

CONF_SCALE = float(2**32)  # confidence and Brier terms (<= 2)
NLL_SCALE = float(2**30)  # NLL terms (<= -log 1e-15 ~ 34.5)
# a batch's per-group sums are dense rows up to this many entries (8 MiB), else sparse
DENSE_ROWS = 1 << 20


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
    what a vector holds and how it is read back.

    A bucket (a "cell") is stored sparsely while few of its entries are nonzero: an
    int64 array of shape (2, nnz), positions (ascending) over values; past half the
    vector's length, as the dense vector itself (shape (size,)), which costs less. Every
    entry only ever grows (all terms are non-negative), so whether a cell is dense is a
    function of the samples it holds, never of how they were batched; and a read adds a
    sparse cell's values exactly as it would the dense vector's, so the numbers are the
    same either way."""

    keep = BUCKETS

    def __init__(self, windows: tuple[Window, ...], width: int) -> None:
        self.windows = windows
        self.widths = [w.seconds / BUCKETS for w in windows]
        self._width = width  # the length of one vector
        self._dense_at = max(1, width // 2)  # nonzero entries from which a cell is dense
        # [window][series] -> {bucket index: cell}
        self._data: list[dict[int, dict[int, np.ndarray]]] = [{} for _ in windows]
        # series written since the group-mode changelog last took them (tasklog)
        self.touched: set[int] = set()
        # per window, the floors of the last eviction pass (calmon.engine.sweep)
        self._swept: list[Any] = [None] * len(windows)
        # per window, at most the lowest bucket index held (inf: none; -inf: unknown)
        self._low: list[float] = [math.inf] * len(windows)

    def current(self, w: int, now: Any) -> Any:
        """The bucket holding ``now``: an int, or an int64 array for an array of nows
        (event time is per model: each sample or series goes by its model's now)."""
        if isinstance(now, np.ndarray):
            width = self.widths[w]
            out = np.full(now.shape, -(2**62), np.int64)
            ok = np.isfinite(now)
            out[ok] = np.floor(now[ok] / width)
            return out
        return math.floor(now / self.widths[w]) if math.isfinite(now) else -(2**62)

    # ------------------------------------------------------------ cells

    def _from_dense(self, row: np.ndarray) -> np.ndarray:
        """A new cell holding this (fresh, owned) dense vector."""
        nz = row.nonzero()[0]  # row is 1-d: flatnonzero's positions, without its wrappers
        if len(nz) >= self._dense_at:
            return row
        cell = np.empty((2, len(nz)), row.dtype)  # np.stack((nz, row[nz])), in two writes
        cell[0] = nz
        cell[1] = row[nz]
        return cell

    def _add_row(self, buckets: dict[int, np.ndarray], idx: int, row: np.ndarray) -> None:
        """Add a dense int64 vector into bucket ``idx`` (``row`` is not kept)."""
        cell = buckets.get(idx)
        if cell is None:
            buckets[idx] = self._from_dense(row.copy())  # a copy: never a view of a batch
        elif cell.ndim == 1:
            cell += row
        else:
            dense = row.copy()
            dense[cell[0]] += cell[1]
            buckets[idx] = self._from_dense(dense)

    def _merge(self, tab: dict[int, dict[int, np.ndarray]], gsid: list[int],
               gidx: list[int], starts: np.ndarray, pos: np.ndarray, val: np.ndarray) -> None:
        """Add group j's sparse entries (``pos``/``val`` from ``starts[j]`` to the next
        group's start, positions ascending) into bucket ``gidx[j]`` of series
        ``gsid[j]``; several groups may share a bucket. The buckets already held
        sparsely are merged in one sort, not one by one."""
        ends = [*starts[1:].tolist(), len(pos)]
        slot_of: dict[tuple[int, int], int] = {}  # a held sparse bucket -> its slot
        held: list[np.ndarray] = []
        slots = np.full(len(gsid), -1, np.int64)  # group -> slot, or -1
        entries = np.stack((pos, val))  # a new sparse cell: a copy of its columns
        for j, (sid, idx, a, z) in enumerate(zip(gsid, gidx, starts.tolist(), ends)):
            buckets = tab.get(sid)
            if buckets is None:
                buckets = tab[sid] = {}
            cell = buckets.get(idx)
            if cell is None:
                buckets[idx] = (entries[:, a:z].copy() if z - a < self._dense_at
                                else self._canonical(pos[a:z], val[a:z]))
            elif cell.ndim == 1:
                cell[pos[a:z]] += val[a:z]
            else:
                slot = slot_of.get((sid, idx))
                if slot is None:
                    slot = slot_of[(sid, idx)] = len(held)
                    held.append(cell)
                slots[j] = slot
        if not held:
            return
        size = self._width
        lens = np.fromiter((c.shape[1] for c in held), np.int64, len(held))
        old = np.concatenate(held, axis=1)
        counts = np.diff(np.append(starts, len(pos)))
        entry_slot = np.repeat(slots, counts)
        mine = entry_slot >= 0
        key = np.concatenate((np.repeat(np.arange(len(held)), lens) * size + old[0],
                              entry_slot[mine] * size + pos[mine]))
        values = np.concatenate((old[1], val[mine]))
        order = np.argsort(key, kind="stable")
        key, values = key[order], values[order]
        first = np.flatnonzero(np.concatenate(([True], key[1:] != key[:-1])))
        sums = np.add.reduceat(values, first)  # int64: exact
        cell_slot, at = np.divmod(key[first], size)
        cuts = np.flatnonzero(np.concatenate(([True], cell_slot[1:] != cell_slot[:-1])))
        merged = np.stack((at, sums))
        for (sid, idx), a, z in zip(slot_of, cuts.tolist(), [*cuts[1:].tolist(), len(at)]):
            # copies: a view would keep the whole merged array alive
            tab[sid][idx] = (merged[:, a:z].copy() if z - a < self._dense_at
                             else self._canonical(at[a:z], sums[a:z]))

    @staticmethod
    def _accumulate(out: np.ndarray, cell: np.ndarray) -> None:
        """out += the cell's vector (out may be float64: the same additions either way)."""
        if cell.ndim == 1:
            out += cell
        else:
            out[cell[0]] += cell[1]

    def _dense(self, cell: np.ndarray) -> np.ndarray:
        if cell.ndim == 1:
            return cell
        out = np.zeros(self._width, np.int64)
        out[cell[0]] = cell[1]
        return out

    # ------------------------------------------------------------ upkeep

    def evict(self, now: float | np.ndarray) -> None:
        """Drop buckets that slid out of what is kept, and series left empty. ``now``:
        one for all, or each series' own (by series id). See ``calmon.engine.sweep``."""
        sweep.evict(self, now)

    def _lower(self, w: int, lo: int) -> None:
        """Buckets from ``lo`` on are being added to window ``w`` (``sweep``'s bound)."""
        self._low[w] = min(self._low[w], lo)

    def pop(self, w: int, sid: int, idx: int) -> np.ndarray | None:
        """Remove one bucket of one series and return its vector as float64 (None when
        it holds nothing): for a table whose buckets are read one by one."""
        buckets = self._data[w].get(sid)
        cell = None if buckets is None else buckets.pop(idx, None)
        self.touched.add(sid)
        if buckets is not None and not buckets:
            del self._data[w][sid]
        if cell is None:
            return None
        out = np.zeros(self._width)
        self._accumulate(out, cell)
        return out

    def forget(self, sids: list[int]) -> None:
        """Drop everything kept for these series (a model's class count was reset)."""
        self.touched.update(sids)
        self._swept = [None] * len(self.windows)  # a series id may come back
        for tab in self._data:
            for sid in sids:
                tab.pop(sid, None)

    def series(self) -> set[int]:
        """Series with data in at least one window (call ``evict`` first)."""
        out: set[int] = set()
        for tab in self._data:
            out.update(tab)
        return out

    def cells(self) -> int:
        """How many buckets are held, over every window and series."""
        return sum(len(b) for tab in self._data for b in tab.values())

    # ------------------------------------------------------------ snapshots

    def snapshot(self) -> list[Any]:
        """Every held bucket as a dense vector: ``{"keys": (n, 2) [series, bucket],
        "vecs": (n, size)}`` per window (for inspection; a checkpoint uses ``pack``)."""
        out = []
        for tab in self._data:
            items = [(sid, idx, cell) for sid, buckets in tab.items()
                     for idx, cell in buckets.items()]
            if items:
                keys = np.array([(a, b) for a, b, _ in items], dtype=np.int64)
                vecs = np.stack([self._dense(v) for _, _, v in items])
            else:
                keys = np.zeros((0, 2), np.int64)
                vecs = np.zeros((0, self._width), np.int64)
            out.append({"keys": keys, "vecs": vecs})
        return out

    def pack(self, only: Iterable[int] | None = None) -> list[dict[str, np.ndarray]]:
        """Per window, the held buckets in (series, bucket) order, the sparse ones as CSR
        (``keys`` (n, 2), ``nnz`` (n,), ``pos``, ``val``), the dense ones as rows
        (``dense_keys`` (m, 2), ``dense`` (m, size)): a few bytes per nonzero entry.
        ``only``: these series alone (a changelog section)."""
        pos_type = np.uint16 if self._width <= 1 << 16 else np.int32
        out = []
        for tab in self._data:
            sids: list[int] = []
            idxs: list[int] = []
            cells: list[np.ndarray] = []
            for sid in sorted(tab) if only is None else sorted(s for s in only if s in tab):
                buckets = tab[sid]
                for idx in sorted(buckets):
                    sids.append(sid)
                    idxs.append(idx)
                    cells.append(buckets[idx])
            keys = np.array([sids, idxs], np.int64).T.reshape(-1, 2)
            dense = np.fromiter((c.ndim == 1 for c in cells), bool, len(cells))
            scells = [c for c in cells if c.ndim == 2]
            dcells = [c for c in cells if c.ndim == 1]
            flat = (np.concatenate(scells, axis=1) if scells
                    else np.zeros((2, 0), np.int64))
            out.append({
                "keys": np.ascontiguousarray(keys[~dense]),
                "nnz": np.fromiter((c.shape[1] for c in scells), np.int64, len(scells)),
                "pos": flat[0].astype(pos_type), "val": flat[1].copy(),
                "dense_keys": np.ascontiguousarray(keys[dense]),
                "dense": (np.stack(dcells) if dcells
                          else np.zeros((0, self._width), np.int64)),
            })
        return out

    def restore(self, snap: list[Any]) -> None:
        """From ``pack`` (or the dense ``keys``/``vecs`` of checkpoint format 1)."""
        self._data = [{} for _ in self.windows]
        self.touched.clear()
        self._swept = [None] * len(self.windows)
        self._low = [-math.inf] * len(self.windows)  # the next (full) pass finds it
        for tab, part in zip(self._data, snap):
            if "vecs" in part:  # format 1: every bucket dense
                for (sid, idx), vec in zip(part["keys"].tolist(), part["vecs"]):
                    tab.setdefault(sid, {})[idx] = self._from_dense(vec.astype(np.int64))
                continue
            pos = np.asarray(part["pos"]).astype(np.int64)
            val = np.asarray(part["val"], np.int64)
            nnz = np.asarray(part["nnz"], np.int64)
            if (len(pos) != len(val) or int(nnz.sum()) != len(pos) or (nnz < 0).any()
                    or len(nnz) != len(part["keys"])
                    or (len(pos) and (pos.min() < 0 or pos.max() >= self._width))):
                raise ValueError("bucket table: sparse cells do not fit their layout")
            ends = np.cumsum(nnz).tolist()
            start = 0
            for (sid, idx), end in zip(part["keys"].tolist(), ends):
                tab.setdefault(sid, {})[idx] = self._canonical(pos[start:end], val[start:end])
                start = end
            for (sid, idx), vec in zip(part["dense_keys"].tolist(), part["dense"]):
                tab.setdefault(sid, {})[idx] = self._from_dense(vec.astype(np.int64))

    def check(self, n_series: int) -> None:
        """After ``restore``: every cell belongs to a series id below ``n_series`` and has
        this table's width, so a restored (checksum-valid but hostile) state cannot make
        a later read index past an array. Raises ValueError."""
        for tab in self._data:
            for sid, buckets in tab.items():
                if type(sid) is not int or not 0 <= sid < n_series:
                    raise ValueError(f"bucket table: series {sid!r} is not one of {n_series}")
                for idx, cell in buckets.items():
                    if type(idx) is not int:
                        raise ValueError(f"bucket table: bucket {idx!r} is not an integer")
                    dense = cell.ndim == 1 and cell.shape[0] == self._width
                    if not dense and not (cell.ndim == 2 and cell.shape[0] == 2):
                        raise ValueError(f"bucket table: a cell of shape {cell.shape}")

    def _canonical(self, pos: np.ndarray, val: np.ndarray) -> np.ndarray:
        """A fresh cell from stored positions and values (dense when that many)."""
        if len(pos) >= self._dense_at:
            dense = np.zeros(self._width, np.int64)
            dense[pos] = val
            return dense
        cell = np.empty((2, len(pos)), np.int64)  # np.stack((pos, val)), in two writes
        cell[0] = pos
        cell[1] = val
        return cell


class Windows(BucketTables):
    """All windows of all series; read back as float64 totals per (series, window)."""

    def __init__(self, windows: tuple[Window, ...], bins: int, fine_bins: int) -> None:
        self.layout = Layout(bins, fine_bins)
        super().__init__(windows, self.layout.size)
        # each called with every batch of samples added (replay --every reads them)
        self.taps: list[Callable[[Samples], None]] = []

    def add(self, s: Samples, now: float | np.ndarray) -> None:
        """Add samples; ``now``: one for all, or each sample's own (its model's)."""
        if len(s.sid) == 0:
            return
        self.touched.update(np.unique(s.sid).tolist())
        for tap in self.taps:
            tap(s)
        lay = self.layout
        b = bin_index(s.conf, lay.bins)
        f = bin_index(s.conf, lay.fine_bins)
        confq = np.rint(s.conf * CONF_SCALE)
        correct = s.correct.astype(np.float64)
        nw = len(self.widths)
        bkt = [np.floor(s.ts / width).astype(np.int64) for width in self.widths]
        keeps = [b_ > self.current(w, now) - BUCKETS for w, b_ in enumerate(bkt)]
        all_kept = all(k.all() for k in keeps)
        # one joint partition (series, bucket in every window) when it packs in an int64:
        # the per-group sums are then computed once for all windows
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
            self._add_per_window(s, b, f, confq, correct, bkt, keeps)
            return
        for w, lo in enumerate(bases):
            self._lower(w, lo)
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
        gsid = rest.tolist()
        if len(groups) * lay.size <= DENSE_ROWS:  # few groups (busy series): dense sums
            rows = self._group_rows(len(groups), inv, b, f, confq, correct, s)
            for w in range(nw):
                series_tab = self._data[w]
                for g, idx, row in zip(gsid, gb[w].tolist(), rows):
                    buckets = series_tab.get(g)
                    if buckets is None:
                        buckets = series_tab[g] = {}
                    self._add_row(buckets, idx, row)
            return
        # many groups (a fleet of sparse series): only the entries the samples touch
        starts, pos, val = self._group_entries(inv, b, f, confq, correct, s)
        for w in range(nw):
            self._merge(self._data[w], gsid, gb[w].tolist(), starts, pos, val)

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

    def _group_entries(self, inv: np.ndarray, b: np.ndarray, f: np.ndarray,
                       confq: np.ndarray, correct: np.ndarray,
                       s: Samples) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The groups' sums as sparse entries: (first entry of each group, positions,
        int64 values), groups in order, positions ascending within each, zeros left out.
        Every group holds at least one entry (its count)."""
        lay = self.layout
        cols = np.stack([b + lay.count, b + lay.conf, b + lay.correct,
                         f + lay.fcount, f + lay.fconf, f + lay.fcorrect,
                         np.full_like(b, lay.acc), np.full_like(b, lay.brier),
                         np.full_like(b, lay.nll)], axis=1)
        weights = np.stack([np.ones(len(b), np.int64), confq.astype(np.int64),
                            correct.astype(np.int64), np.ones(len(b), np.int64),
                            confq.astype(np.int64), correct.astype(np.int64),
                            s.acc.astype(np.int64), np.rint(s.brier * CONF_SCALE).astype(np.int64),
                            np.rint(s.nll * NLL_SCALE).astype(np.int64)], axis=1)
        key = ((inv * lay.size)[:, None] + cols).ravel()
        wt = weights.ravel()
        nonzero = wt != 0
        key, wt = key[nonzero], wt[nonzero]
        order = np.argsort(key, kind="stable")
        key, wt = key[order], wt[order]
        first = np.flatnonzero(np.concatenate(([True], key[1:] != key[:-1])))
        sums = np.add.reduceat(wt, first)  # int64: exact
        ukey = key[first]
        group, pos = np.divmod(ukey, lay.size)
        starts = np.flatnonzero(np.concatenate(([True], group[1:] != group[:-1])))
        return starts, pos, sums

    def _add_per_window(self, s: Samples, b: np.ndarray, f: np.ndarray, confq: np.ndarray,
                        correct: np.ndarray, bkt: list[np.ndarray],
                        keeps: list[np.ndarray]) -> None:
        """The general path (samples too old for some window, or a huge bucket span): each
        window's (series, bucket) groups on their own."""
        for w in range(len(self.widths)):
            keep = keeps[w]
            if not keep.any():  # too old for this window: it would be evicted at once
                continue
            rows = np.flatnonzero(keep) if not keep.all() else np.arange(len(keep))
            sid, bucket = s.sid[rows].astype(np.int64), bkt[w][rows]
            lo = int(bucket.min())
            self._lower(w, lo)
            span = int(bucket.max()) - lo + 1
            if int(sid.max()) + 1 < 2**62 // span:
                groups, inv = np.unique(sid * span + (bucket - lo), return_inverse=True)
                gsid, gidx = np.divmod(groups, span)
                gidx = gidx + lo
            else:
                pairs, inv = np.unique(np.stack([sid, bucket], axis=1), axis=0,
                                       return_inverse=True)
                gsid, gidx = pairs[:, 0], pairs[:, 1]
            inv = inv.ravel()
            part = Samples(s.sid[rows], s.ts[rows], s.conf[rows], s.correct[rows],
                           s.acc[rows], s.brier[rows], s.nll[rows])
            starts, pos, val = self._group_entries(inv, b[rows], f[rows], confq[rows],
                                                   correct[rows], part)
            self._merge(self._data[w], gsid.tolist(), gidx.tolist(), starts, pos, val)

    def totals(self, sid: int, w: int, now: float, first: int | None = None
               ) -> np.ndarray | None:
        """The window's summed vector as float64 (fixed point not yet undone), or None;
        with ``first``, of its buckets from that index on only."""
        buckets = self._data[w].get(sid)
        if not buckets:
            return None
        floor_ = self.current(w, now) - BUCKETS
        if first is not None:
            floor_ = max(floor_, first - 1)
        held = [i for i in sorted(buckets) if i > floor_]
        if not held:
            return None
        # summed in bucket order as float64: deterministic, and no int64 overflow
        out = np.zeros(self._width)
        for i in held:
            self._accumulate(out, buckets[i])
        return out

    def bucket_samples(self, sid: int, w: int, now: float, since: float = -math.inf
                       ) -> tuple[np.ndarray, np.ndarray]:
        """(indices, samples) of the window's buckets, oldest first, those that start
        before ``since`` left out: what an estimation map picks its buckets from."""
        floor_ = self.current(w, now) - BUCKETS
        if math.isfinite(since):
            floor_ = max(floor_, math.ceil(since / self.widths[w]) - 1)
        buckets = self._data[w].get(sid) or {}
        held = [i for i in sorted(buckets) if i > floor_]
        bins = self.layout.bins
        samples = [int(c[:bins].sum()) if c.ndim == 1 else int(c[1][c[0] < bins].sum())
                   for c in (buckets[i] for i in held)]
        return np.array(held, np.int64), np.array(samples, np.int64)


def dense_cells(part: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """A packed table (``BucketTables.pack``, or format 1's ``keys``/``vecs``) as (keys
    (n, 2), dense vectors (n, size)): for inspection and tests."""
    if "vecs" in part:
        return part["keys"], part["vecs"]
    size = part["dense"].shape[1]
    vecs = np.zeros((len(part["keys"]), size), np.int64)
    ends = np.cumsum(part["nnz"])
    for row, (start, end) in enumerate(zip(np.concatenate(([0], ends[:-1])), ends)):
        vecs[row, part["pos"][start:end].astype(np.int64)] = part["val"][start:end]
    return (np.concatenate([part["keys"], part["dense_keys"]]),
            np.concatenate([vecs, part["dense"]]))
