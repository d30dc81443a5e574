"""What one ``Engine.feed`` did, for the process-lifetime counters.

The engine keeps only state (snapshotted, exactly-once). Prometheus ``_total``
counters count what the running process did since it started, so they are not
state: the engine reports each feed's increments as a ``Delta`` and the
exporter's ``ProcessTotals`` adds them up.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np


@dataclass
class Delta:
    predictions: Counter[str] = field(default_factory=Counter)  # model
    labels: Counter[str] = field(default_factory=Counter)  # model ("" when not known yet)
    joined: Counter[str] = field(default_factory=Counter)  # model
    expired: Counter[tuple[str, str]] = field(default_factory=Counter)  # model, reason
    labels_expired: int = 0
    series_folded: int = 0  # new segments folded into __other__ by limits.max_series
    class_resets: Counter[str] = field(default_factory=Counter)  # model
    duplicates: Counter[str] = field(default_factory=Counter)  # topic
    key_mismatch: Counter[str] = field(default_factory=Counter)  # topic: key is not the id
    invalid: Counter[tuple[str, str]] = field(default_factory=Counter)  # topic, reason
    # (model, segment) -> (3, B): samples, summed confidence, summed correct per bin
    bins: dict[tuple[str, str], np.ndarray] = field(default_factory=dict)
    # (model, label ts - prediction ts) of joined samples whose label had a time
    delays: list[tuple[str, np.ndarray]] = field(default_factory=list)
