"""``calmon.engine.summed`` (group mode, contract §8): the statistics of several engines
(one per task) read as one: each (model, segment, window)'s counts and bins equal the
stream's, computed here with numpy from the records."""

from __future__ import annotations

import numpy as np

from calmon.config import Config
from calmon.engine.engine import Engine
from calmon.engine.snapshot import Refresher
from calmon.engine.summed import SummedEngine
from tests.oracle import T0, L, P, per_bin, right_closed_bins

N = 600
COUNTRIES = ("US", "DE", "FR")


def test_tasks_summed_equal_the_stream() -> None:
    rng = np.random.default_rng(37)
    probs = rng.uniform(0, 1, N)
    ys = (rng.uniform(0, 1, N) < probs).astype(int)
    countries = [COUNTRIES[i] for i in rng.integers(0, 3, N)]
    task_of = rng.integers(0, 3, N)  # the partition each id hashes to
    cfg = Config()
    engines = [Engine(cfg) for _ in range(3)]
    for t, engine in enumerate(engines):
        mine = np.flatnonzero(task_of == t)
        # a task's own clock: its records span less time than the stream's
        batch = [P(f"id{i}", T0 + float(i), "m", prob=float(probs[i]),
                   segment={"country": countries[i]}) for i in mine]
        batch += [L(f"id{i}", int(ys[i]), T0 + float(i) + 1.0) for i in mine]
        engine.feed(batch, not_after=T0 + 10 * N)
    snap = Refresher(SummedEngine(cfg, lambda: engines)).update()
    rows = {(r.model, r.segment, r.window): r for r in snap.rows}
    for w in ("1h", "24h"):
        got = rows[("m", "__all__", w)].stats
        count, csum, ksum = per_bin(probs, ys.astype(float), cfg.metrics.bins)
        assert got.samples == N
        np.testing.assert_array_equal(got.bins.count, count)
        np.testing.assert_allclose(got.bins.conf, csum, atol=1e-9)
        np.testing.assert_array_equal(got.bins.correct, ksum)
    for c in COUNTRIES:
        sel = np.array([x == c for x in countries])
        got = rows[("m", f"country={c}", "24h")].stats
        assert got.samples == int(sel.sum())
        idx = right_closed_bins(probs[sel], cfg.metrics.bins)
        np.testing.assert_array_equal(got.bins.count,
                                      np.bincount(idx, minlength=cfg.metrics.bins))
    assert snap.counters["joined"] == N
    assert snap.pending == 0
