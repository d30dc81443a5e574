"""Which series an eviction pass must look at (``BucketTables.evict``).

A pass at floors F (each series' model clock's bucket less ``keep``) leaves every held
bucket above F; a bucket added since lies above its model's now less ``keep`` (the
adds' filter), so while a series' floor stays where the last pass left it, it has
nothing to evict. In a backtest's small batches a model's clock moves at few checks,
so most passes look at a handful of series instead of every one."""

from __future__ import annotations

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
