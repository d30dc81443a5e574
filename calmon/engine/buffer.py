"""Bounded rings of recent joined samples, the material refits are made of.

One ring per model (``__all__`` series), or per series when refits are per
segment. Scores are kept as given (prob, logit, probs or logits) with their
kind, so a calibrator is fitted on exactly what serving code will hand it.
Memory is ``capacity x (classes + 3) x 8`` bytes per ring, whatever the traffic.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class SampleSet:
    """A copy of a ring's contents in arrival order (oldest first)."""

    ts: np.ndarray
    label: np.ndarray
    kind: np.ndarray  # 0 prob, 1 logit, 2 probs, 3 logits
    score: np.ndarray  # (n,) binary or (n, K) multiclass

    def __len__(self) -> int:
        return len(self.ts)


class Ring:
    def __init__(self, capacity: int, classes: int) -> None:
        self.capacity = capacity
        self.classes = classes  # 0 binary, K multiclass
        shape = (capacity,) if classes == 0 else (capacity, classes)
        self.ts = np.zeros(capacity)
        self.label = np.zeros(capacity, np.int32)
        self.kind = np.zeros(capacity, np.int8)
        self.score = np.zeros(shape)
        self.size = 0
        self.head = 0  # next write position

    def extend(self, ts: np.ndarray, label: np.ndarray, kind: np.ndarray,
               score: np.ndarray) -> None:
        n = len(ts)
        if n >= self.capacity:  # only the newest fit
            ts, label, kind, score = (a[n - self.capacity:] for a in (ts, label, kind, score))
            n = self.capacity
        idx = (self.head + np.arange(n)) % self.capacity
        self.ts[idx] = ts
        self.label[idx] = label
        self.kind[idx] = kind
        self.score[idx] = score
        self.head = (self.head + n) % self.capacity
        self.size = min(self.capacity, self.size + n)

    def samples(self) -> SampleSet:
        start = (self.head - self.size) % self.capacity
        idx = (start + np.arange(self.size)) % self.capacity
        return SampleSet(self.ts[idx].copy(), self.label[idx].copy(), self.kind[idx].copy(),
                         self.score[idx].copy())

    def snapshot(self) -> dict[str, Any]:
        s = self.samples()
        return {"classes": self.classes, "ts": s.ts, "label": s.label, "kind": s.kind,
                "score": s.score}

    @classmethod
    def restore(cls, capacity: int, snap: dict[str, Any]) -> Ring:
        ring = cls(capacity, int(snap["classes"]))
        ring.extend(snap["ts"], snap["label"], snap["kind"], snap["score"])
        return ring


class Buffers:
    """Rings keyed by series id (``__all__`` series only, unless per segment)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.rings: dict[int, Ring] = {}

    def add(self, sid: int, classes: int, ts: np.ndarray, label: np.ndarray,
            kind: np.ndarray, score: np.ndarray) -> None:
        ring = self.rings.get(sid)
        if ring is None:
            ring = self.rings[sid] = Ring(self.capacity, classes)
        ring.extend(ts, label, kind, score)

    def samples(self, sid: int) -> SampleSet | None:
        ring = self.rings.get(sid)
        return None if ring is None else ring.samples()

    def snapshot(self) -> dict[int, Any]:
        return {sid: ring.snapshot() for sid, ring in self.rings.items()}

    def restore(self, snap: dict[int, Any]) -> None:
        self.rings = {int(sid): Ring.restore(self.capacity, s) for sid, s in snap.items()}
