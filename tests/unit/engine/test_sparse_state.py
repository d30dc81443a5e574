"""Sparse bucket state: a bucket holds only its nonzero entries until a dense vector
costs less, and whichever way a batch is summed (dense rows or sparse entries) and
however a bucket is stored, the numbers are the plain numpy ones."""

from __future__ import annotations

import numpy as np
import pytest

from calmon.config import Window, from_dict
from calmon.engine import windows
from calmon.engine.engine import Engine
from calmon.engine.estimates import ScoreHist
from calmon.engine.snapshot import full_snapshot
from calmon.engine.windows import BUCKETS, CONF_SCALE, Samples, Windows, dense_cells
from tests.oracle import T0, L, P, binary_terms, right_closed_bins


def _samples(rng: np.random.Generator, n: int, series: int, span: float) -> Samples:
    p = rng.uniform(0, 1, n)
    p[:3] = [0.0, 1.0, 0.5]  # edges and an exact zero confidence
    y = rng.integers(0, 2, n)
    t = binary_terms(p, y)
    return Samples(rng.integers(0, series, n).astype(np.int64), T0 + rng.uniform(0, span, n),
                   t.conf, y.astype(np.int64), t.acc.astype(np.int64), t.brier, t.nll)


def _expected(s: Samples, sid: int, bins: int, fine: int) -> np.ndarray:
    """Count, conf and correct per bin and fine bin, from plain numpy."""
    m = s.sid == sid
    conf, y = s.conf[m], s.correct[m].astype(np.float64)
    out = []
    for k in (bins, fine):
        b = right_closed_bins(conf, k)
        out += [np.bincount(b, minlength=k), np.bincount(b, conf, minlength=k),
                np.bincount(b, y, minlength=k)]
    return np.concatenate(out)


