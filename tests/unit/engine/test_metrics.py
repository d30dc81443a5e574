"""Window metrics against an independent numpy implementation of the contract.

Samples go in as JSON bytes through ``Engine.feed``; every prediction ts lies in
one 225 s bucket of the 1h window, so every joined sample is in every window.
"""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.calibration import calibration_curve

from calmon.config import from_dict
from calmon.engine.engine import Engine
from calmon.engine.snapshot import full_snapshot
from tests.oracle import (
    T0,
    L,
    P,
    PerSample,
    assert_close,
    binary_from_logits,
    binary_terms,
    expected_row,
    monte_carlo_floor,
    multiclass_from_logits,
    multiclass_terms,
    per_bin,
)

TOL = 1e-9
METRICS = ("ece", "mce", "ace", "brier", "nll", "accuracy", "mean_confidence",
           "observed_rate", "observed_over_expected", "ece_l2_debiased")
WINDOWS = ("1h", "24h", "7d")


def edge_points(bins: int) -> list[float]:
    """0, 1, every edge spelt k/B and np.linspace(0, 1, B+1)[k], the same for 15 bins,
    and the floats just either side of each edge."""
    pts: list[float] = [0.0, 1.0]
    for b in sorted({bins, 15}):
        lin = np.linspace(0.0, 1.0, b + 1)
        for k in range(b + 1):
            pts += [k / b, float(lin[k])]
            pts += [float(np.nextafter(k / b, 2.0)), float(np.nextafter(k / b, -1.0))]
    return [p for p in pts if 0.0 <= p <= 1.0]


def binary_prob_data(rng: np.random.Generator, bins: int, n_random: int = 600):
    pts = edge_points(bins)
    p = np.array(pts * 3 + [0.0] * 7 + [1.0] * 7 + rng.random(n_random).tolist())
    y = (rng.random(len(p)) < p).astype(np.int64)
    y[:4] = [1, 0, 0, 1]  # 0 scored as a positive and 1 as a negative: NLL clipping
    y[len(pts) * 3:len(pts) * 3 + 2] = 1  # p == 0 with y == 1
    y[len(pts) * 3 + 7:len(pts) * 3 + 9] = 0  # p == 1 with y == 0
    return p, y


def binary_logit_data(rng: np.random.Generator, n: int = 600):
    z = np.concatenate([rng.normal(0.0, 3.0, n), [0.0, 0.0, 40.0, -40.0, 700.0, -700.0]])
    y = (rng.random(len(z)) < 1 / (1 + np.exp(-np.clip(z, -50, 50)))).astype(np.int64)
    y[-4:] = [0, 1, 0, 1]  # confident and wrong: clipped NLL
    return z, y


def multiclass_prob_data(rng: np.random.Generator, k: int, n: int = 500):
    probs = rng.dirichlet(np.full(k, 0.7), n)
    onehot = np.eye(k)[rng.integers(0, k, 12)]  # top-label confidence exactly 1
    probs = np.concatenate([probs, onehot])
    y = np.array([rng.choice(k, p=row / row.sum()) for row in probs])
    y[-3:] = (probs[-3:].argmax(axis=1) + 1) % k  # confidence 1 and wrong
    return probs, y


def multiclass_logit_data(rng: np.random.Generator, k: int, n: int = 500):
    z = rng.normal(0.0, 2.5, (n, k))
    extreme = np.zeros((4, k))
    extreme[:, 0] = [60.0, -60.0, 0.0, 900.0]
    z = np.concatenate([z, extreme])
    y = rng.integers(0, k, len(z))
    y[-1] = 1  # p(y) underflows: clipped at 1e-15
    return z, y


def feed_model(engine: Engine, model: str, scores: list[dict], y: np.ndarray,
               rng: np.random.Generator) -> None:
    """Predictions and their labels, in shuffled batches (labels sometimes first)."""
    raws = []
    for i, (score, label) in enumerate(zip(scores, y.tolist())):
        pid = f"{model}-{i}"
        ts = T0 + (i % 200)  # all inside bucket [T0, T0 + 225) of the 1h window
        raws.append([P(pid, ts, model, **score), L(pid, int(label), ts + 5.0)])
    order = rng.permutation(len(raws))
    batch = []
    for j in order.tolist():
        pair = raws[j]
        batch += pair if j % 3 else pair[::-1]
        if len(batch) >= 256:
            assert engine.feed(batch) == []
            batch = []
    assert engine.feed(batch) == []


