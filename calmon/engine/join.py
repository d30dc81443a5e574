"""Pending predictions and labels: the join by id, whichever arrives first.

Event time drives everything, so a replay is deterministic, and it is kept per
model: ``nows[m]`` is the largest prediction ts of model m, and a pending
prediction's deadline (ts + ``join.ttl``, or ts + ``missing_label.after``) is
checked against its own model's now only, so no record of one model expires or
finalises another's predictions. ``clock`` (the largest of all) times only what
belongs to no model yet: waiting labels (``join.label_ttl``) and the ids already
joined (duplicates), as before v3. A label's model is known only once it meets
its prediction, and a sweep and a lookup must use the same clock for the outcome
not to depend on where polls end, so a future record of one model (at most
``kafka.max_clock_skew`` ahead) can expire a label that waits for another
model's prediction that much early: labels normally come after predictions. Deadlines are checked
exactly on every lookup; the sweep that finalises or expires what nobody looked
up runs once per batch. The bounds (``join.max_pending`` pending predictions,
waiting labels, remembered joined ids) hold record by record, so what they evict
never depends on where a poll ends.

Fair capacity: past ``join.max_pending``, the oldest pending prediction of the
model holding the most is expired (ties: the lowest model index). A flood of one
model then evicts its own predictions, and a model holding no more than its fair
share (``max_pending`` / models with predictions pending) is never evicted. Chosen
over a fixed per-model share, which would leave a lone busy model a fraction of
the pool, and over per-model pools, which cost memory for idle models.

Columnar: ``run_all`` decides a batch over numpy columns where no decision
depends on another (each id once per kind, far from every bound), and sends only
the records whose id has a history (a label before its prediction, a duplicate,
an id joined before) through ``run``, which walks records one by one and does
per record only what the join needs in order (the id lookups and the decisions).
What a pending prediction holds is written to the slot columns once per batch
(``finish``), and what joined is read back as whole columns. Slots freed during
a batch are reused only in the next one, so a joined sample's data stays where
it was until it has been gathered.

Pending predictions are found by id through ``IdIndex`` (a dict while small,
numpy buckets looked up a batch at a time past 65,536): one costs its id string
plus ~50 bytes (its bucket, its id's hash and reference, and the ts, score,
combo and kind columns);
a K-class score vector is a row of one float64 matrix per K, found through the
score column.

The class is put together from one module per concern, each over the state of
``joinstate.JoinState`` (the slot columns, their storage, ``_finish``): ``joincapacity``
(the bound held record by record), ``joinrun`` (the sequential join, ``run``),
``joincolumns`` (the columnar join, ``run_all``), and this module (a batch's start
and end, the sweep, save/restore); ``joined`` holds the column types.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from calmon.engine.decisions import gathered
from calmon.engine.joincolumns import JoinColumns
from calmon.engine.joined import _E, _EI, _NO_BATCH
from calmon.engine.joined import EMPTY as EMPTY  # the join's types, where importers find them
from calmon.engine.joined import BatchColumns as BatchColumns
from calmon.engine.joined import Joined as Joined
from calmon.engine.joined import JoinEvents as JoinEvents
from calmon.engine.joined import concat as concat
from calmon.engine.joinstate import COLUMNS_FROM as COLUMNS_FROM  # for importers
from calmon.engine.joinstate import GROWTH as GROWTH
from calmon.engine.joinstate import INF, NAN, ROW_SHIFT
from calmon.engine.records import MULTICLASS


class Join(JoinColumns):
    """Pending predictions and labels (see the module). This class holds a batch's
    start and end (``prepare``, ``finish``), the sweep, and save/restore."""

    # ------------------------------------------------------------ the batch's end

    def prepare(self, cols: BatchColumns, ids: list[str], l_ids: list[str],
                labels: np.ndarray, label_ts: np.ndarray, models: list[int | None]) -> None:
        """The batch's prediction columns and ids, and its labels' ids, classes and times
        (NaN when unknown), before the first ``run``; ``models``: each prediction's
        model index (the caller fills it in before ``run`` reaches a prediction). The
        batch's ids are looked up in the index at once: the per-record loop needs only
        those it found."""
        self._batch = cols
        self._pm = models
        self._ids = ids
        self._labels_of_batch = (labels, label_ts)
        self._found = np.full(len(ids) + len(l_ids), -1, np.int64)
        if self._index.used:
            names = ids + l_ids
            slots = self._found = self._index.find(names)
            found = np.flatnonzero(slots >= 0)
            self._slot = dict(zip(map(names.__getitem__, found.tolist()), slots[found].tolist()))

    def finish(self, arrivals: np.ndarray) -> JoinEvents:
        """Gather what joined, give the batch's still pending predictions their slots,
        free what was freed, sweep; returns the batch's events. ``arrivals``: the
        ordinals of the predictions admitted and not duplicates."""
        ev = self.events
        ev.arrivals = arrivals
        src = np.asarray(self._j_src, np.int64)
        by_label = np.asarray(self._j_q, np.int64) >= 0
        ev.met = self._combos(np.concatenate([src[by_label],
                                              np.asarray(self._met_src, np.int64)]))
        ev.joined = self._gather()
        expired = self._count_expired(ev)
        self._release(self._freed)
        self._settle_new(arrivals, np.concatenate([~src[src < 0], ~expired[expired < 0]]))
        self._begin()
        self._sweep()
        ev.joined = concat([ev.joined, self._gather()])
        self._count_expired(ev)
        self._release(self._freed)
        self._begin()
        self.events = JoinEvents()
        self._slot = {}
        self._found = _EI
        self._fresh = 0
        self._batch = _NO_BATCH
        self._pm = []
        self._ids = []
        self._labels_of_batch = (_EI, _E)
        return ev

    def drop_models(self, models: list[int], of_combos: np.ndarray | None = None
                    ) -> np.ndarray:
        """Forget the pending predictions of these models, or of these combos (dropped
        when idle, between batches); returns their combos, to be counted as expired by
        ttl."""
        self._heaps = None
        for m in models:
            self.nows[m] = -INF
        slots = self._index.slots()
        if not len(slots):
            return _EI
        gone = slots[np.isin(self.combo_model[self._combo[slots]], models) if of_combos is None
                     else np.isin(self._combo[slots], of_combos)]
        combos: np.ndarray = self._combo[gone].astype(np.int64)
        gone_list = gone.tolist()
        for slot in gone_list:
            self._held.pop(slot, None)
        self._release(gone_list)
        for slot in gone_list:
            self._pid[slot] = None
        return combos

    def _settle_new(self, arrivals: np.ndarray, gone: np.ndarray) -> None:
        """The batch's predictions still pending take a slot each, written as columns.
        ``gone``: the ordinals of those that left (joined or expired) within the batch."""
        ids = self._ids
        if len(gone) == len(arrivals):
            return
        left = np.zeros(len(ids), bool)
        left[gone] = True
        pend = arrivals[~left[arrivals]].tolist()
        if not pend:
            return
        while len(self._free) < len(pend):
            self._grow()
        slots = self._free[-len(pend):][::-1]  # the order pop() would give
        del self._free[-len(pend):]
        held = self._held
        pend_ids = [ids[p] for p in pend]
        for _ in map(self._pid.__setitem__, slots, pend_ids):  # a C loop
            pass
        self._index.add(slots)  # (which reads the ids from _pid)
        self._fresh = 0
        if held:
            for p, slot in zip(pend, slots):
                early = held.pop(~p, None)
                if early is not None:
                    held[slot] = early
        cols = self._batch
        at = np.asarray(slots, np.int64)
        ords = np.asarray(pend, np.int64)
        self._ts[at] = cols.ts[ords]
        self._combo[at] = cols.combo[ords]
        self._kind[at] = cols.kind[ords]
        self._score[at] = cols.score[ords]
        self._decision[at] = cols.decision[ords] if len(cols.decision) else -1
        if cols.vectors:
            for p, slot in zip(pend, slots):
                vec = cols.vectors.get(p)
                if vec is not None:
                    self._score[slot] = self._vec_put(vec)

    def _count_expired(self, ev: JoinEvents) -> np.ndarray:
        """Count what expired, by combo and reason; returns the sources that did."""
        src = np.array([s for s, _ in self._exp], np.int64)
        if self._exp:
            for (_, reason), combo in zip(self._exp, self._combos(src).tolist()):
                ev.expired[(combo, reason)] += 1
        return src

    def _combos(self, src: np.ndarray) -> np.ndarray:
        out = np.empty(len(src), np.int64)
        old = src >= 0
        out[old] = self._combo[src[old]]
        out[~old] = self._batch.combo[~src[~old]]
        return out

    def _gather(self) -> Joined:
        """What joined so far, as columns."""
        src_list = self._j_src
        if not src_list:
            return EMPTY
        src = np.asarray(src_list, np.int64)
        q = np.asarray(self._j_q, np.int64)
        batch = q >= 0
        labels, label_ts = self._labels_of_batch
        label = np.empty(len(q), np.int64)
        lts = np.empty(len(q))
        label[batch] = labels[q[batch]]
        lts[batch] = label_ts[q[batch]]
        if not batch.all():
            label[~batch] = np.asarray(self._x_label, np.int64)[~q[~batch]]
            lts[~batch] = np.array(self._x_lts, np.float64)[~q[~batch]]  # None -> NaN
        n = len(src)
        old = src >= 0
        slots = src[old]
        ords = ~src[~old]
        cols = self._batch
        ts = np.empty(n)
        kind = np.empty(n, np.int64)
        score = np.empty(n)
        combo = np.empty(n, np.int64)
        ts[old], ts[~old] = self._ts[slots], cols.ts[ords]
        kind[old], kind[~old] = self._kind[slots], cols.kind[ords]
        score[old], score[~old] = self._score[slots], cols.score[ords]
        combo[old], combo[~old] = self._combo[slots], cols.combo[ords]
        decision = gathered(self._decision, cols.decision, old, slots, ords)
        vectors: dict[int, tuple[list[int], list[np.ndarray]]] = {}
        multi = np.flatnonzero(kind >= MULTICLASS)
        if len(multi):
            for i in multi.tolist():
                s = src_list[i]
                if s >= 0:
                    code = int(score[i])
                    k = code % ROW_SHIFT
                    vec = self._mats[k][code // ROW_SHIFT]
                else:
                    vec = cols.vectors[~s]
                    k = len(vec)
                rows, vecs = vectors.setdefault(k, ([], []))
                rows.append(i)
                vecs.append(vec)
            score[multi] = 0.0
        return Joined(combo, ts, kind, score, label, lts, decision,
                      {k: (np.asarray(r, np.int64), np.array(v, np.float64))
                       for k, (r, v) in vectors.items()})

    def _release(self, slots: list[int]) -> None:
        """Slots whose prediction left (joined, expired): their K-class rows go back to
        their matrix, and they take new predictions from the next batch on."""
        if not slots:
            return
        idx = np.asarray(slots, np.int64)
        self._index.remove(slots)
        multi = idx[self._kind[idx] >= MULTICLASS]
        for code in self._score[multi].astype(np.int64).tolist():
            self._mat_free[code % ROW_SHIFT].append(code // ROW_SHIFT)
        self._ts[idx] = INF
        self._kind[idx] = 0
        self._score[idx] = 0.0
        self._free.extend(reversed(slots))

    # ------------------------------------------------------------ sweeping

    def _sweep(self) -> None:
        """Settle everything whose deadline passed on its model's clock, then enforce the
        capacity bound. Waiting labels and joined ids go on the clock less the margin."""
        if self.clock >= self._next_deadline:  # no model's now is past the clock
            deadline = self._deadlines()
            due = np.flatnonzero(deadline <= self._slot_nows())
            if len(due):
                # in deadline order, so what joins is emitted in a repeatable order
                due = due[np.lexsort((self._ts[due], deadline[due]))]
                for slot in due.tolist():
                    self._finish(slot, self._pid[slot])  # type: ignore[arg-type]
                deadline[due] = INF
            self._next_deadline = float(deadline.min()) if len(deadline) else INF
        now = self.clock
        if now >= self._next_label_deadline or (self._undated_labels and now > -INF):
            if now > -INF:
                self._labels.date(now + self.label_ttl)
            gone, self._next_label_deadline = self._labels.expire(now)
            self.events.labels_expired += gone
            self._undated_labels = False
        while self._done_order:
            pid = self._done_order[0]
            if pid in self._stale:
                self._was_stale(self._done_order.popleft())
                continue
            d = self._done.get(pid)
            if d is not None and d > now and len(self._done) <= self.max_pending:
                break
            self._done_order.popleft()
            if d is not None:
                del self._done[pid]
        self._enforce_capacity()

    def waiting(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray,
                               dict[int, Any], np.ndarray]:
        """Pending predictions with no label yet, as columns: combo, ts, kind, binary
        score (as given), {row: K-class scores} for the multiclass rows, decision."""
        slots = self._index.slots()
        if self._held:
            slots = slots[~np.isin(slots, np.fromiter(self._held, np.int64, len(self._held)))]
        kind = self._kind[slots].astype(np.int64)
        vectors = {i: self._vec_of(s).copy()
                   for i, s in zip(np.flatnonzero(kind >= MULTICLASS).tolist(),
                                   slots[kind >= MULTICLASS].tolist())}
        return (self._combo[slots].astype(np.int64), self._ts[slots], kind,
                np.where(kind >= MULTICLASS, 0.0, self._score[slots]), vectors,
                self._decision[slots].astype(np.int64))

    # ------------------------------------------------------------ checkpoints

    def snapshot(self) -> dict[str, Any]:
        slots = self._index.slots()
        kind = self._kind[slots]
        held = [self._held.get(s) for s in slots.tolist()]
        return {
            "ids": [self._pid[s] for s in slots.tolist()],
            "ts": self._ts[slots],
            "score": np.where(kind >= MULTICLASS, 0.0, self._score[slots]),
            "combo": self._combo[slots].copy(),
            "kind": kind.copy(),
            "decision": self._decision[slots].copy(),
            "label": np.array([-1 if h is None else h[0] for h in held], np.int32),
            "label_ts": np.array([NAN if h is None else h[1] for h in held], np.float64),
            "vectors": {i: self._vec_of(s).copy() for i, s in enumerate(slots.tolist())
                        if kind[i] >= MULTICLASS},
            "labels": self._labels.snapshot(),
            "done": self._tombstones(),
        }

    def _tombstones(self) -> list[list[Any]]:
        """The remembered joined ids and their deadlines, oldest first (stale entries of
        the order left out)."""
        skip = dict(self._stale)
        out = []
        for pid in self._done_order:
            n = skip.get(pid)
            if n:
                skip[pid] = n - 1
            elif pid in self._done:
                out.append([pid, self._done[pid]])
        return out

    def restore(self, snap: dict[str, Any]) -> None:
        ids = snap["ids"]
        while len(self._free) < len(ids):
            self._grow()
        slots = []
        for i, pid in enumerate(ids):
            slot = self._free.pop()
            slots.append(slot)
            self._pid[slot] = pid
            self._ts[slot] = snap["ts"][i]
            self._combo[slot] = int(snap["combo"][i])
            kind = int(snap["kind"][i])
            self._kind[slot] = kind
            self._score[slot] = snap["score"][i] if kind < MULTICLASS else 0.0
            self._decision[slot] = snap["decision"][i] if "decision" in snap else -1  # v5
            label = int(snap["label"][i])
            if label != -1:
                self._held[slot] = (label, float(snap["label_ts"][i]))
        self._index.add(slots)
        for i, vec in snap["vectors"].items():
            self._score[slots[int(i)]] = self._vec_put(np.asarray(vec, np.float64))
        deadline = self._deadlines()
        self._next_deadline = float(deadline.min()) if len(deadline) else INF
        self._next_label_deadline, self._undated_labels = self._labels.restore(snap["labels"])
        pending = set(ids)
        for pid, d in snap["done"]:
            if pid in pending:  # (an older release kept both): the pending one stands
                continue
            self._done[pid] = d
            self._done_order.append(pid)
