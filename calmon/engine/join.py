"""Pending predictions and labels: the join by id, whichever arrives first.

Event time drives everything (``now`` is the largest prediction ts seen), so a
replay is deterministic. Deadlines are checked exactly on every lookup; the
sweep that finalises or expires what nobody looked up is only garbage
collection, which is why it can run once per batch.

Pending predictions live in numpy columns indexed by a slot (``id -> slot`` is
the only per-id Python object besides the id string), which keeps a pending
prediction under ~200 bytes. Multiclass score vectors sit in a side dict.
"""

from __future__ import annotations

import math
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from calmon.config import JoinConfig
from calmon.engine.records import MULTICLASS, SCORE_KINDS, Label, Prediction

KIND_CODE = {k: i for i, k in enumerate(SCORE_KINDS)}  # field name -> int(ScoreKind)
NO_LABEL = -1
INF, NAN = math.inf, math.nan  # plain floats: no numpy attribute lookups per record
WAITING = -1  # add_label: no pending prediction (the label waits, or was a duplicate)
OUT_OF_RANGE = -2  # add_label: the label is out of range for its prediction


# One prediction that met its label (or implicit negative):
# (model, combo, ts, kind, score, label, label ts or NaN). A plain tuple, because
# appending one is the cheapest thing the per-record path can do.
Joined = tuple[int, int, float, int, Any, int, float]


@dataclass
class JoinEvents:
    """What happened since the engine last drained it."""

    joined: list[Joined] = field(default_factory=list)
    rejected_labels: list[Label] = field(default_factory=list)  # out of range at the meeting
    duplicate_predictions: int = 0
    duplicate_labels: int = 0
    expired: Counter[tuple[int, str]] = field(default_factory=Counter)  # (model, reason)
    labels_expired: int = 0
    # every admitted prediction (not duplicates), for the score histograms:
    # (model, combo, ts, kind, score)
    arrivals: list[tuple[int, int, float, int, Any]] = field(default_factory=list)


