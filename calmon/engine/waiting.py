"""Labels waiting for their prediction, as compact columns (up to ``join.max_pending``).

A waiting label is needed for its class, its time and its deadline; its record's bytes
and source only for a dead letter, when it turns out to be out of range for the
prediction it meets, and a label 0 or 1 never is (every model has at least two
classes). So a label 0/1 costs its id (the dict key), its row number and three column
entries (~420 bytes with a 256-byte id, README "Worst case"), where a ``Label`` object
with its bytes cost ~1,000; a label 2 or more, possible only where ``limits.max_classes``
is over 2 (the parsers reject a label past it on arrival), or a class name (v5), keeps
its ``Label`` whole.

Insertion order is arrival order (a dict's), so the oldest label is the first key:
it is the one evicted past ``join.max_pending``, as before.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import numpy as np

from calmon.engine.records import Label

INF = math.inf
GROWTH = 1.25


class WaitingLabels:
    """id -> (Label, deadline) for the join, held as columns."""

    def __init__(self, rows: int = 16) -> None:
        self._row: dict[str, int] = {}  # arrival order
        self._id: list[str | None] = [None] * rows  # row -> its label's id, for ``expire``
        self._label = np.zeros(rows, np.int8)  # 0/1; a rare label's is in _rare
        self._ts = np.zeros(rows)  # NaN: the label had none
        self._deadline = np.full(rows, INF)  # INF: undated (or a free row)
        self._free = np.arange(rows - 1, -1, -1, dtype=np.int64)  # a stack of free rows
        self._top = rows  # free rows: _free[:_top]
        self._rare: dict[int, Label] = {}  # row -> the whole label, for labels >= 2
        self.has = self._row.__contains__  # ``in``, at C speed for a map over a batch

    def __len__(self) -> int:
        return len(self._row)

    def __contains__(self, lid: object) -> bool:
        return lid in self._row

    def __iter__(self) -> Iterator[str]:
        return iter(self._row)

    def deadline(self, lid: str) -> float | None:
        row = self._row.get(lid)
        return None if row is None else float(self._deadline.item(row))

    def __setitem__(self, lid: str, item: tuple[Label, float]) -> None:
        lab, deadline = item
        if isinstance(lab.label, str) or lab.label >= 2:  # a name (v5) or a rare class
            self._put(lid, 0, lab.ts, deadline, lab)
        else:
            self._put(lid, lab.label, lab.ts, deadline, None)

    def _put(self, lid: str, label: int, ts: float | None, deadline: float,
             whole: Label | None) -> None:
        row = self._row.get(lid)
        if row is None:
            if not self._top:
                self._grow()
            self._top -= 1
            row = self._row[lid] = int(self._free.item(self._top))
            self._id[row] = lid
        self._rare.pop(row, None)
        if whole is not None:
            self._rare[row] = whole
        self._label[row] = label if whole is None else 0  # 0: nothing of a row's last use
        self._ts[row] = math.nan if ts is None else ts
        self._deadline[row] = deadline

    def get(self, lid: str) -> tuple[Label, float]:
        """The label (a label 0/1 without its record's bytes and source) and deadline."""
        row = self._row[lid]
        out = self._rare.get(row)
        if out is None:
            ts = self._ts.item(row)
            out = Label(lid, int(self._label.item(row)), None if ts != ts else ts, None)
        return out, float(self._deadline.item(row))

    def pop(self, lid: str) -> tuple[Label, float]:
        out = self.get(lid)
        row = self._row.pop(lid)
        self._rare.pop(row, None)
        self._free_rows([row])
        return out

    def __delitem__(self, lid: str) -> None:
        self.pop(lid)

    def _free_rows(self, rows: list[int]) -> None:
        self._deadline[rows] = INF  # what ``expire`` reads: a free row is never due
        for row in rows:
            self._id[row] = None
        self._free[self._top:self._top + len(rows)] = rows
        self._top += len(rows)

    def _grow(self) -> None:
        n = len(self._ts)
        new = max(16, int(n * GROWTH))
        self._label = np.concatenate([self._label, np.zeros(new - n, np.int8)])
        self._ts = np.concatenate([self._ts, np.zeros(new - n)])
        self._deadline = np.concatenate([self._deadline, np.full(new - n, INF)])
        self._id.extend([None] * (new - n))
        free = np.empty(new, np.int64)
        free[:new - n] = np.arange(new - 1, n - 1, -1)
        self._free, self._top = free, new - n

    def date(self, deadline: float) -> None:
        """Undated labels (none came before the first prediction) get ``deadline``."""
        rows = np.fromiter(self._row.values(), np.int64, len(self._row))
        d = self._deadline[rows]
        self._deadline[rows] = np.where(d == INF, deadline, d)

    def expire(self, now: float) -> tuple[int, float]:
        """Drop the labels whose deadline is ``now`` or past; returns how many, and the
        next deadline of those left. Two passes over the deadline column (free rows are
        INF) and a step per label dropped: cheap enough for ``join.max_pending`` to call
        it at a record (``JoinCapacity._make_label_room``)."""
        if not self._row:
            return 0, INF
        gone = np.flatnonzero(self._deadline <= now).tolist()
        if gone:
            ids, row_of, rare = self._id, self._row, self._rare
            for row in gone:
                del row_of[ids[row]]  # type: ignore[arg-type]
                rare.pop(row, None)
            self._free_rows(gone)
        return len(gone), float(self._deadline.min()) if self._row else INF

    # ------------------------------------------------------------ checkpoints

    def snapshot(self) -> dict[str, Any]:
        """Columns in arrival order (ids, label, ts, deadline) and the labels kept whole
        as [position, label, ts, model, raw, source]: a checkpoint holds no object per
        label either."""
        rows = np.fromiter(self._row.values(), np.int64, len(self._row))
        rare = [[i, lab.label, lab.ts, lab.model, lab.raw, lab.source]
                for i, row in enumerate(rows.tolist()) if (lab := self._rare.get(row))]
        return {"ids": list(self._row), "label": self._label[rows], "ts": self._ts[rows],
                "deadline": self._deadline[rows], "rare": rare}

    def restore(self, snap: Any) -> tuple[float, bool]:
        """From ``snapshot`` (or the list of [id, label, ts, model, raw, source,
        deadline] checkpoints held before); returns the next deadline and whether a
        label is undated. Raises on a malformed section (the checkpoint is unusable)."""
        if isinstance(snap, list):  # before issue 35
            for lid, label, ts, model, raw, source, d in snap:
                lab = Label(lid, int(label), ts, model, raw, source)
                self[lid] = (lab, float(d))
        else:
            ids, ts, d = snap["ids"], np.asarray(snap["ts"], np.float64), snap["deadline"]
            label = np.asarray(snap["label"], np.int64)
            if not len(ids) == len(label) == len(ts) == len(d) or not set(
                    label.tolist()) <= {0, 1} or not all(type(i) is str for i in ids):
                raise ValueError("join.labels: columns of different lengths or kinds")
            whole = {int(i): Label(ids[int(i)], lab if isinstance(lab, str) else int(lab), t,
                                   model, raw, source)
                     for i, lab, t, model, raw, source in snap["rare"]}
            for i, (lid, lab, t, dl) in enumerate(zip(ids, label.tolist(), ts.tolist(),
                                                      np.asarray(d, float).tolist())):
                w = whole.get(i)
                self._put(lid, lab if w is None else 0, None if t != t else t, dl, w)
        deadlines = self._deadline[np.fromiter(self._row.values(), np.int64, len(self._row))]
        return (float(deadlines.min()) if len(deadlines) else INF), bool((deadlines == INF).any())
