"""The estimation map against its references: scikit-learn's IsotonicRegression
(out_of_bounds="clip", y_min=0, y_max=1) fitted on the fine bins' mean confidences
weighted by their counts, and the band's variances computed prediction by prediction
in plain numpy, to 1e-9. Binary with thresholds 0.5 and 0.1 and with a decision of its
own, and multiclass."""

from __future__ import annotations

from statistics import NormalDist

import numpy as np
import pytest
from sklearn.isotonic import IsotonicRegression

from calmon.engine.estmap import Side, fit_stack, read, read_values

F = 200  # fine bins


def fine_index(p: np.ndarray) -> np.ndarray:
    """Right-closed fine bins, bin 0 also holding 0 (as the engine bins)."""
    return np.searchsorted(np.linspace(0, 1, F + 1)[1:-1], p, side="left")


def labelled(rng: np.random.Generator, n: int, skew: float):
    """n labelled confidences whose truth is a skewed function of them."""
    p = rng.beta(2, 2, n)
    y = rng.random(n) < p ** skew
    b = fine_index(p)
    return (np.bincount(b, minlength=F).astype(float), np.bincount(b, p, minlength=F),
            np.bincount(b, y.astype(float), minlength=F))


def sklearn_fit(count, conf, correct):
    nz = count > 0
    x, y, w = conf[nz] / count[nz], correct[nz] / count[nz], count[nz]
    ir = IsotonicRegression(out_of_bounds="clip", y_min=0, y_max=1).fit(x, y, sample_weight=w)
    return ir, x, w


def reference(count, conf, correct, pending_p, flip, level=0.9):
    """Per pending prediction: its map value at its (fine bin, side)'s mean confidence;
    the band from the Poisson-binomial variance and each level set's binomial variance
    reaching the sum through the interpolation weights (np.interp of unit vectors)."""
    ir, x, w = sklearn_fit(count, conf, correct)
    b = fine_index(pending_p)
    key = b * 2 + flip
    means = np.bincount(key, pending_p, minlength=2 * F) / np.maximum(
        np.bincount(key, minlength=2 * F), 1)
    m = means[key]
    g = ir.predict(m)
    q = np.where(flip, 1 - g, g)
    fitted = ir.predict(x)
    sets = np.concatenate(([0], np.cumsum(np.abs(np.diff(fitted)) > 1e-12)))
    weights = np.stack([np.interp(m, x, np.eye(len(x))[k]) for k in range(len(x))], axis=1)
    sign = np.where(flip, -1.0, 1.0)
    reach = np.zeros(sets.max() + 1)
    np.add.at(reach, sets, (sign[:, None] * weights).sum(axis=0))
    nset = np.bincount(sets, w)
    vset = np.bincount(sets, fitted * w) / nset
    var = np.sum(q * (1 - q)) + np.sum(reach ** 2 * vset * (1 - vset) / nset)
    n = len(q)
    acc = q.sum() / n
    z = NormalDist().inv_cdf(0.95 if level == 0.9 else 0.5 + level / 2)
    half = z * np.sqrt(var) / n
    return acc, g.mean(), var, max(0, acc - half), min(1, acc + half), q.sum()


def sides_of(p: np.ndarray, flip: np.ndarray) -> list[Side]:
    b = fine_index(p)
    return [Side(np.bincount(b[flip == f], minlength=F).astype(float),
                 np.bincount(b[flip == f], p[flip == f], minlength=F), bool(f))
            for f in (0, 1)]


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("decision", ["0.5", "0.1", "field"])
def test_binary_map_estimates_and_band_equal_the_reference(seed: int, decision: str) -> None:
    rng = np.random.default_rng(seed)
    count, conf, correct = labelled(rng, int(rng.integers(300, 20000)), rng.uniform(0.5, 2))
    [fit] = fit_stack(count[None], conf[None], correct[None])
    assert fit is not None
    ir, x, _ = sklearn_fit(count, conf, correct)
    # the map itself: its points and values are sklearn's on the fine bins
    np.testing.assert_allclose(fit.x, x, rtol=0, atol=1e-12)
    np.testing.assert_allclose(fit.y, ir.predict(x), rtol=0, atol=1e-9)
    grid = np.linspace(-0.1, 1.1, 777)
    np.testing.assert_allclose(np.interp(grid, fit.x, fit.y), ir.predict(grid), atol=1e-9)
    pend = rng.beta(1.5, 3, int(rng.integers(1, 3000)))
    if decision == "field":  # the model's own decision, sometimes against its score
        positive = (pend >= 0.3) ^ (rng.random(len(pend)) < 0.1)
    else:
        positive = pend >= float(decision)
    flip = (~positive).astype(int)
    got = read(fit, sides_of(pend, flip), binary=True)
    acc, pos, var, lo, hi, corr = reference(count, conf, correct, pend, flip)
    assert got.pending == len(pend)
    assert got.accuracy == pytest.approx(acc, abs=1e-9)
    assert got.correct == pytest.approx(corr, abs=1e-9 * len(pend))
    assert got.positive_rate == pytest.approx(pos, abs=1e-9)
    assert got.variance == pytest.approx(var, rel=1e-9, abs=1e-12)
    band = got.band(0.9)
    assert band[0] == pytest.approx(lo, abs=1e-9) and band[1] == pytest.approx(hi, abs=1e-9)