class Join:
    def __init__(self, cfg: JoinConfig, capacity_hint: int = 1024) -> None:
        self.ttl = cfg.ttl
        self.label_ttl = cfg.label_ttl
        self.max_pending = cfg.max_pending
        self.implicit = cfg.missing_label
        n = max(16, min(capacity_hint, cfg.max_pending))
        self._slot: dict[str, int] = {}
        self._ts = np.zeros(n)
        self._score = np.zeros(n)
        self._deadline = np.full(n, INF)  # inf marks a free slot
        # small ints in lists: 8 bytes a slot like numpy, but 5x faster to read one
        self._combo: list[int] = [0] * n
        self._model: list[int] = [0] * n
        self._kind: list[int] = [0] * n
        self._label: list[int] = [NO_LABEL] * n
        self._label_ts = np.full(n, NAN)
        # K-class scores: one float64 matrix per K, a row per pending prediction, so a
        # vector costs 8 K bytes and no numpy object; a slot knows its K and row
        self._vk = np.zeros(n, np.int32)  # 0: no vector
        self._vrow = np.zeros(n, np.int32)
        self._mats: dict[int, np.ndarray] = {}
        self._mat_free: dict[int, list[int]] = {}
        self._pid: list[str | None] = [None] * n  # slot -> id
        self._free: list[int] = list(range(n - 1, -1, -1))
        self._next_deadline = INF
        # labels waiting for their prediction: id -> (label, deadline)
        self._labels: dict[str, tuple[Label, float]] = {}
        self._next_label_deadline = INF
        self._undated_labels = False  # labels waiting for the first prediction to start a clock
        # ids already joined, so a late second label is a duplicate: id -> deadline
        self._done: dict[str, float] = {}
        self._done_order: deque[str] = deque()
        self.events = JoinEvents()
        self._joined = self.events.joined  # the hot path's append target

    # ------------------------------------------------------------ queries

    @property
    def pending(self) -> int:
        return len(self._slot)

    @property
    def pending_labels(self) -> int:
        return len(self._labels)

    # ------------------------------------------------------------ arrivals

    def add_prediction(self, pred: Prediction, model: int, combo: int, now: float) -> None:
        pid = pred.id
        slot = self._slot.get(pid)
        if slot is not None:
            if self._deadline.item(slot) > now:
                self.events.duplicate_predictions += 1
                return
            self._finish(slot, pid)  # overdue: settle it as the sweep would have
        done = self._done.get(pid)
        if done is not None and done > now:
            self.events.duplicate_predictions += 1
            return
        kind = KIND_CODE[pred.kind]
        ts = pred.ts
        self.events.arrivals.append((model, combo, ts, kind, pred.score))
        if self.implicit is not None and kind < MULTICLASS:
            held = True
            deadline = ts + self.implicit.after
        else:
            held = False
            deadline = ts + self.ttl
        label = NO_LABEL
        label_ts: float | None = None
        if self._labels:
            waiting = self._labels.pop(pid, None)
            if waiting is not None:
                lab, label_deadline = waiting
                if label_deadline <= now:
                    self.events.labels_expired += 1
                elif lab.label >= (2 if kind < MULTICLASS else len(pred.score)):
                    self.events.rejected_labels.append(lab)
                elif not held:
                    self._emit(model, combo, ts, kind, pred.score, lab.label, lab.ts)
                    self._mark_done(pid, ts + self.ttl)
                    return
                else:
                    label, label_ts = lab.label, lab.ts
        if not self._free:
            self._grow()
        slot = self._free.pop()
        self._slot[pid] = slot
        self._pid[slot] = pid
        self._ts[slot] = ts
        self._deadline[slot] = deadline
        self._combo[slot] = combo
        self._model[slot] = model
        self._kind[slot] = kind
        self._label[slot] = label
        if label != NO_LABEL:  # only read back when a label is attached
            self._label_ts[slot] = NAN if label_ts is None else label_ts
        if kind < MULTICLASS:
            self._score[slot] = pred.score
        else:
            self._vec_put(slot, pred.score)
        if deadline < self._next_deadline:
            self._next_deadline = deadline

    def add_label(self, lab: Label, now: float) -> int:
        """The model index of the pending prediction the label met, ``WAITING`` when
        there was none (it waits, or was a duplicate), ``OUT_OF_RANGE`` when the label is
        out of range for its prediction."""
        lid = lab.id
        slot = self._slot.get(lid)
        # nothing pending is overdue before the earliest deadline: skip the read then
        if slot is not None and now >= self._next_deadline and self._deadline.item(slot) <= now:
            self._finish(slot, lid)
            slot = None
        if slot is None:
            done = self._done.get(lid)
            if done is not None and done > now:
                self.events.duplicate_labels += 1
                return WAITING
            waiting = self._labels.get(lid)
            if waiting is not None and waiting[1] > now:
                self.events.duplicate_labels += 1
                return WAITING
            if waiting is not None:
                self.events.labels_expired += 1
            base = lab.ts if lab.ts is not None else now
            # no ts and no prediction seen yet: the clock starts with the first prediction
            deadline = base + self.label_ttl if base > -INF else INF
            self._labels[lid] = (lab, deadline)
            if deadline < self._next_label_deadline:
                self._next_label_deadline = deadline
            if deadline == INF:
                self._undated_labels = True
            return WAITING
        kind = self._kind[slot]
        if lab.label >= (2 if kind < MULTICLASS else self._vk.item(slot)):
            return OUT_OF_RANGE
        model = self._model[slot]
        if self._label[slot] != NO_LABEL:
            self.events.duplicate_labels += 1
            return model
        if self.implicit is not None and kind < MULTICLASS:
            # held until ts + after, so no window sees a positive before its negatives
            self._label[slot] = lab.label
            self._label_ts[slot] = NAN if lab.ts is None else lab.ts
            return model
        # the common case, inlined: join now and free the slot
        ts = self._ts.item(slot)
        self._joined.append((
            model, self._combo[slot], ts, kind,
            self._score.item(slot) if kind < MULTICLASS else self._vec_pop(slot), lab.label,
            NAN if lab.ts is None else lab.ts))
        self._done[lid] = ts + self.ttl
        self._done_order.append(lid)
        del self._slot[lid]
        self._pid[slot] = None
        self._deadline[slot] = INF
        self._free.append(slot)
        return model

    # ------------------------------------------------------------ settling

    def _finish(self, slot: int, pid: str) -> None:
        """Settle a pending prediction: joined with its label, its implicit label,
        or expired by ttl. Frees the slot."""
        label = self._label[slot]
        kind = self._kind[slot]
        ts = self._ts.item(slot)
        if label == NO_LABEL and self.implicit is not None and kind < MULTICLASS:
            label = self.implicit.value
            label_ts = None
        else:
            lts = self._label_ts.item(slot)
            label_ts = None if lts != lts else lts  # NaN marks unknown
        model = self._model[slot]
        if label == NO_LABEL:
            self.events.expired[(model, "ttl")] += 1
        else:
            score = self._score.item(slot) if kind < MULTICLASS else self._vec_get(slot).copy()
            self._emit(model, self._combo[slot], ts, kind, score, label, label_ts)
            self._mark_done(pid, ts + self.ttl)
        self._release(slot, pid)

    def _emit(self, model: int, combo: int, ts: float, kind: int, score: float | np.ndarray,
              label: int, label_ts: float | None) -> None:
        self.events.joined.append((model, combo, ts, kind, score, label,
                                   NAN if label_ts is None else label_ts))

    def _grow(self) -> None:
        n = len(self._ts)
        m = n * 2
        for name, fill in (("_ts", 0.0), ("_score", 0.0), ("_deadline", INF),
                           ("_label_ts", NAN)):
            old = getattr(self, name)
            new = np.full(m, fill, old.dtype)
            new[:n] = old
            setattr(self, name, new)
        for name in ("_combo", "_model", "_kind"):
            getattr(self, name).extend([0] * (m - n))
        self._label.extend([NO_LABEL] * (m - n))
        self._pid.extend([None] * (m - n))
        for name in ("_vk", "_vrow"):
            old = getattr(self, name)
            new = np.zeros(m, old.dtype)
            new[:n] = old
            setattr(self, name, new)
        self._free.extend(range(m - 1, n - 1, -1))

    def _vec_put(self, slot: int, vec: np.ndarray) -> None:
        k = len(vec)
        free = self._mat_free.setdefault(k, [])
        if not free:  # the matrix of this K doubles
            old = self._mats.get(k)
            rows = 0 if old is None else len(old)
            new = np.zeros((max(16, 2 * rows), k))
            if old is not None:
                new[:rows] = old
            self._mats[k] = new
            free.extend(range(len(new) - 1, rows - 1, -1))
        row = free.pop()
        self._mats[k][row] = vec
        self._vk[slot] = k
        self._vrow[slot] = row

    def _vec_get(self, slot: int) -> np.ndarray:
        """A view of the slot's row: copy it before the slot is released."""
        out: np.ndarray = self._mats[self._vk.item(slot)][self._vrow.item(slot)]
        return out

    def _vec_pop(self, slot: int) -> np.ndarray:
        k, row = self._vk.item(slot), self._vrow.item(slot)
        out: np.ndarray = self._mats[k][row].copy()
        self._mat_free[k].append(row)
        self._vk[slot] = 0
        return out

    def _release(self, slot: int, pid: str) -> None:
        del self._slot[pid]
        self._pid[slot] = None
        self._deadline[slot] = INF
        self._label[slot] = NO_LABEL
        if self._vk.item(slot):
            self._vec_pop(slot)
        self._free.append(slot)

    def _mark_done(self, pid: str, deadline: float) -> None:
        self._done[pid] = deadline
        self._done_order.append(pid)

    def sweep(self, now: float) -> None:
        """Settle everything whose deadline passed, then enforce the capacity bound."""
        if now >= self._next_deadline:
            due = np.flatnonzero(self._deadline <= now)
            if len(due):
                # in deadline order, so what joins is emitted in a repeatable order
                due = due[np.lexsort((self._ts[due], self._deadline[due]))]
                for slot in due.tolist():
                    self._finish(slot, self._pid[slot])  # type: ignore[arg-type]
            live = self._deadline[np.isfinite(self._deadline)]
            self._next_deadline = float(live.min()) if len(live) else INF
        if now >= self._next_label_deadline or (self._undated_labels and now > -INF):
            nxt = INF
            for lid, (lab, deadline) in list(self._labels.items()):
                if deadline == INF and now > -INF:
                    deadline = now + self.label_ttl
                    self._labels[lid] = (lab, deadline)
                if deadline <= now:
                    del self._labels[lid]
                    self.events.labels_expired += 1
                else:
                    nxt = min(nxt, deadline)
            self._next_label_deadline = nxt
            self._undated_labels = False
        while self._done_order:
            pid = self._done_order[0]
            d = self._done.get(pid)
            if d is not None and d > now and len(self._done) <= self.max_pending:
                break
            self._done_order.popleft()
            if d is not None:
                del self._done[pid]
        self._enforce_capacity()

    def _enforce_capacity(self) -> None:
        over = len(self._slot) - self.max_pending
        if over > 0:
            live = np.flatnonzero(np.isfinite(self._deadline))
            # oldest prediction ts first; ties by slot so the choice is repeatable
            oldest = live[np.lexsort((live, self._ts[live]))[:over]]
            for slot in oldest.tolist():
                self.events.expired[(self._model[slot], "capacity")] += 1
                pid = self._pid[slot]
                assert pid is not None  # a live slot always has its id
                self._release(slot, pid)
            live = self._deadline[np.isfinite(self._deadline)]
            self._next_deadline = float(live.min()) if len(live) else INF
        over = len(self._labels) - self.max_pending
        if over > 0:
            for lid in list(self._labels)[:over]:
                del self._labels[lid]
                self.events.labels_expired += 1

    def waiting(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray,
                               dict[int, Any]]:
        """Pending predictions with no label yet, as columns: model, combo, ts, kind,
        binary score (as given), and {row: K-class scores} for the multiclass rows."""
        slots = np.fromiter(self._slot.values(), np.int64, len(self._slot))
        slots = slots[np.asarray(self._label, np.int64)[slots] == NO_LABEL]
        kind = np.asarray(self._kind, np.int64)[slots]
        vectors = {i: self._vec_get(s).copy()
                   for i, s in zip(np.flatnonzero(kind >= MULTICLASS).tolist(),
                                   slots[kind >= MULTICLASS].tolist())}
        return (np.asarray(self._model, np.int64)[slots],
                np.asarray(self._combo, np.int64)[slots], self._ts[slots], kind,
                self._score[slots], vectors)

    def drain(self) -> JoinEvents:
        ev, self.events = self.events, JoinEvents()
        self._joined = self.events.joined
        return ev

    # ------------------------------------------------------------ checkpoints

    def snapshot(self) -> dict[str, Any]:
        items = list(self._slot.items())
        slots = np.fromiter((s for _, s in items), np.int64, len(items))
        return {
            "ids": [pid for pid, _ in items],
            "ts": self._ts[slots], "score": self._score[slots],
            "deadline": self._deadline[slots],
            "combo": np.array([self._combo[s] for s in slots.tolist()], np.int32),
            "model": np.array([self._model[s] for s in slots.tolist()], np.int32),
            "kind": np.array([self._kind[s] for s in slots.tolist()], np.int8),
            "label": np.array([self._label[s] for s in slots.tolist()], np.int32),
            "label_ts": self._label_ts[slots],
            "vectors": {i: self._vec_get(s).copy() for i, s in enumerate(slots.tolist())
                        if self._vk.item(s)},
            "labels": [[lid, lab.label, lab.ts, lab.model, lab.raw, lab.source, d]
                       for lid, (lab, d) in self._labels.items()],
            "done": [[pid, self._done[pid]] for pid in self._done_order if pid in self._done],
        }

    def restore(self, snap: dict[str, Any]) -> None:
        ids = snap["ids"]
        while len(self._free) < len(ids):
            self._grow()
        for i, pid in enumerate(ids):
            slot = self._free.pop()
            self._slot[pid] = slot
            self._pid[slot] = pid
            for name in ("ts", "score", "deadline", "label_ts"):
                getattr(self, "_" + name)[slot] = snap[name][i]
            for name in ("combo", "model", "kind", "label"):
                getattr(self, "_" + name)[slot] = int(snap[name][i])
        for i, vec in snap["vectors"].items():
            self._vec_put(self._slot[ids[int(i)]], np.asarray(vec, np.float64))
        live = self._deadline[np.isfinite(self._deadline)]
        self._next_deadline = float(live.min()) if len(live) else INF
        for lid, label, ts, model, raw, source, d in snap["labels"]:
            self._labels[lid] = (Label(lid, label, ts, model, raw, source), d)
            self._next_label_deadline = min(self._next_label_deadline, d)
            self._undated_labels |= d == INF
        for pid, d in snap["done"]:
            self._done[pid] = d
            self._done_order.append(pid)
