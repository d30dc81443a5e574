"""An eviction pass passes over the series whose floor has not moved since the last pass
(``calmon.engine.sweep``): on a seeded stream of small batches, each model on its own
clock (most batches move few clocks), with a forget and a restore on the way, the tables
hold exactly what a pass over every series leaves. Passes whose floors all lie below
the lowest bucket held (the table's bound, ``sweep.evict``) are skipped too."""

from __future__ import annotations

import math

import numpy as np

from calmon.config import Window
from calmon.engine import sweep
from calmon.engine.estimates import ScoreHist
from calmon.engine.windows import Samples, Windows
from tests.oracle import T0, binary_terms

WINDOWS = (Window("1h", 3600.0), Window("24h", 86400.0))
MODELS = 3
SERIES = 12  # series s belongs to model s % MODELS


def _packed(tables: Windows | ScoreHist) -> list[bytes]:
    return [a.tobytes() for part in tables.pack() for a in part.values()]


def _step(rng: np.random.Generator, clocks: np.ndarray) -> tuple[Samples, np.ndarray]:
    """A batch of 0-6 samples predicted up to 2 h before their model's clock, which may
    move first; returns it and each sample's model's now."""
    moving = rng.random(MODELS) < 0.3
    clocks += moving * rng.uniform(0, 900, MODELS)
    n = int(rng.integers(0, 7))
    sid = rng.integers(0, SERIES, n).astype(np.int64)
    now = clocks[sid % MODELS]
    ts = now - rng.uniform(0, 7200, n)
    p = rng.uniform(0, 1, n)
    y = rng.integers(0, 2, n)
    t = binary_terms(p, y)
    return Samples(sid, ts, t.conf, y.astype(np.int64), t.acc.astype(np.int64), t.brier,
                   t.nll), now


def test_an_eviction_that_skips_unmoved_floors_keeps_what_a_full_pass_keeps() -> None:
    rng = np.random.default_rng(39)
    clocks = np.full(MODELS, T0)
    fast, full = Windows(WINDOWS, 4, 8), Windows(WINDOWS, 4, 8)
    fast_h, full_h = ScoreHist(WINDOWS, 4), ScoreHist(WINDOWS, 4)
    skipped = bounded = 0
    for step in range(1500):
        s, now = _step(rng, clocks)
        for w in (fast, full):
            w.add(s, now)
        for h in (fast_h, full_h):
            h.add(s.sid, s.ts, s.conf, now)
        nows = clocks[np.arange(SERIES) % MODELS]
        before = [dict(tab) for tab in fast._data]
        moved = [sweep.moved(fast._swept[w], fast.current(w, nows) - fast.keep)
                 for w in range(len(WINDOWS))]
        skipped += sum(m is not None and len(m) < len(tab) for m, tab in zip(moved, before))
        for t in (full, full_h):  # every series, every pass: no floors, no bound kept
            t._swept = [None] * len(WINDOWS)
            t._low = [-math.inf] * len(WINDOWS)
        bounded += sum(low > (fast.current(w, nows) - fast.keep).max()
                       for w, low in enumerate(fast._low))
        for tables in (fast, full, fast_h, full_h):
            tables.evict(nows)
        if step == 500:  # a model's series forgotten (a class reset), its clock anew
            gone = [sid for sid in range(SERIES) if sid % MODELS == 1]
            for tables in (fast, full, fast_h, full_h):
                tables.forget(gone)
        if step == 1000:  # a restart from the packed state
            for mine, twin in ((fast, full), (fast_h, full_h)):
                mine.restore(twin.pack())
        if step % 5 == 0 or step in (500, 1000, 1499):
            assert _packed(fast) == _packed(full), step
            assert _packed(fast_h) == _packed(full_h), step
    assert skipped > 500  # the skip was taken: most passes looked at few series
    assert bounded > 100  # and passes with every floor below the held buckets skipped
    assert fast.cells() > 0
