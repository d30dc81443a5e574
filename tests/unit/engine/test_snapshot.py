"""Statistics as a read model (calmon.engine.snapshot, calmon.engine.stats): the
vectorised statistics equal the per-series reference functions, the expensive ones
are refreshed only for changed rows and only when ``metrics.refresh`` is due, and the
plug-in numbers of a snapshot equal a plain numpy computation of the same samples."""

from __future__ import annotations

import numpy as np
import pytest

from calmon.config import from_dict
from calmon.engine import metrics, snapshot, stats
from calmon.engine.engine import Engine
from calmon.engine.rows import Row
from calmon.engine.snapshot import Refresher
from tests.oracle import T0, L, P, assert_close, binary_terms, expected_row


def binned(rng: np.random.Generator, n: int, bins: int) -> tuple[np.ndarray, ...]:
    """Bin sums of n samples of a miscalibrated binary model (empty when n is 0)."""
    p = rng.beta(2, 3, size=n)
    y = (rng.random(n) < np.clip(p * 1.2, 0, 1)).astype(float)
    b = np.minimum((p * bins).astype(int), bins - 1)
    return (np.bincount(b, minlength=bins).astype(float), np.bincount(b, p, bins),
            np.bincount(b, y, bins))


@pytest.fixture(scope="module")
def stack() -> list[tuple[np.ndarray, ...]]:
    """Series from empty and tiny (a few samples, bins at 0 and 1) to large, fixed seed."""
    rng = np.random.default_rng(20)
    sizes = [0, 1, 2, 3, 7, 30, 200, 1000, 5000, 20000, *rng.integers(5, 3000, 20).tolist()]
    out = []
    for n in sizes:
        coarse = binned(rng, int(n), 15)
        fine = binned(rng, int(n), 1000)
        out.append(coarse + fine)
    # a series with every sample at confidence 1 and correct (the edge of the interval)
    ones = (np.r_[np.zeros(14), 50.0], np.r_[np.zeros(14), 50.0], np.r_[np.zeros(14), 50.0])
    fine_ones = tuple(np.r_[np.zeros(999), 50.0] for _ in range(3))
    out.append(ones + fine_ones)
    return out


def test_vectorised_interval_equals_the_per_series_function(stack) -> None:
    count, conf, correct = (np.stack([s[i] for s in stack]) for i in range(3))
    for level in (0.9, 0.5):
        lower, upper = stats.ece_interval_batch(count, conf, correct, level)
        for i, s in enumerate(stack):
            if s[0].sum() == 0:
                assert np.isnan(lower[i]) and np.isnan(upper[i])
                continue
            lo, hi = metrics.ece_interval(s[0], s[1], s[2], level)
            assert lower[i] == pytest.approx(lo, rel=1e-12, abs=1e-15), (i, level)
            assert upper[i] == pytest.approx(hi, rel=1e-12, abs=1e-15), (i, level)


def test_vectorised_smooth_and_debiased_ece_equal_the_per_series_functions(stack) -> None:
    fcount, fconf, fcorrect = (np.stack([s[i] for s in stack]) for i in range(3, 6))
    smooth = stats.smece_batch(fcount, fconf, fcorrect)
    count, conf, correct = (np.stack([s[i] for s in stack]) for i in range(3))
    l2 = stats.ece_l2_debiased_batch(count, conf, correct)
    for i, s in enumerate(stack):
        if s[0].sum() == 0:
            assert np.isnan(smooth[i])
            continue
        assert smooth[i] == pytest.approx(metrics.smece(s[3], s[4], s[5]), rel=1e-12)
        assert l2[i] == pytest.approx(metrics.ece_l2_debiased(s[0], s[1], s[2]), rel=1e-12,
                                      abs=1e-15)


# ---------------------------------------------------------------- the refresher