@pytest.mark.parametrize("dense_rows", [0, 1 << 40])
def test_totals_equal_numpy_whichever_way_a_batch_is_summed(
        dense_rows: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(windows, "DENSE_ROWS", dense_rows)
    cfg = from_dict({})
    rng = np.random.default_rng(19)
    s = _samples(rng, 3000, 40, 3000.0)
    w = Windows(cfg.metrics.windows, 15, 1000)
    now = float(s.ts.max())
    for part in np.array_split(np.arange(3000), 7):  # several batches
        w.add(Samples(*(getattr(s, f)[part] for f in ("sid", "ts", "conf", "correct", "acc",
                                                      "brier", "nll"))), now)
    lay = w.layout
    for sid in range(40):
        vec = w.totals(sid, 0, now)
        assert vec is not None
        got = np.concatenate([vec[:3 * 15], vec[lay.fcount:lay.acc]])
        want = _expected(s, sid, 15, 1000)
        scale = np.concatenate([np.ones(15), np.full(15, CONF_SCALE), np.ones(15),
                                np.ones(1000), np.full(1000, CONF_SCALE), np.ones(1000)])
        np.testing.assert_allclose(got / scale, want, rtol=0, atol=1e-9 * max(1, want.max()))
        m = s.sid == sid
        assert abs(vec[lay.brier] / CONF_SCALE - s.brier[m].sum()) < 1e-6
        assert vec[lay.acc] == s.acc[m].sum()


def test_one_sample_buckets_are_small_and_busy_ones_dense() -> None:
    cfg = from_dict({})
    w = Windows(cfg.metrics.windows, 15, 1000)
    one = Samples(np.array([0]), np.array([T0]), np.array([0.3]), np.array([1]),
                  np.array([0]), np.array([0.49]), np.array([1.2]))
    w.add(one, T0)
    cells = [c for tab in w._data for b in tab.values() for c in b.values()]
    # count, conf, correct, fine count, conf, correct, Brier, NLL (accuracy is 0)
    assert len(cells) == 3 and all(c.shape == (2, 8) for c in cells)
    rng = np.random.default_rng(3)
    busy = _samples(rng, 20_000, 1, 60.0)
    busy.sid[:] = 1
    w.add(busy, float(busy.ts.max()))
    busy_cells = [c for tab in w._data for c in tab[1].values()]
    assert busy_cells and all(c.shape == (w.layout.size,) for c in busy_cells)


def test_sparse_and_dense_paths_leave_the_same_state(monkeypatch: pytest.MonkeyPatch) -> None:
    def run(dense_rows: int) -> list:
        monkeypatch.setattr(windows, "DENSE_ROWS", dense_rows)
        e = Engine(from_dict({"segments": {"slices": [["country"], ["device"]]}}))
        rng = np.random.default_rng(8)
        raws = []
        for i in range(1500):
            seg = {"country": f"c{i % 30}", "device": f"d{i % 7}"}
            ts = T0 + float(rng.uniform(0, 7 * 86400)) if i % 5 else T0 + 7 * 86400 - i
            raws += [P(f"x{i}", ts, prob=float(rng.uniform()), segment=seg), L(f"x{i}", int(i % 2))]
        for k in range(0, len(raws), 400):
            e.feed(raws[k:k + 400])
        full_snapshot(e)
        return [sorted((int(k[0]), int(k[1]), v.tobytes()) for k, v in zip(*dense_cells(t)))
                for t in e.snapshot()["windows"]]

    sparse, dense = run(0), run(1 << 40)
    assert sum(len(t) for t in sparse) > 500
    assert sparse == dense


def test_score_histograms_hold_the_plain_counts_in_the_cell_their_samples_make() -> None:
    """A score histogram's buckets (``ScoreHist.add``, merged as sparse entries) hold, over
    batches that meet buckets already held sparse or dense, the plain numpy counts of
    every (series, bucket); a cell is dense exactly when half its bins or more are used."""
    bins, widths = 10, (3600.0, 86400.0)
    h = ScoreHist(tuple(Window(f"w{i}", w) for i, w in enumerate(widths)), bins)
    rng = np.random.default_rng(37)
    seen: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    for k in range(40):  # batches of 1-300 samples; busy series 0-2 fill their cells
        n = int(rng.integers(1, 300))
        sid = np.where(rng.random(n) < 0.3, rng.integers(0, 3, n), rng.integers(0, 400, n))
        ts = T0 + rng.uniform(0, 3000, n)
        conf = rng.uniform(0, 1, n)
        conf[:1] = 1.0 if k % 2 else 0.0
        h.add(sid.astype(np.int64), ts, conf, T0 + 3000)
        seen.append((sid, ts, conf))
    sid, ts, conf = (np.concatenate(c) for c in zip(*seen))
    sparse = dense = 0
    for w, (part, width) in enumerate(zip(h.pack(), widths)):
        keys, vecs = dense_cells(part)
        bucket = np.floor(ts / (width / BUCKETS)).astype(np.int64)
        want = {}
        for s_, b_ in set(zip(sid.tolist(), bucket.tolist())):
            m = (sid == s_) & (bucket == b_)
            want[(s_, b_)] = np.bincount(right_closed_bins(conf[m], bins), minlength=bins)
        got = {(int(a), int(b)): v for (a, b), v in zip(keys.tolist(), vecs)}
        assert sorted(got) == sorted(want)
        for key, v in want.items():
            assert np.array_equal(got[key], v), (w, key)
            cell = h._data[w][key[0]][key[1]]
            assert cell.dtype == np.int64
            assert (cell.ndim == 1) == (np.count_nonzero(v) >= bins // 2), (w, key)
            dense += cell.ndim == 1
            sparse += cell.ndim == 2
    assert sparse > 100 and dense > 10  # both kinds of cell met and merged into


def test_a_feeds_bin_delta_is_each_series_plain_counts() -> None:
    """``last_delta.bins`` (the exported per-bin counters' increments): per series a
    feed joined samples into, the count, confidence sum and positives of each bin, as
    plain numpy counts them; series the feed joined nothing into are absent."""
    e = Engine(from_dict({"segments": {"slices": [["country"]]}}))
    bins = e.cfg.metrics.bins
    rng = np.random.default_rng(37)
    p, y = rng.uniform(0, 1, 600), rng.integers(0, 2, 600)
    country = [f"c{i % 7}" for i in range(600)]
    raws = []
    for i in range(600):
        raws += [P(f"x{i}", T0 + i, model=f"m{i % 2}", prob=float(p[i]),
                   segment={"country": country[i]}),
                 L(f"x{i}", int(y[i]))]
    e.feed(raws[:800])  # 400 predictions, their labels
    e.feed([*raws[800:], P("lone", T0 + 700, model="m9", prob=0.5)])
    got = e.last_delta.bins
    joined = np.arange(400, 600)
    want = {}
    for i in joined.tolist():
        for seg in ("__all__", f"country={country[i]}"):
            want.setdefault((f"m{i % 2}", seg), []).append(i)
    assert sorted(got) == sorted(want)
    for key, rows in want.items():
        b = right_closed_bins(p[rows], bins)
        expected = np.stack([np.bincount(b, minlength=bins),
                             np.bincount(b, p[rows], minlength=bins),
                             np.bincount(b, y[rows], minlength=bins)])
        assert np.array_equal(got[key][0], expected[0]), key
        np.testing.assert_allclose(got[key][1], expected[1], rtol=1e-12)
        assert np.array_equal(got[key][2], expected[2]), key
