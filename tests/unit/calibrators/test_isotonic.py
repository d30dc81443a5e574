"""Isotonic calibration against scikit-learn's IsotonicRegression(out_of_bounds="clip"),
Laplace-smoothed per level set and made monotone again by a second (weighted) sklearn
isotonic fit: compared on the training points, where both are defined the same way."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.special import expit, softmax
from sklearn.isotonic import IsotonicRegression

from calmon.calibrators import IsotonicCalibrator, fit
from tests.unit.calibrators.conftest import (
    binary_data,
    multiclass_data,
    no_certainties,
    replace_top,
)


def sklearn_iso(x: np.ndarray, y: np.ndarray) -> IsotonicRegression:
    return IsotonicRegression(out_of_bounds="clip").fit(x, y.astype(np.float64))


def smoothed_reference(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Expected calibrated value at each training point, from sklearn alone."""
    fitted = sklearn_iso(x, y).predict(x)
    levels, inv, w = np.unique(fitted, return_inverse=True, return_counts=True)
    smoothed = (levels * w + 1) / (w + 2)
    mono = IsotonicRegression().fit(levels, smoothed, sample_weight=w + 2).predict(levels)
    return mono[inv]


def probe(x: np.ndarray) -> np.ndarray:
    """Fit points, a dense grid and points outside the fitted range."""
    return np.concatenate([x, np.linspace(0, 1, 2001), [0.0, 1.0, x.min() / 2]])


@pytest.mark.parametrize("decimals", [1, 2, 3, None])
def test_binary_prob_with_ties_matches_sklearn(rng: np.random.Generator, decimals) -> None:
    z, y = binary_data(rng, 4000)
    p = expit(1.7 * z + 0.3)
    if decimals is not None:
        p = np.round(p, decimals)  # many exact ties in x, with mixed labels
    cal = fit("isotonic", p, y, "prob")
    assert isinstance(cal, IsotonicCalibrator)
    np.testing.assert_allclose(cal.apply(p), smoothed_reference(p, y), rtol=0, atol=1e-9)
    out = cal.apply(np.clip(probe(p), 0, 1))
    assert (out > 0).all() and (out < 1).all() and (np.diff(np.sort(probe(p))) >= 0).all()


def test_binary_logit_input_fits_on_probabilities(rng: np.random.Generator) -> None:
    z, y = binary_data(rng, 3000)
    scores = np.round(2 * z, 1)
    cal = fit("isotonic", scores, y, "logit")
    np.testing.assert_allclose(cal.apply(scores), smoothed_reference(expit(scores), y),
                               rtol=0, atol=1e-9)


def test_near_ties_are_pooled_like_sklearn() -> None:
    # x values closer than 1e-15 are one point for sklearn; so they must be here.
    x = np.array([1e-17, 5e-16, 9e-16, 2e-15, 0.3, 0.3, 0.3 + 1e-16, 0.7, 1.0])
    y = np.array([1, 0, 0, 1, 0, 1, 1, 0, 1])
    cal = fit("isotonic", x, y, "prob")
    # the pooled near-ties (first 3) sit between thresholds, where sklearn interpolates
    np.testing.assert_allclose(cal.apply(x)[3:], smoothed_reference(x, y)[3:], rtol=0,
                               atol=1e-12)
    np.testing.assert_allclose(cal.x[0], 1e-17, rtol=0, atol=0)


@settings(max_examples=80, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from([0.0, 0.1, 0.25, 0.5, 0.5, 0.75, 0.9, 1.0]), st.integers(0, 1)),
        min_size=2,
        max_size=40,
    ).filter(lambda pairs: len({y for _, y in pairs}) == 2)
)
def test_random_small_tied_data_matches_sklearn(pairs: list[tuple[float, int]]) -> None:
    x = np.array([p for p, _ in pairs])
    y = np.array([label for _, label in pairs])
    cal = fit("isotonic", x, y, "prob")
    out = cal.apply(x)
    np.testing.assert_allclose(out, smoothed_reference(x, y), rtol=0, atol=1e-9)
    grid = cal.apply(np.linspace(0, 1, 101))
    assert (grid > 0).all() and (grid < 1).all() and (np.diff(grid) >= -1e-15).all()


@pytest.mark.parametrize("kind", ["logits", "probs"])
def test_multiclass_top_label(rng: np.random.Generator, kind: str) -> None:
    z, y = multiclass_data(rng, 4000, 4)
    probs = softmax(np.round(2.5 * z, 1), axis=1)
    scores = np.round(2.5 * z, 1) if kind == "logits" else probs
    cal = fit("isotonic", scores, y, kind)
    conf, top = probs.max(axis=1), probs.argmax(axis=1)
    new_top = smoothed_reference(conf, (top == y).astype(int))
    expected = no_certainties(replace_top(probs, new_top))
    np.testing.assert_allclose(cal.apply(scores), expected, rtol=0, atol=1e-9)
