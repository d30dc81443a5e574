"""The maps built over the series index (each combo's and series' model, each combo's
series as flat arrays) are brought up to date by appending the ids added since, and
built anew when an id was dropped or reused: after every feed of a stream whose models
and segments go idle, are dropped and come back (their ids reused), they are what a
build from scratch gives."""

from __future__ import annotations

import numpy as np

from calmon.config import from_dict
from calmon.engine.engine import Engine
from tests.oracle import T0, L, P


def test_maps_kept_up_to_date_equal_maps_built_from_scratch() -> None:
    e = Engine(from_dict({"metrics": {"windows": ["1h"]}, "join": {"ttl": "1h"},
                          "recalibration": {"window": "1h"},
                          "segments": {"slices": [["country"]]}}))
    rng = np.random.default_rng(37)
    appended = rebuilt = 0
    for k in range(60):
        t = T0 + 1800 * k
        live = [f"m{j}" for j in range(6) if (k // (3 + j)) % 2 == 0]  # models come and go
        raws = []
        for i in range(int(rng.integers(1, 40))):
            model = live[i % len(live)] if live else "m0"
            pid = f"r{k}-{i}"
            raws += [P(pid, t + i, model=model, prob=float(rng.uniform()),
                       segment={"country": f"c{(k // 4 + i) % 5}"}), L(pid, i % 2)]
        before = e.index.rewrites
        e.feed(raws)
        rebuilt += e.index.rewrites != before
        appended += e.index.rewrites == before
        ix = e.index
        models = dict(e._model_idx)
        e._maps()
        ix._arrays()
        want_combo = [models.get(m, 0) for m, _ in ix.combos]
        want_series = [models.get(m, 0) for m, _ in ix.series]
        assert e._combo_model.tolist() == want_combo, k
        assert e._series_model.tolist() == want_series, k
        assert ix._len.tolist() == [len(c) for c in ix.combo_series], k
        assert ix._flat.tolist() == [s for c in ix.combo_series for s in c], k
        assert ix._start.tolist() == np.cumsum([0] + [len(c) for c in ix.combo_series])[
            :-1].tolist(), k
    assert rebuilt > 3 and appended > 10  # both ways taken
