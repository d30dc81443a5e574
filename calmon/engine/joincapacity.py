"""Capacity record by record (``JoinCapacity._make_room``): past ``join.max_pending``, what
is overdue is settled, then the oldest pending prediction of the model holding the most
is expired (the fair capacity of ``calmon.engine.join``), through per-model heaps kept
only near the bound."""

from __future__ import annotations

import heapq
from typing import Any

from calmon.engine.joinstate import JoinState


class JoinCapacity(JoinState):
    """The bound on pending predictions, held at every record."""

    def _make_room(self, pid: str, ts: float, v: int, m: int) -> None:
        """Prediction ``pid`` (at ``ts``, ``v``, of model ``m``) just became pending. Past
        ``join.max_pending``, what is overdue is settled first (it is no longer pending:
        the sweep would have settled it), then the oldest pending prediction (ties: the
        smallest id) of the model holding the most (ties: the lowest index) is expired
        for capacity. While pending predictions are near the bound, per model a heap of
        (ts, id) is kept, and with implicit negatives (whose deadlines are not in ts
        order) one of (deadline, ts, id) too, with each model's pending count; entries
        of predictions that left are skipped when they surface."""
        heaps = self._heaps
        if heaps is None:
            heaps = self._build_heaps()
        else:
            by_deadline, by_ts = heaps.setdefault(m, ([], []))
            heapq.heappush(by_ts, (ts, pid))
            if self.implicit is not None:
                heapq.heappush(by_deadline, (self._deadline(v), ts, pid))
            if m >= len(self._counts):  # a model admitted since the heaps were built
                self._counts.extend([0] * (m + 1 - len(self._counts)))
            self._counts[m] += 1
            if self._deadline(v) <= self.nows[m]:  # came overdue: its model has one to settle
                self._dirty.add(m)
        if self.pending <= self.max_pending:
            return
        for mo in self._dirty:  # the models whose now moved: their overdue ones
            now = self.nows[mo]
            by_deadline, by_ts = heaps.get(mo, ([], []))
            if self.implicit is None:  # one ttl: the oldest is also the first due
                while by_ts and by_ts[0][0] + self.ttl <= now:
                    self._settle_top(by_ts)
            else:
                while by_deadline and by_deadline[0][0] <= now:
                    self._settle_top(by_deadline)
        self._dirty.clear()
        counts = self._counts
        while self.pending > self.max_pending:
            big = counts.index(max(counts))
            old_ts, old = heapq.heappop(heaps[big][1])
            found = self._lookup(old)
            if found is None or self._ts_of(found) != old_ts or self._model_of(found) != big:
                continue  # it left (or came back later): a stale entry
            u = found
            counts[big] -= 1
            self._exp.append((u, "capacity"))
            self._held.pop(u, None)
            self._slot.pop(old, None)
            if u < 0:
                self._fresh -= 1
            else:
                self._pid[u] = None
                self._freed.append(u)
        stale = sum(len(a) + len(b) for a, b in heaps.values())
        if stale > 2 * (1 + (self.implicit is not None)) * self.pending + 1024:
            self._heaps = None  # mostly stale entries: built afresh when next needed

    def _make_label_room(self) -> None:
        """One label past ``join.max_pending`` waiting labels: those past their label_ttl
        expire first (no longer waiting: fed one record a poll, the sweep after each
        would have expired them), then, if still past, the oldest waiting label. So
        which label capacity evicts does not depend on where polls end. The scan runs
        only when the clock has reached the earliest deadline known, which it makes
        exact."""
        ev = self.events
        now = self.clock
        if now >= self._next_label_deadline:
            gone, self._next_label_deadline = self._labels.expire(now)
            ev.labels_expired += gone
        if len(self._labels) > self.max_pending:
            del self._labels[next(iter(self._labels))]
            ev.labels_expired += 1

    def _build_heaps(self) -> dict[int, tuple[list[Any], list[tuple[float, str]]]]:
        """The per-model heaps and pending counts of ``_make_room``, built from every
        pending prediction (the new one included) once they are near the bound."""
        heaps: dict[int, tuple[list[Any], list[tuple[float, str]]]] = {}
        self._heaps = heaps
        self._counts = [0] * len(self.nows)
        pending = [(u, i) for u, i in enumerate(self._pid) if i is not None]
        pending += [(u, i) for i, u in self._slot.items() if u < 0]
        for u, i in pending:
            t = self._ts_of(u)
            mu = self._model_of(u)
            self._counts[mu] += 1
            by_deadline, by_ts = heaps.setdefault(mu, ([], []))
            by_ts.append((t, i))
            if self.implicit is not None:
                by_deadline.append((self._deadline(u), t, i))
        for by_deadline, by_ts in heaps.values():
            heapq.heapify(by_ts)
            heapq.heapify(by_deadline)
        self._dirty = set(heaps)
        return heaps

    def _settle_top(self, heap: list[Any]) -> None:
        """Settle the pending prediction at the top of a heap (its deadline passed)."""
        entry = heapq.heappop(heap)
        old_ts, old = entry[-2], entry[-1]
        u = self._lookup(old)
        if u is not None and self._ts_of(u) == old_ts:  # else it left: a stale entry
            self._finish(u, old)

    def _enforce_capacity(self) -> None:
        """The bounds hold record by record (``_make_room``, ``_wait``, ``_trim_done``);
        this only drops the heap once pending predictions are well below the bound."""
        if self._heaps is not None and self.pending < self.max_pending // 2:
            self._heaps = None
