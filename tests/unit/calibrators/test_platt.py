"""Platt scaling against scikit-learn's LogisticRegression(C=1e10) on the logit feature."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.special import expit, logit, softmax
from sklearn.linear_model import LogisticRegression

from calmon.calibrators import PlattCalibrator, fit
from calmon.errors import CalibratorError
from tests.unit.calibrators.conftest import (
    binary_data,
    multiclass_data,
    no_certainties,
    replace_top,
)


def sklearn_platt(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    lr = LogisticRegression(C=1e10, solver="newton-cholesky", tol=1e-14, max_iter=1000)
    lr.fit(x.reshape(-1, 1), y)
    return float(lr.coef_[0, 0]), float(lr.intercept_[0])


@pytest.mark.parametrize(("s", "shift"), [(0.4, 0.0), (2.5, 1.0), (1.0, -3.0)])
def test_binary_logit_matches_sklearn(rng: np.random.Generator, s: float, shift: float) -> None:
    z, y = binary_data(rng, 5000)
    scores = z * s + shift
    cal = fit("platt", scores, y, "logit")
    assert isinstance(cal, PlattCalibrator)
    a, b = sklearn_platt(scores, y)
    assert cal.a == pytest.approx(a, rel=1e-5, abs=1e-7)
    assert cal.b == pytest.approx(b, rel=1e-5, abs=1e-7)
    np.testing.assert_allclose(cal.apply(scores), expit(a * scores + b), rtol=1e-5, atol=1e-9)


def test_binary_prob_input_uses_clipped_logit(rng: np.random.Generator) -> None:
    z, y = binary_data(rng, 3000)
    p = expit(3 * z)
    p[:5] = [0.0, 1.0, 0.0, 1.0, 0.5]  # exact 0/1 must be clipped, not give +-inf
    x = logit(np.clip(p, 1e-15, 1 - 1e-15))
    cal = fit("platt", p, y, "prob")
    a, b = sklearn_platt(x, y)
    assert cal.a == pytest.approx(a, rel=1e-5, abs=1e-7)
    assert cal.b == pytest.approx(b, rel=1e-5, abs=1e-7)
    np.testing.assert_allclose(cal.apply(p), expit(a * x + b), rtol=1e-5, atol=1e-9)


@pytest.mark.parametrize("kind", ["logits", "probs"])
def test_multiclass_top_label(rng: np.random.Generator, kind: str) -> None:
    z, y = multiclass_data(rng, 5000, 5)
    probs = softmax(2 * z, axis=1)
    scores = 2 * z if kind == "logits" else probs
    cal = fit("platt", scores, y, kind)
    conf, top = probs.max(axis=1), probs.argmax(axis=1)
    x = logit(np.clip(conf, 1e-15, 1 - 1e-15))
    a, b = sklearn_platt(x, (top == y).astype(int))
    assert cal.a == pytest.approx(a, rel=1e-5, abs=1e-7)
    assert cal.b == pytest.approx(b, rel=1e-5, abs=1e-7)
    # calibrated top = sigmoid(a x + b); the others keep their ratios and fill the rest
    new_top = expit(a * x + b)
    expected = no_certainties(replace_top(probs, new_top))
    out = cal.apply(scores)
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-9)
    np.testing.assert_allclose(out.sum(axis=1), 1.0, atol=1e-12)


def test_separable_data_gives_finite_steep_slope() -> None:
    x = np.array([-3.0, -2.0, -1.0, 1.0, 2.0, 3.0])
    cal = fit("platt", x, [0, 0, 0, 1, 1, 1], "logit")
    assert np.isfinite([cal.a, cal.b]).all() and cal.a > 5
    out = cal.apply(x)
    assert (out[:3] < 1e-6).all() and (out[3:] > 1 - 1e-6).all()


def test_constant_scores_give_the_base_rate() -> None:
    cal = fit("platt", [0.3] * 4, [0, 1, 1, 1], "prob")
    # the slope is unidentified: the flattest one a document may carry (a > 0), with the
    # intercept that gives the base rate at the scores seen
    assert cal.a == 0.01
    np.testing.assert_allclose(cal.apply([0.3]), [0.75], rtol=1e-9)
    np.testing.assert_allclose(cal.apply([0.1, 0.9]), [0.75, 0.75], atol=0.01)


def test_backward_scores_give_an_increasing_map() -> None:
    """Scores ranked backwards would fit a < 0, which load() refuses (an inverted map):
    the fit keeps the flattest increasing slope and refits the intercept for it."""
    x = np.array([-2.0, -1.0, -0.5, 0.5, 1.0, 2.0])
    cal = fit("platt", x, [1, 1, 0, 1, 0, 0], "logit")
    assert cal.a == 0.01 and abs(cal.b) <= 50
    y = np.array([1, 1, 0, 1, 0, 0])
    grad_b = np.sum(expit(0.01 * x + cal.b) - y)  # the intercept is optimal for that a
    assert abs(grad_b) < 1e-9


def test_multiclass_all_correct_cannot_be_fitted() -> None:
    with pytest.raises(CalibratorError):
        fit("platt", [[0.9, 0.1], [0.2, 0.8]], [0, 1], "probs")
