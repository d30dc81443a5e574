"""Which series an eviction pass must look at (``BucketTables.evict``).

A pass at floors F (each series' model clock's bucket less ``keep``) leaves every held
bucket above F; a bucket added since lies above its model's now less ``keep`` (the
adds' filter), so while a series' floor stays where the last pass left it, it has
nothing to evict. In a backtest's small batches a model's clock moves at few checks,
so most passes look at a handful of series instead of every one.

Each table also keeps, per window, a lower bound of the bucket indices it holds
(``BucketTables._low``: lowered by every add, found again by a pass over every series):
while every floor lies below it, nothing can slide out and the pass is skipped. That is
every pass of a window's first fill (a new instance or task, a new series), when the
floors move with every feed but the oldest bucket is still inside: in group mode each
task's engine would otherwise pass over all its series at every feed."""

from __future__ import annotations

import math
from typing import Any

import numpy as np


def moved(swept: Any, floors: Any) -> list[int] | None:
    """The series whose floor moved since the pass at ``swept`` (None: every series,
    as when the last pass is unknown or its floors were of another shape); ``floors``
    and ``swept``: one floor for all, or one per series id."""
    if isinstance(floors, np.ndarray):
        if not isinstance(swept, np.ndarray) or swept.shape != floors.shape:
            return None
        return np.flatnonzero(floors != swept).tolist()
    if swept is None or isinstance(swept, np.ndarray) or swept != floors:
        return None
    return []


def evict(tables: Any, now: Any) -> None:
    """``BucketTables.evict``: drop the buckets at or below each series' floor (its
    clock's bucket less ``keep``; ``now`` one for all or one per series id), and the
    series left empty; the floors and the lower bound kept for the next pass."""
    per_series = isinstance(now, np.ndarray)
    for w in range(len(tables.windows)):
        floors = tables.current(w, now) - tables.keep
        top = (floors.max() if len(floors) else -math.inf) if per_series else floors
        tab = tables._data[w]
        if tables._low[w] > top:  # every held bucket above every floor
            tables._swept[w] = floors
            continue
        todo = moved(tables._swept[w], floors)
        tables._swept[w] = floors
        sids = list(tab) if todo is None else [s for s in todo if s in tab]
        # a pass over every series finds the bound anew; a partial one can only lower it
        low = math.inf if len(sids) == len(tab) else tables._low[w]
        for sid in sids:
            floor_ = floors[sid] if per_series else floors
            buckets = tab[sid]
            if buckets:
                first = min(buckets)
                if first > floor_:  # nothing slid out (most checks)
                    low = min(low, first)
                    continue
            for idx in [i for i in buckets if i <= floor_]:
                del buckets[idx]
                tables.touched.add(sid)
            if buckets:
                low = min(low, min(buckets))
            else:
                del tab[sid]
        tables._low[w] = low
