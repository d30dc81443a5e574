"""What this process did since it started: the sum of the engine's per-feed deltas.

Prometheus ``_total`` semantics: a restart starts again from zero (``rate()``
and ``increase()`` handle that), so none of this is checkpointed. The loop
thread adds, scrapes copy; both under one lock.
"""

from __future__ import annotations

import threading
from collections import Counter

import numpy as np

from calmon.engine.delta import Delta

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

    def restore(self, other: ProcessTotals) -> None:
        """Become a copy of ``other`` (the daemon's roll-back to a checkpoint)."""
        snap = other.copy()
        with self.lock:
            for name, value in vars(snap).items():
                if name != "lock":
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
