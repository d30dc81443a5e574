"""What this process did since it started: the sum of the engine's per-feed deltas.

Prometheus ``_total`` semantics: a restart starts again from zero (``rate()``
and ``increase()`` handle that), so none of this is checkpointed. The loop
thread adds, scrapes copy; both under one lock.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable

import numpy as np

from calmon.engine.delta import Delta
from calmon.engine.engine import Engine
from calmon.engine.forgotten import DROPPED

# given the models the totals name, those the engine dropped since it was last asked
Follow = Callable[[set[str]], set[str]]

# label delay histogram buckets (seconds): 1s .. 7d
DELAY_BUCKETS = (1.0, 5.0, 15.0, 30.0, 60.0, 300.0, 900.0, 1800.0, 3600.0, 7200.0, 21600.0,
                 43200.0, 86400.0, 259200.0, 604800.0)


class ProcessTotals:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.predictions: Counter[str] = Counter()
        self.labels: Counter[str] = Counter()
        self.joined: Counter[str] = Counter()
        self.expired: Counter[tuple[str, str]] = Counter()
        self.labels_expired = 0
        self.series_folded = 0
        self.class_resets: Counter[str] = Counter()
        self.duplicates: Counter[str] = Counter()
        self.key_mismatch: Counter[str] = Counter()
        self.invalid: Counter[tuple[str, str]] = Counter()
        self.bins: dict[tuple[str, str], np.ndarray] = {}  # (model, segment) -> (3, B)
        self.delay_counts: dict[str, np.ndarray] = {}  # model -> per bucket, +Inf last
        self.delay_sum: dict[str, float] = {}
        # the engine's dropped models, forgotten here after each add (the daemon's totals)
        self.follow: Follow | None = None

    def add(self, d: Delta) -> None:
        with self.lock:
            self.predictions.update(d.predictions)
            self.labels.update(d.labels)
            self.joined.update(d.joined)
            self.expired.update(d.expired)
            self.labels_expired += d.labels_expired
            self.series_folded += d.series_folded
            self.class_resets.update(d.class_resets)
            self.duplicates.update(d.duplicates)
            self.key_mismatch.update(d.key_mismatch)
            self.invalid.update(d.invalid)
            for key, arr in d.bins.items():
                mine = self.bins.get(key)
                if mine is None:
                    self.bins[key] = arr.copy()
                else:
                    mine += arr
            for model, delay in d.delays:
                bucket = np.searchsorted(DELAY_BUCKETS, delay, side="left")  # le-buckets
                counts = self.delay_counts.get(model)
                if counts is None:
                    counts = self.delay_counts[model] = np.zeros(len(DELAY_BUCKETS) + 1)
                counts += np.bincount(bucket, minlength=len(DELAY_BUCKETS) + 1)
                self.delay_sum[model] = self.delay_sum.get(model, 0.0) + float(delay.sum())
            if self.follow is not None:
                self._forget(self.follow(self._models()))

    def _models(self) -> set[str]:
        return ({*self.predictions, *self.labels, *self.joined, *self.class_resets,
                 *self.delay_counts} | {m for m, _ in self.expired} | {m for m, _ in self.bins})

    def _forget(self, gone: set[str]) -> None:
        """A dropped model's counters go with it (its name comes back fresh): the
        series of a churn of model names do not pile up on every scrape."""
        gone.discard("")  # labels of no known model
        if not gone:
            return
        for name in ("predictions", "labels", "joined", "class_resets"):
            counter: Counter[str] = getattr(self, name)
            for m in gone & set(counter):
                del counter[m]
        self.expired = Counter({k: v for k, v in self.expired.items() if k[0] not in gone})
        self.bins = {k: v for k, v in self.bins.items() if k[0] not in gone}
        for m in gone:
            self.delay_counts.pop(m, None)
            self.delay_sum.pop(m, None)

    def restore(self, other: ProcessTotals) -> None:
        """Become a copy of ``other`` (the daemon's roll-back to a checkpoint)."""
        snap = other.copy()
        with self.lock:
            for name, value in vars(snap).items():
                if name not in ("lock", "follow"):
                    setattr(self, name, value)

    def copy(self) -> ProcessTotals:
        out = ProcessTotals()
        with self.lock:
            out.predictions, out.labels = Counter(self.predictions), Counter(self.labels)
            out.joined, out.expired = Counter(self.joined), Counter(self.expired)
            out.labels_expired = self.labels_expired
            out.series_folded = self.series_folded
            out.class_resets = Counter(self.class_resets)
            out.duplicates, out.invalid = Counter(self.duplicates), Counter(self.invalid)
            out.key_mismatch = Counter(self.key_mismatch)
            out.bins = {k: v.copy() for k, v in self.bins.items()}
            out.delay_counts = {k: v.copy() for k, v in self.delay_counts.items()}
            out.delay_sum = dict(self.delay_sum)
        return out


def dropped_models(engine: Engine) -> Follow:
    """What ``ProcessTotals.follow`` asks: the models ``engine`` dropped since the last
    call (after a restore of the engine: those of ``known`` it no longer holds)."""
    cursor = engine.class_counts.forgotten.cursor()

    def gone(known: set[str]) -> set[str]:
        taken = cursor.take()
        if taken is None:
            with engine.lock:
                return known - {m for m in engine.models if m}
        return {m for m, why in taken if why == DROPPED}

    return gone