def rows_of(engine: Engine, model: str):
    view = full_snapshot(engine)
    rows = {r.window: r for r in view.rows if r.model == model and r.segment == "__all__"}
    assert sorted(rows) == sorted(WINDOWS)
    return rows


def check_rows(engine: Engine, model: str, ref: PerSample, bins: int, fine_bins: int) -> None:
    expected = expected_row(ref, bins, fine_bins)
    exp_count, exp_conf, exp_correct = per_bin(ref.conf, ref.correct, bins)
    for window, row in rows_of(engine, model).items():
        st = row.stats
        assert st.samples == expected["samples"] == len(ref.conf), (model, window)
        for name in METRICS:
            assert_close(getattr(st, name), expected[name], TOL, f"{model} {window} {name}")
        # the per-bin sums behind the reliability diagram
        np.testing.assert_array_equal(st.bins.count, exp_count)
        # sums of up to n confidences: each mean to 1e-9, so each sum to n * 1e-9
        assert (np.abs(st.bins.conf - exp_conf) <= TOL * np.maximum(exp_count, 1)).all()
        np.testing.assert_array_equal(st.bins.correct, exp_correct)


CASES = [(15, 1000), (10, 1000), (7, 7), (10, 50)]


@pytest.mark.parametrize(("bins", "fine_bins"), CASES)
def test_metrics_match_numpy_reference(bins: int, fine_bins: int) -> None:
    rng = np.random.default_rng(bins * 1000 + fine_bins)
    cfg = from_dict({"metrics": {"bins": bins, "fine_bins": fine_bins}})
    engine = Engine(cfg)

    p, yp = binary_prob_data(rng, bins)
    feed_model(engine, "bin-prob", [{"prob": float(v)} for v in p], yp, rng)
    z, yz = binary_logit_data(rng)
    feed_model(engine, "bin-logit", [{"logit": float(v)} for v in z], yz, rng)
    refs: dict[str, PerSample] = {
        "bin-prob": binary_terms(p, yp),
        "bin-logit": binary_from_logits(z, yz),
    }
    for k in (3, 10):
        probs, y = multiclass_prob_data(rng, k)
        feed_model(engine, f"mc{k}-probs", [{"probs": row.tolist()} for row in probs], y, rng)
        refs[f"mc{k}-probs"] = multiclass_terms(probs, y)
        zz, y = multiclass_logit_data(rng, k)
        feed_model(engine, f"mc{k}-logits", [{"logits": row.tolist()} for row in zz], y, rng)
        refs[f"mc{k}-logits"] = multiclass_from_logits(zz, y)

    c = full_snapshot(engine).counters
    total = sum(len(r.conf) for r in refs.values())
    assert (c["predictions"], c["labels"], c["joined"]) == (total, total, total)
    assert (c["invalid"], c["expired"], c["duplicates"]) == (0, 0, 0)
    for model, ref in refs.items():
        check_rows(engine, model, ref, bins, fine_bins)


def test_edges_go_to_the_bin_they_close() -> None:
    """Right-closed: k/15 (however it is spelt) belongs to bin k-1, 0 to bin 0."""
    engine = Engine(from_dict({}))
    lin = np.linspace(0.0, 1.0, 16)
    ps = [0.0] + [k / 15 for k in range(1, 16)] + [float(lin[k]) for k in range(1, 16)]
    raws = []
    for i, p in enumerate(ps):
        raws += [P(f"e{i}", T0, prob=p), L(f"e{i}", 1)]
    engine.feed(raws)
    row = rows_of(engine, "m")["1h"]
    expected = np.zeros(15)
    expected[0] = 1  # p == 0
    for k in range(1, 16):
        expected[k - 1] += 2  # k/15 and linspace[k]
    np.testing.assert_array_equal(row.stats.bins.count, expected)
    # and just above an edge is the next bin
    engine2 = Engine(from_dict({}))
    engine2.feed([x for k in range(1, 15) for x in (
        P(f"a{k}", T0, prob=float(np.nextafter(k / 15, 2.0))), L(f"a{k}", 0))])
    above = rows_of(engine2, "m")["1h"].stats.bins.count
    np.testing.assert_array_equal(above, np.r_[0, np.ones(14)])


