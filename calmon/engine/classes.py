"""Each model's class count, and when it may change.

A model is binary or K-class. A prediction with another class count is rejected
(``classes_mismatch``) while the model is *live*: while it admitted at least
``RESET_GUARD`` predictions of its class count within the longest window (event
time). Otherwise the class count is reset: counted, and everything the model
kept under the old count is forgotten (see ``Engine._reset_classes``). So one
early odd record never locks a model in, and a busy model cannot be flipped.

Liveness is counted from admitted predictions only, never from joins: whether a
label arrived before or after a prediction depends on how two topics interleave,
which differs between a run and its replay after a crash, and the decision must
not.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from calmon.engine.forgotten import DROPPED, RESET, Journal
from calmon.names import BUCKETS  # the longest window in buckets, as the windows keep it

RESET_GUARD = 10  # admitted predictions in the longest window that make a model live


class ClassCounts:
    def __init__(self, longest_window: float) -> None:
        self.width = longest_window / BUCKETS
        self.classes: list[int] = []  # per model: 0 binary, K multiclass
        self._admits: list[dict[int, int]] = []  # per model: bucket -> admitted (settled)
        # this batch, not yet settled: (model, bucket) -> admitted, read from the join's
        # arrivals up to ``_scanned``
        self._batch: dict[tuple[int, int], int] = {}
        self._scanned = 0
        # model -> (joined, arrivals) counts of the batch's events at its last reset: the
        # events before belong to the old class count
        self.marks: dict[int, tuple[int, int]] = {}
        # models forgotten (dropped, reset): every reader of the engine's state is told
        self.forgotten = Journal()

    def add_model(self, classes: int) -> None:
        self.classes.append(classes)
        self._admits.append({})

    def set_model(self, model: int, classes: int, dropped: str | None = None) -> None:
        """A dropped model's index (``dropped``: its name, when it is dropped), reused by
        a new model."""
        if dropped is not None:
            self.forgotten.add(dropped, DROPPED)
        self.classes[model] = classes
        self._admits[model] = {}

    def _floor(self, now: float) -> int:
        return math.floor(now / self.width) - BUCKETS if math.isfinite(now) else -(2**62)

    def _scan(self, arrivals: list[int], models: list[int | None], ts: list[float]) -> None:
        """Count the batch's admissions so far: ``arrivals`` are prediction ordinals,
        ``models`` and ``ts`` the batch's columns by ordinal."""
        for p in arrivals[self._scanned:]:
            key = (models[p], math.floor(ts[p] / self.width))
            self._batch[key] = self._batch.get(key, 0) + 1  # type: ignore[index,arg-type]
        self._scanned = len(arrivals)

    def live(self, model: int, now: float, arrivals: list[int], models: list[int | None],
             ts: list[float]) -> bool:
        """Whether the model admitted ``RESET_GUARD`` predictions of its class count in
        the longest window, this batch's admissions so far included."""
        self._scan(arrivals, models, ts)
        floor_ = self._floor(now)
        n = sum(c for b, c in self._admits[model].items() if b > floor_)
        n += sum(c for (m, b), c in self._batch.items() if m == model and b > floor_)
        return n >= RESET_GUARD

    def reset(self, model: int, classes: int, n_joined: int, arrivals: list[int],
              models: list[int | None], ts: list[float], name: str = "") -> None:
        self._scan(arrivals, models, ts)
        self.forgotten.add(name, RESET)
        self.classes[model] = classes
        self._admits[model] = {}
        self._batch = {k: v for k, v in self._batch.items() if k[0] != model}
        self.marks[model] = (n_joined, len(arrivals))

    def settle(self, models: np.ndarray, ts: np.ndarray, now: list[float]) -> None:
        """Count the batch's admitted predictions (stale ones already left out); ``now``:
        each model's now, by index."""
        self._batch, self._scanned, self.marks = {}, 0, {}
        if len(models) == 0:
            return
        buckets = np.floor(ts / self.width).astype(np.int64)
        lo = int(buckets.min())
        span = int(buckets.max()) - lo + 1  # one or two buckets per batch, as a rule
        keys, counts = np.unique(models * span + (buckets - lo), return_counts=True)
        touched = set()
        for key, c in zip(keys.tolist(), counts.tolist()):
            m, b = divmod(key, span)
            mine = self._admits[m]
            mine[b + lo] = mine.get(b + lo, 0) + c
            touched.add(m)
        for m in touched:  # old buckets go: memory stays BUCKETS per model
            floor_ = self._floor(now[m])
            old = [b for b in self._admits[m] if b <= floor_]
            for b in old:
                del self._admits[m][b]

    def snapshot(self) -> list[list[Any]]:
        return [[c, sorted(a.items())] for c, a in zip(self.classes, self._admits)]

    def restore(self, rows: list[list[Any]]) -> None:
        self.forgotten.restored()
        self.classes = [int(c) for c, _ in rows]
        self._admits = [{int(b): int(n) for b, n in a} for _, a in rows]
        self._batch, self._scanned, self.marks = {}, 0, {}
