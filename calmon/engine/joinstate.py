"""The join's state (``JoinState``: what ``Join.__init__`` sets up, see ``calmon.engine.join``)
and what every part of the join shares: the slot columns and their storage, a pending
prediction's model, deadline and class count, and ``_finish``, which settles one."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np

from calmon.config import JoinConfig
from calmon.engine.decisions import no_names
from calmon.engine.idindex import IdIndex
from calmon.engine.joined import _E, _EI, _NO_BATCH, JoinEvents
from calmon.engine.records import MULTICLASS
from calmon.engine.waiting import WaitingLabels

NAN, INF = math.nan, math.inf  # plain floats: no numpy attribute lookups per record
ROW_SHIFT = 2**20  # a K-class slot's score column holds row * ROW_SHIFT + K
GROWTH = 1.25  # slot columns grow by a quarter: little slack, copies stay amortised O(1)
COLUMNS_FROM = 2000  # records in a batch from which run_all decides over columns


class JoinState:
    """The state of a ``Join`` and its shared steps."""

    def __init__(self, cfg: JoinConfig, capacity_hint: int = 1024) -> None:
        self.ttl = cfg.ttl
        self.label_ttl = cfg.label_ttl
        self.max_pending = cfg.max_pending
        self.implicit = cfg.missing_label
        self.columns_from = COLUMNS_FROM  # records: smaller batches go one by one
        # event time: per model index (the engine's), and the largest of all
        self.nows: list[float] = []
        self.clock = -INF
        self.combo_model = _EI  # combo -> model index, set by the engine before a batch
        self._pm: list[int | None] = []  # the batch's model index by prediction ordinal
        self._counts: list[int] = []  # pending per model, kept while _heaps is not None
        self._dirty: set[int] = set()  # models whose now moved since their heap was settled
        n = max(16, min(capacity_hint, cfg.max_pending))
        # pending predictions: those of earlier batches in the index (slot), and for
        # the batch being run, its ids that were found there plus its own predictions
        # pending so far (~p) in a small dict, which the per-record loop reads
        self._pid: list[str | None] = [None] * n  # slot -> id
        self._index = IdIndex(self._pid)
        self._slot: dict[str, int] = {}
        self._fresh = 0  # the ~p entries of _slot
        self._found = _EI  # prepare's slot of each prediction id, then label id (-1: none)
        self._ts = np.full(n, INF)  # INF marks a free slot (and makes its deadline INF)
        self._score = np.zeros(n)  # binary: as given; K-class: row * ROW_SHIFT + K
        self._combo = np.zeros(n, np.int32)
        self._kind = np.zeros(n, np.int8)
        self._decision = np.full(n, -1, np.int32)  # v5: the prediction's own (-1: none)
        self.class_index: Callable[[int, str], int] = no_names  # v5: names, by the engine
        self._free: list[int] = list(range(n - 1, -1, -1))
        # implicit negatives: a binary prediction's label that came before ts + after
        self._held: dict[int, tuple[int, float]] = {}  # slot -> (label, label ts or NaN)
        self._mats: dict[int, np.ndarray] = {}  # K -> one row per pending K-class score
        self._mat_free: dict[int, list[int]] = {}
        self._next_deadline = INF
        self._labels = WaitingLabels()  # labels waiting for their prediction (waiting.py)
        self._next_label_deadline = INF
        self._undated_labels = False  # labels waiting for the first prediction to start a clock
        # ids already joined, so a late second label is a duplicate: id -> deadline
        self._done: dict[str, float] = {}
        self._done_order: deque[str] = deque()
        # ids whose tombstone, past its time, went when the id was admitted again: how
        # many of their entries (the first ones) in _done_order no longer stand for one
        self._stale: dict[str, int] = {}
        self._batch = _NO_BATCH
        self._ids: list[str] = []
        self._labels_of_batch = (_EI, _E)
        # per model: pending predictions by deadline and by ts, kept only near
        # join.max_pending (with _counts)
        self._heaps: dict[int, tuple[list[Any], list[tuple[float, str]]]] | None = None
        self.events = JoinEvents()
        self._begin()

    def _begin(self) -> None:
        """Per-batch bookkeeping, reset after each stage of a batch's end."""
        self._freed: list[int] = []  # slots freed this batch: reusable from the next
        # what joined: the prediction (source), and the batch's label ordinal that joined
        # it, or ~i for the i-th join no label of the batch made (its label in _x_*)
        self._j_src: list[int] = []
        self._j_q: list[int] = []
        self._x_label: list[int] = []
        self._x_lts: list[float | None] = []
        self._met_src: list[int] = []  # labels that met a prediction without joining it
        self._exp: list[tuple[int, str]] = []  # (src, reason)

    @property
    def pending(self) -> int:
        """Pending predictions, at any point of a batch."""
        return self._index.used - len(self._freed) + self._fresh

    @property
    def pending_labels(self) -> int:
        return len(self._labels)

    def joined_so_far(self) -> int:
        """Samples joined by the batch's records so far (the sweep's come after)."""
        return len(self._j_src)

    def add_model(self, midx: int) -> None:
        """A model admitted at index ``midx`` (new, or a dropped model's index reused)."""
        while len(self.nows) <= midx:
            self.nows.append(-INF)
        self.nows[midx] = -INF

    def _model_of(self, v: int) -> int:
        """The model index of the pending prediction ``v`` (a slot, or ``~p``)."""
        if v >= 0:
            return int(self.combo_model[self._combo.item(v)])
        return self._pm[~v]  # type: ignore[return-value]

    def _now_of(self, v: int) -> float:
        return self.nows[self._model_of(v)]

    def _after(self, kind: int) -> float:
        """How long a prediction of this kind waits: ttl, or the implicit-negative delay."""
        return self.implicit.after if self.implicit is not None and kind < MULTICLASS else self.ttl

    def _deadline(self, v: int) -> float:
        """The deadline of the pending prediction ``v`` (a slot, or ``~p``)."""
        if v >= 0:
            return float(self._ts.item(v)) + self._after(self._kind.item(v))
        return float(self._batch.ts.item(~v)) + self._after(int(self._batch.kind.item(~v)))

    def _classes(self, v: int, p_kind: list[int], p_classes: list[int]) -> int:
        """How many classes the pending prediction ``v`` has (2 for binary)."""
        if v < 0:
            return 2 if p_kind[~v] < MULTICLASS else p_classes[~v]
        if self._kind.item(v) < MULTICLASS:
            return 2
        return int(self._score.item(v)) % ROW_SHIFT

    def _ts_of(self, v: int) -> float:
        return float(self._ts.item(v)) if v >= 0 else float(self._batch.ts.item(~v))

    def _lookup(self, pid: str) -> int | None:
        """Where the pending prediction ``pid`` is (a slot, or ``~p``), or None: for ids
        the batch does not name (the heaps near join.max_pending)."""
        v = self._slot.get(pid)
        if v is None:
            u = self._index.find_one(pid)  # a slot freed this batch has no id: not found
            v = u if u >= 0 else None
        return v

    def _emit_other(self, v: int, label: int, label_ts: float | None) -> None:
        """A join no label made just now (a waiting label met its prediction, or a
        deadline passed)."""
        self._j_q.append(~len(self._x_label))
        self._j_src.append(v)
        self._x_label.append(label)
        self._x_lts.append(label_ts)

    def _trim_done(self) -> None:
        """Past ``join.max_pending`` joined ids, the oldest tombstones go."""
        while len(self._done) > self.max_pending and self._done_order:
            pid = self._done_order.popleft()
            if not self._was_stale(pid):
                self._done.pop(pid, None)

    def _remembered(self, pid: str, now: float) -> bool:
        """Whether a prediction of ``pid`` is a duplicate of a joined one; a tombstone
        past its time goes (``_drop_tombstone``)."""
        d = self._done.get(pid)
        if d is None:
            return False
        if d > now:
            return True
        self._drop_tombstone(pid)
        return False

    def _drop_tombstone(self, pid: str) -> None:
        """An id admitted again after its tombstone's time: the tombstone goes now, not
        when its entry in the order comes up, so that entry cannot take the tombstone
        of the id's next join with it, whatever the sweeps between (the poll
        boundaries) have already dropped."""
        del self._done[pid]
        self._stale[pid] = self._stale.get(pid, 0) + 1

    def _was_stale(self, pid: str) -> bool:
        """The entry of ``pid`` just taken from the front of the order was a stale one."""
        n = self._stale.get(pid)
        if n is None:
            return False
        if n == 1:
            del self._stale[pid]
        else:
            self._stale[pid] = n - 1
        return True

    def _finish(self, v: int, pid: str) -> None:
        """Settle a pending prediction (a slot, or ``~p``) whose deadline passed: joined
        with its held label, its implicit label, or expired by ttl. Frees the slot."""
        if self._heaps is not None:
            self._counts[self._model_of(v)] -= 1
        if v >= 0:
            kind = self._kind.item(v)
            ts = self._ts.item(v)
        else:
            kind = int(self._batch.kind.item(~v))
            ts = self._batch.ts.item(~v)
        early = self._held.pop(v, None)
        if early is None and self.implicit is not None and kind < MULTICLASS:
            early = (self.implicit.value, NAN)
        if early is None:
            self._exp.append((v, "ttl"))
        else:
            self._emit_other(v, early[0], early[1])
            self._done[pid] = ts + self.ttl
            self._done_order.append(pid)
            self._trim_done()
        self._slot.pop(pid, None)  # the sweep settles ids the batch did not name
        if v >= 0:
            self._pid[v] = None
            self._freed.append(v)
        else:
            self._fresh -= 1

    def _grow(self) -> None:
        n = len(self._ts)
        m = max(n + 16, int(n * GROWTH))
        for name, fill in (("_ts", INF), ("_score", 0.0), ("_combo", 0), ("_kind", 0),
                           ("_decision", -1)):
            old = getattr(self, name)
            new = np.full(m, fill, old.dtype)
            new[:n] = old
            setattr(self, name, new)
        self._pid.extend([None] * (m - n))
        self._free[:0] = range(m - 1, n - 1, -1)  # used after the slots free already

    def _vec_put(self, vec: np.ndarray) -> float:
        """Store a K-class row; returns the slot's score-column code for it."""
        k = len(vec)
        free = self._mat_free.setdefault(k, [])
        if not free:  # the matrix of this K grows
            old = self._mats.get(k)
            rows = 0 if old is None else len(old)
            new = np.zeros((max(16, int(rows * GROWTH)), k))
            if old is not None:
                new[:rows] = old
            self._mats[k] = new
            free.extend(range(len(new) - 1, rows - 1, -1))
        row = free.pop()
        self._mats[k][row] = vec
        return float(row * ROW_SHIFT + k)

    def _vec_of(self, slot: int) -> np.ndarray:
        code = int(self._score.item(slot))
        out: np.ndarray = self._mats[code % ROW_SHIFT][code // ROW_SHIFT]
        return out

    def _slot_nows(self) -> np.ndarray:
        """Each slot's model's now (free slots: any)."""
        nows = np.asarray(self.nows, np.float64)
        if not len(nows):
            return np.full(len(self._ts), -INF)
        out: np.ndarray = nows[self.combo_model[self._combo]]
        return out

    def _deadlines(self) -> np.ndarray:
        if self.implicit is None:
            out: np.ndarray = self._ts + self.ttl
            return out
        return self._ts + np.where(self._kind < MULTICLASS, self.implicit.after, self.ttl)