@pytest.mark.parametrize("bins", [15, 10, 7])
def test_binary_bins_match_sklearn_calibration_curve(bins: int) -> None:
    rng = np.random.default_rng(7 + bins)
    engine = Engine(from_dict({"metrics": {"bins": bins}}))
    p, y = binary_prob_data(rng, bins, n_random=2000)
    feed_model(engine, "m", [{"prob": float(v)} for v in p], y, rng)
    z, yz = binary_logit_data(rng, 2000)
    feed_model(engine, "lg", [{"logit": float(v)} for v in z], yz, rng)
    for model, (yy, pp) in {"m": (y, p), "lg": (yz, 1 / (1 + np.exp(-z)))}.items():
        prob_true, prob_pred = calibration_curve(yy, pp, n_bins=bins, strategy="uniform")
        for row in rows_of(engine, model).values():
            b = row.stats.bins
            nz = b.count > 0
            assert nz.sum() == len(prob_true)
            np.testing.assert_allclose(b.conf[nz] / b.count[nz], prob_pred, rtol=0, atol=1e-9)
            np.testing.assert_allclose(b.correct[nz] / b.count[nz], prob_true, rtol=0,
                                       atol=1e-9)


@pytest.mark.parametrize("n", [40, 3000])
def test_noise_floor_matches_monte_carlo(n: int) -> None:
    rng = np.random.default_rng(n)
    engine = Engine(from_dict({}))
    p = rng.beta(0.8, 2.5, n)
    p[:5] = [0.0, 1.0, 0.5, 1 / 15, 14 / 15]
    y = (rng.random(n) < p).astype(np.int64)
    feed_model(engine, "m", [{"prob": float(v)} for v in p], y, rng)
    probs = rng.dirichlet(np.ones(4), n)
    yk = rng.integers(0, 4, n)
    feed_model(engine, "k4", [{"probs": r.tolist()} for r in probs], yk, rng)
    for model, ref in {"m": binary_terms(p, y), "k4": multiclass_terms(probs, yk)}.items():
        count, csum, _ = per_bin(ref.conf, ref.correct, 15)
        mean_conf = np.divide(csum, count, out=np.zeros(15), where=count > 0)
        floor = monte_carlo_floor(count, mean_conf, 40_000, rng)
        assert floor > 0.001
        for row in rows_of(engine, model).values():
            assert_close(row.stats.noise_floor, floor, 1e-3, f"{model} noise floor")


def test_constant_prediction_single_bin() -> None:
    """All in one bin: ECE = MCE = ACE = |p - rate|; o/e = rate / p (MCE counts the bin
    because it holds metrics.mce_min_samples samples)."""
    engine = Engine(from_dict({"metrics": {"mce_min_samples": 10}}))
    y = [1] * 3 + [0] * 7
    engine.feed([x for i, v in enumerate(y) for x in (P(f"c{i}", T0, prob=0.2), L(f"c{i}", v))])
    st = rows_of(engine, "m")["24h"].stats
    assert st.samples == 10
    for name in ("ece", "mce", "ace"):
        assert_close(getattr(st, name), 0.1, TOL, name)
    assert_close(st.observed_rate, 0.3, TOL, "observed_rate")
    assert_close(st.observed_over_expected, 1.5, TOL, "o/e")
    assert_close(st.accuracy, 0.7, TOL, "accuracy")
    assert_close(st.brier, (3 * 0.8**2 + 7 * 0.2**2) / 10, TOL, "brier")
    assert_close(st.nll, -(3 * np.log(0.2) + 7 * np.log(0.8)) / 10, TOL, "nll")


def test_multiclass_binary_only_metrics_are_null() -> None:
    engine = Engine(from_dict({}))
    engine.feed([P("a", T0, probs=[0.2, 0.7, 0.1]), L("a", 1),
                 P("b", T0, logits=[0.0, 1.0, 3.0]), L("b", 0)])
    for row in rows_of(engine, "m").values():
        assert row.binary is False
        assert row.stats.observed_rate is None
        assert row.stats.observed_over_expected is None
        assert row.stats.ece is not None and row.stats.samples == 2
