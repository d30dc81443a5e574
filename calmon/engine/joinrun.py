"""The sequential join (``JoinRun.run``): records walked one by one, doing per record only
what the join needs in order (the id lookups and the decisions); a label that finds no
prediction waits (``_wait``), a prediction whose label waits meets it
(``_meet_waiting``), implicit negatives hold their label (``_hold``)."""

from __future__ import annotations

from calmon.engine.joincapacity import JoinCapacity
from calmon.engine.joinstate import INF, NAN
from calmon.engine.parsed import LABEL, PRED, Parsed
from calmon.engine.records import MULTICLASS


class JoinRun(JoinCapacity):
    """The join record by record."""

    def run(self, b: Parsed, lo: int, hi: int, p: int, q: int) -> tuple[int, int]:
        """Records ``lo..hi-1`` of the batch, every prediction among them admitted (its
        model index in the list given to ``prepare``); ``p``, ``q``: the ordinals of the
        range's first prediction and label. Returns the ordinals after the range. Moves
        ``nows`` and ``clock``. A prediction of this batch is ``~p`` in ``_slot`` until the
        batch ends (most join within their batch and never take a slot); older ones are
        their slot. One loop, its state in locals: it runs per record."""
        kinds = b.kinds if lo == 0 and hi == len(b.kinds) else b.kinds[lo:hi]
        p_id, p_ts, p_kind, p_classes = b.p_id, b.p_ts, b.p_kind, b.p_classes
        l_id, l_label, l_ts = b.l_id, b.l_label, b.l_ts
        ev, slot_get, slot_of, pids, freed = (self.events, self._slot.get, self._slot,
                                              self._pid, self._freed)
        done, done_order, labels = self._done, self._done_order, self._labels
        j_src, j_q, ts_item, nows, pm = self._j_src, self._j_q, self._ts.item, self.nows, self._pm
        clock, ttl, implicit = self.clock, self.ttl, self.implicit is not None
        full, done_full, next_deadline = self._range_bounds(kinds, p_ts, p)
        undated = self._undated_labels
        for k in kinds:
            if k == PRED:
                pid = p_id[p]
                ts = p_ts[p]
                m = pm[p]
                now = nows[m]  # type: ignore[index]
                if ts > now:
                    now = nows[m] = ts  # type: ignore[index]
                    if ts > clock:
                        clock = self.clock = ts
                    if full:
                        self._dirty.add(m)  # type: ignore[arg-type]
                if undated:  # the first prediction ever: its time starts their clocks
                    self._date_labels(clock)
                    undated = False
                v = slot_get(pid)
                if v is not None and self._deadline(v) <= self._now_of(v):
                    self._finish(v, pid)  # overdue: settle it as the sweep would have
                    v = None
                # a duplicate: of a pending one, or of a joined id (those go on the clock)
                if v is not None or (done and self._remembered(pid, clock)):
                    ev.duplicate_predictions += 1
                    ev.dups.append(p)
                elif not (labels and pid in labels and self._meet_waiting(b, p, clock)):
                    slot_of[pid] = ~p
                    self._fresh += 1
                    if full:
                        self._make_room(pid, ts, ~p, m)  # type: ignore[arg-type]
                p += 1
            elif k == LABEL:
                lid = l_id[q]
                v = slot_get(lid)
                if (v is not None and clock >= next_deadline
                        and self._deadline(v) <= self._now_of(v)):
                    self._finish(v, lid)
                    v = None
                if v is None:
                    self._wait(b, q)
                    undated = self._undated_labels
                elif (lab := l_label[q] if l_label[q] >= 0 else self._named(b, q, v)) >= 2 and (
                        lab >= self._classes(v, p_kind, p_classes)):
                    self.events.out_of_range.append(q)
                elif not (implicit and self._hold(v, lab, l_ts[q], p_kind)):
                    j_src.append(v)
                    j_q.append(q)
                    if self._heaps is not None:
                        self._counts[self._model_of(v)] -= 1
                    if v < 0:
                        done[lid] = p_ts[~v] + ttl
                        self._fresh -= 1
                    else:
                        done[lid] = ts_item(v) + ttl
                        pids[v] = None
                        freed.append(v)
                    done_order.append(lid)
                    del slot_of[lid]
                    if done_full:  # past join.max_pending joined ids (a busy sidecar)
                        self._trim_done()
                q += 1
        return p, q

    def _range_bounds(self, kinds: list[int], p_ts: list[float],
                      p: int) -> tuple[bool, bool, float]:
        """Before ``run`` walks a range: whether the bounds on pending predictions and on
        joined ids are checked per record (only when the range could reach them), and a
        lower bound of every pending deadline (the loop checks a pending prediction's own
        deadline only past it)."""
        ttl = self.ttl
        after = self.implicit.after if self.implicit is not None else ttl
        preds = kinds.count(PRED)
        if preds:  # a lower bound of the deadlines of this range's predictions is enough
            self._next_deadline = min(self._next_deadline,
                                      min(p_ts[p:p + preds]) + min(ttl, after))
        # join.max_pending holds at every record, not just at the batch's end, so what
        # is evicted never depends on how the input was cut into polls
        full = self._heaps is not None or preds > self.max_pending - self.pending
        done_full = len(kinds) > self.max_pending - len(self._done)
        return full, done_full, self._next_deadline

    def _named(self, b: Parsed, q: int, v: int) -> int:
        """v5: label q gives a class name, which the prediction's model resolves."""
        lab: int = self.class_index(self._model_of(v), b.l_name[q])
        self._labels_of_batch[0][q] = lab
        return lab

    def _meet_waiting(self, b: Parsed, p: int, now: float) -> bool:
        """Prediction p, whose label waits: True when they join at once (no slot)."""
        pid = b.p_id[p]
        kind = b.p_kind[p]
        hold = self.implicit is not None and kind < MULTICLASS
        wl, label_deadline = self._labels.pop(pid)
        lab = self.class_index(self._model_of(~p), wl.label) if isinstance(
            wl.label, str) else wl.label
        if label_deadline <= now:
            self.events.labels_expired += 1
        elif lab >= (2 if kind < MULTICLASS else b.p_classes[p]):
            self.events.rejected_labels.append(wl)
        elif not hold:
            self._emit_other(~p, lab, wl.ts)
            self._done[pid] = b.p_ts[p] + self.ttl
            self._done_order.append(pid)
            self._trim_done()
            return True
        else:
            self._held[~p] = (lab, NAN if wl.ts is None else wl.ts)
        return False

    def _hold(self, v: int, label: int, label_ts: float | None, p_kind: list[int]) -> bool:
        """Implicit negatives: a label that met a binary prediction before ts + after
        waits with it (so no window sees a positive before its negatives), and a second
        one is a duplicate. True when the label was taken care of so."""
        if v in self._held:
            self.events.duplicate_labels += 1
            self._met_src.append(v)
            return True
        if (p_kind[~v] if v < 0 else self._kind.item(v)) < MULTICLASS:
            self._held[v] = (label, NAN if label_ts is None else label_ts)
            self._met_src.append(v)
            return True
        return False

    def _date_labels(self, now: float) -> None:
        """Labels that came with no ts before any prediction: their label_ttl runs from
        the first prediction's time, whichever batch it comes in."""
        self._labels.date(now + self.label_ttl)
        self._next_label_deadline = min(self._next_label_deadline, now + self.label_ttl)
        self._undated_labels = False

    def _wait(self, b: Parsed, q: int) -> None:
        """A label with no pending prediction: a duplicate of a joined one, or it waits
        (timed on the instance's clock)."""
        now = self.clock
        lid = b.l_id[q]
        ev = self.events
        ev.waiting.append(q)
        done = self._done.get(lid)
        if done is not None and done > now:
            ev.duplicate_labels += 1
            return
        waiting = self._labels.deadline(lid)
        if waiting is not None and waiting > now:
            ev.duplicate_labels += 1
            return
        if waiting is not None:
            ev.labels_expired += 1
            del self._labels[lid]  # a new arrival: the newest waiting label
        lab = b.label(q)
        base = lab.ts if lab.ts is not None else now
        # no ts and no prediction seen yet: the clock starts with the first prediction
        deadline = base + self.label_ttl if base > -INF else INF
        self._labels[lid] = (lab, deadline)
        if deadline < self._next_label_deadline:
            self._next_label_deadline = deadline
        if deadline == INF:
            self._undated_labels = True
        if len(self._labels) > self.max_pending:
            self._make_label_room()