@pytest.mark.parametrize("seed", range(6))
def test_multiclass_reads_the_top_label_through_the_map(seed: int) -> None:
    rng = np.random.default_rng(100 + seed)
    k = int(rng.integers(3, 12))
    n = int(rng.integers(500, 20000))
    z = rng.normal(0, 2, (n, k))
    probs = np.exp(z) / np.exp(z).sum(axis=1, keepdims=True)
    truth = np.exp(0.7 * z) / np.exp(0.7 * z).sum(axis=1, keepdims=True)
    y = (rng.random(n)[:, None] > truth.cumsum(axis=1)).sum(axis=1)
    top = probs.max(axis=1)
    right = (probs.argmax(axis=1) == y).astype(float)
    b = fine_index(top)
    count, conf = np.bincount(b, minlength=F).astype(float), np.bincount(b, top, minlength=F)
    correct = np.bincount(b, right, minlength=F)
    [fit] = fit_stack(count[None], conf[None], correct[None])
    pend = np.exp(rng.normal(0, 2, (999, k)))
    ptop = (pend / pend.sum(axis=1, keepdims=True)).max(axis=1)
    flip = np.zeros(len(ptop), int)
    got = read(fit, sides_of(ptop, flip)[:1], binary=False)
    acc, _, var, lo, hi, _ = reference(count, conf, correct, ptop, flip)
    assert got.positive is None and got.positive_rate is None
    assert got.accuracy == pytest.approx(acc, abs=1e-9)
    assert got.variance == pytest.approx(var, rel=1e-9)
    assert got.band(0.9) == pytest.approx((lo, hi), abs=1e-9)


def test_a_stack_fits_each_series_as_alone() -> None:
    rng = np.random.default_rng(7)
    data = [labelled(rng, n, s) for n, s in ((50, 1.0), (0, 1.0), (5000, 3.0), (1, 1.0))]
    fits = fit_stack(*(np.stack([d[i] for d in data]) for i in range(3)))
    assert fits[1] is None
    for d, f in zip(data, fits):
        if d[0].sum() == 0:
            continue
        [alone] = fit_stack(d[0][None], d[1][None], d[2][None])
        assert f is not None and alone is not None
        np.testing.assert_array_equal(f.y, alone.y)
        np.testing.assert_array_equal(f.weight, alone.weight)
        assert f.samples == d[0].sum()
        ir, x, _ = sklearn_fit(*d)
        np.testing.assert_allclose(f.y, ir.predict(x), atol=1e-9)


def test_raw_and_one_by_one_readings_count_no_fit_error() -> None:
    rng = np.random.default_rng(3)
    p = rng.random(500)
    flip = (p < 0.5).astype(int)
    raw = read(None, sides_of(p, flip), binary=True)
    q = np.where(flip == 1, 1 - p, p)
    assert raw.accuracy == pytest.approx(q.mean(), abs=1e-12)
    assert raw.positive_rate == pytest.approx(p.mean(), abs=1e-12)
    assert raw.variance_fit == 0.0
    one = read_values(q, p)
    assert one.accuracy == pytest.approx(q.mean(), abs=1e-12)
    assert one.variance == pytest.approx(np.sum(q * (1 - q)), rel=1e-12)
    empty = read(None, [], binary=True)
    assert empty.pending == 0 and empty.accuracy is None and empty.band(0.9) == (None, None)