def feed(engine: Engine, model: str, n: int, start: int, rng: np.random.Generator,
         segments: int = 3) -> tuple[np.ndarray, np.ndarray]:
    p = rng.random(n)
    y = (rng.random(n) < p ** 1.5).astype(int)
    raws = []
    for i in range(n):
        pid = f"{model}-{start + i}"
        raws += [P(pid, T0 + start + i, model=model, prob=float(p[i]),
                   segment={"country": f"c{i % segments}"}), L(pid, int(y[i]))]
    assert engine.feed(raws) == []
    return p, y


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class Counting:
    """Counts the rows each call of the vectorised expensive statistics receives."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.rows: list[int] = []
        real = snapshot.expensive_stats

        def counted(vecs, lay, level):  # type: ignore[no-untyped-def]
            self.rows.append(len(vecs))
            return real(vecs, lay, level)

        monkeypatch.setattr(snapshot, "expensive_stats", counted)
        for name in ("ece_interval", "smece", "from_vector"):  # never one by one
            monkeypatch.setattr(metrics, name, self._forbidden(name))

    @staticmethod
    def _forbidden(name: str):  # type: ignore[no-untyped-def]
        def call(*_a: object, **_k: object) -> None:
            raise AssertionError(f"metrics.{name} called by the refresher")
        return call


def test_expensive_statistics_refresh_only_changed_rows_when_due(monkeypatch) -> None:
    cfg = from_dict({"metrics": {"refresh": "30s", "windows": ["1h", "24h"]}})
    engine = Engine(cfg)
    rng = np.random.default_rng(3)
    feed(engine, "a", 300, 0, rng)
    feed(engine, "b", 300, 0, rng)
    clock = Clock()
    calls = Counting(monkeypatch)
    r = Refresher(engine, clock=clock, slice_rows=10_000)
    first = r.update()
    # 2 models x (__all__ + 3 countries) x 2 windows, all with samples: one stack
    assert calls.rows == [16]
    assert first.age(clock()) == 0.0
    assert all(row.stats.ece_lower is not None for row in first.rows)
    # more samples of model a only, before the refresh is due: plug-in numbers move,
    # nothing expensive is computed, and the age says how old the served ones are
    feed(engine, "a", 100, 300, rng)
    clock.t += 10
    second = r.update()
    assert calls.rows == [16]
    by = {(x.model, x.segment, x.window): x for x in second.rows}
    assert by[("a", "__all__", "1h")].stats.samples == 400
    assert by[("b", "__all__", "1h")].stats is first.by_series[("b", "__all__")][0].stats
    clock.t += 5
    assert second.age(clock()) == 15.0
    # due: only model a's 8 rows are refreshed
    clock.t += 20
    third = r.update()
    assert calls.rows == [16, 8]
    assert third.age(clock()) == 0.0
    # nothing changed: due again later, yet nothing is computed
    clock.t += 60
    r.update()
    assert calls.rows == [16, 8]


def test_a_round_is_sliced_so_the_engine_is_never_held_long(monkeypatch) -> None:
    engine = Engine(from_dict({"metrics": {"windows": ["1h"]}, "recalibration": {"window": "1h"}}))
    feed(engine, "a", 400, 0, np.random.default_rng(4), segments=9)
    clock = Clock()
    calls = Counting(monkeypatch)
    r = Refresher(engine, clock=clock, slice_rows=4)
    while r.update().stale_since is not None or not calls.rows:
        pass
    assert calls.rows == [4, 4, 2]  # __all__ + 9 countries, 4 rows a slice


def one_by_one(engine: Engine) -> list[Row]:
    """Every row computed one at a time by the per-series functions
    (``metrics.from_vector``) from the engine's read interface."""
    m = engine.cfg.metrics
    state = engine.read_state(-1)
    shown = sorted(state.with_data, key=lambda s: state.series[s])
    keys = [(sid, w) for sid in shown for w in range(state.windows)]
    est = engine.estimates(shown, engine.pending_counts(state.nows), state.nows)
    out = []
    for (sid, w), sums in zip(keys, engine.window_sums(keys, state.nows)):
        vec = sums.vec if sums.vec is not None else np.zeros(engine.layout.size)
        binary = state.binary[sid]
        st = metrics.from_vector(vec, engine.layout, binary, m.mce_min_samples, m.interval_level)
        out.append(Row(*state.series[sid], m.windows[w].name, binary, st, sums.classwise_ece,
                       est[(sid, w)], sums.worst_class))
    return out


def test_snapshot_rows_equal_a_plain_computation_and_the_per_series_functions() -> None:
    cfg = from_dict({})
    engine = Engine(cfg)
    rng = np.random.default_rng(5)
    pa, ya = feed(engine, "a", 500, 0, rng)
    snap = Refresher(engine).update(full=True)
    reference = one_by_one(engine)
    assert [(x.model, x.segment, x.window) for x in snap.rows] == [
        (x.model, x.segment, x.window) for x in reference]
    for s_row, v_row in zip(snap.rows, reference):
        got, want = s_row.stats.as_row(), v_row.stats.as_row()
        for key, v in want.items():
            if v is None:
                assert got[key] is None, key
            else:
                assert got[key] == pytest.approx(v, rel=1e-12, abs=1e-15), key
        assert s_row.estimates == v_row.estimates
    exp = expected_row(binary_terms(pa, ya.astype(float)), 15, 1000)
    row = snap.by_series[("a", "__all__")][0].stats.as_row()
    for key in ("ece", "mce", "ace", "brier", "nll", "accuracy", "mean_confidence"):
        assert_close(row[key], exp[key], 1e-9, key)
