"""The engine's reading for held refits (calmon.recal.hold): the raw-score histogram of a
series' predictions made after a time, joined or not, from the ``score_psi`` tables
(buckets of a window / 16: the bucket holding that time is left out)."""

from __future__ import annotations

import numpy as np

from calmon.engine.engine import Engine


def newer_scores(engine: Engine, model: str, segment: str, since: float) -> np.ndarray | None:
    """``Policy.scores_of`` for one engine (None for a series it does not know, or when
    no window reaches back to ``since``)."""
    with engine.lock:
        sid = engine.index.find(model, segment)
        if sid is None:
            return None
        return engine.scores.since(sid, since, engine.now_of(model))
