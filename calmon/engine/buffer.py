"""Bounded rings of recent joined samples, the material refits are made of.

One ring per model (``__all__`` series), or per series when refits are per
segment. Scores are kept as given (prob, logit, probs or logits) with their
kind, so a calibrator is fitted on exactly what serving code will hand it.
Memory is ``capacity x (classes + 3) x 8`` bytes per ring, whatever the traffic.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class SampleSet:
    """A copy of a ring's contents in arrival order (oldest first)."""

    ts: np.ndarray
    label: np.ndarray
    kind: np.ndarray  # int(records.ScoreKind) of each sample
    score: np.ndarray  # (n,) binary or (n, K) multiclass
    total: int = 0  # samples ever added to the ring: the last (total - seen) are new

    def __len__(self) -> int:
        return len(self.ts)

    def tail(self, n: int) -> SampleSet:
        """The newest ``n`` samples (all when n >= len)."""
        if n >= len(self):
            return self
        cut = slice(len(self) - max(n, 0), None)
        return SampleSet(self.ts[cut], self.label[cut], self.kind[cut], self.score[cut],
                         self.total)

    def head(self, n: int) -> SampleSet:
        """The oldest ``n`` samples, as the ring held them ``len - n`` samples ago."""
        if n >= len(self):
            return self
        cut = slice(0, max(n, 0))
        return SampleSet(self.ts[cut], self.label[cut], self.kind[cut], self.score[cut],
                         self.total - (len(self) - max(n, 0)))

    def select(self, mask: np.ndarray) -> SampleSet:
        return SampleSet(self.ts[mask], self.label[mask], self.kind[mask], self.score[mask],
                         self.total)


class Ring:
    """The newest ``capacity`` samples of a series. The arrays start small and double
    as samples come, up to ``capacity``: a fleet's thousands of quiet segment series
    cost what they hold, not ``recalibration.buffer`` rows each."""

    INITIAL = 256

    def __init__(self, capacity: int, classes: int) -> None:
        self.capacity = capacity
        self.classes = classes  # 0 binary, K multiclass
        self._allocate(min(capacity, self.INITIAL))
        self.size = 0
        self.head = 0  # next write position
        self.total = 0  # samples ever added (detectors read only what is new)

    def _allocate(self, rows: int) -> None:
        self.ts = np.zeros(rows)
        self.label = np.zeros(rows, np.int32)
        self.kind = np.zeros(rows, np.int8)
        self.score = np.zeros((rows,) if self.classes == 0 else (rows, self.classes))

    def _grow(self, need: int) -> None:
        """Room for ``need`` samples (at most ``capacity``). Below capacity the ring has
        never wrapped (at most its head came round to 0, exactly full): its contents are
        rows 0..size-1, oldest first, kept in place."""
        rows = len(self.ts)
        if need <= rows or rows >= self.capacity:
            return
        ts, label, kind, score = self.ts, self.label, self.kind, self.score
        self._allocate(min(self.capacity, max(need, 2 * rows)))
        n = self.size
        self.ts[:n], self.label[:n], self.kind[:n], self.score[:n] = (
            ts[:n], label[:n], kind[:n], score[:n])
        self.head = n

    def extend(self, ts: np.ndarray, label: np.ndarray, kind: np.ndarray,
               score: np.ndarray) -> None:
        n = len(ts)
        self.total += n
        if n >= self.capacity:  # only the newest fit
            ts, label, kind, score = (a[n - self.capacity:] for a in (ts, label, kind, score))
            n = self.capacity
        self._grow(self.size + n)
        rows = len(self.ts)
        # one slice where the run does not wrap (a check's few samples): the same writes
        idx: slice | np.ndarray = (slice(self.head, self.head + n) if self.head + n <= rows
                                   else (self.head + np.arange(n)) % rows)
        self.ts[idx] = ts
        self.label[idx] = label
        self.kind[idx] = kind
        self.score[idx] = score
        self.head = (self.head + n) % rows
        self.size = min(rows, self.size + n)

    def samples(self, last: int | None = None) -> SampleSet:
        """A copy of the contents, or of the newest ``last`` samples only (cheap: the
        detectors read what is new every check)."""
        n = self.size if last is None else max(0, min(last, self.size))
        if n == 0:  # the running total only (every check asks it of every series)
            return SampleSet(self.ts[:0], self.label[:0], self.kind[:0], self.score[:0],
                             self.total)
        rows = len(self.ts)
        start = (self.head - n) % rows
        if start + n <= rows:  # not wrapped: slices, copied
            sl = slice(start, start + n)
            return SampleSet(self.ts[sl].copy(), self.label[sl].copy(), self.kind[sl].copy(),
                             self.score[sl].copy(), self.total)
        idx = (start + np.arange(n)) % rows  # a fancy index copies already
        return SampleSet(self.ts[idx], self.label[idx], self.kind[idx], self.score[idx],
                         self.total)

    def snapshot(self) -> dict[str, Any]:
        s = self.samples()
        return {"classes": self.classes, "ts": s.ts, "label": s.label, "kind": s.kind,
                "score": s.score, "total": self.total}

    @classmethod
    def restore(cls, capacity: int, snap: dict[str, Any]) -> Ring:
        ring = cls(capacity, int(snap["classes"]))
        ring.extend(snap["ts"], snap["label"], snap["kind"], snap["score"])
        ring.total = int(snap.get("total", ring.total))
        return ring


class Buffers:
    """Rings keyed by series id (``__all__`` series only, unless per segment)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.rings: dict[int, Ring] = {}
        self.touched: set[int] = set()  # series written since the changelog took them
        self.generation = 0  # moves whenever a ring is made or dropped

    def add(self, sid: int, classes: int, ts: np.ndarray, label: np.ndarray,
            kind: np.ndarray, score: np.ndarray) -> None:
        ring = self.rings.get(sid)
        if ring is None:
            ring = self.rings[sid] = Ring(self.capacity, classes)
            self.generation += 1
        ring.extend(ts, label, kind, score)
        self.touched.add(sid)

    def drop(self, sid: int) -> None:
        if self.rings.pop(sid, None) is not None:
            self.generation += 1

    def samples(self, sid: int, last: int | None = None) -> SampleSet | None:
        ring = self.rings.get(sid)
        return None if ring is None else ring.samples(last)

    def snapshot(self, only: Iterable[int] | None = None) -> dict[int, Any]:
        if only is not None:
            return {sid: self.rings[sid].snapshot() for sid in only if sid in self.rings}
        return {sid: ring.snapshot() for sid, ring in self.rings.items()}

    def restore(self, snap: dict[int, Any]) -> None:
        self.rings = {int(sid): Ring.restore(self.capacity, s) for sid, s in snap.items()}
        self.touched.clear()
        self.generation += 1
