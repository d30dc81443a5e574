"""fit() argument checking and apply() shapes, for every method."""

from __future__ import annotations

import numpy as np
import pytest

from calmon.calibrators import METHODS, fit
from calmon.errors import CalibratorError


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize(
    ("scores", "labels", "kind"),
    [
        ([0.3], [1], "prob"),  # fewer than 2 samples
        ([], [], "logit"),
        ([0.3, 0.6, 0.9], [1, 1, 1], "prob"),  # one class
        ([0.3, 0.6, 0.9], [0, 0, 0], "logit"),
        ([0.3, 0.6], [0, 2], "prob"),  # not 0/1
        ([0.3, 0.6], [0, -1], "prob"),
        ([0.3, 0.6], [0, 0.5], "prob"),
        ([0.3, 0.6], [0, 1, 1], "prob"),  # length mismatch
        ([0.3, np.nan], [0, 1], "prob"),
        ([0.3, 0.6], ["a", "b"], "prob"),
        ([[0.3, 0.7], [0.5, 0.5]], [0, 2], "probs"),  # class 2 of 2
        ([[0.3, 0.7], [0.5, 0.5]], [0, 1], "prob"),  # wrong shape for the kind
        ([0.3, 0.6], [0, 1], "probs"),
        ([0.3, 0.6], [0, 1], "scores"),  # unknown kind
    ],
)
def test_unfittable_data_raises(method: str, scores: object, labels: object, kind: str) -> None:
    with pytest.raises(CalibratorError):
        fit(method, scores, labels, kind)


def test_unknown_method_raises() -> None:
    with pytest.raises(CalibratorError):
        fit("beta", [0.1, 0.9], [0, 1], "prob")


@pytest.mark.parametrize("method", ["temperature", "platt", "isotonic"])
def test_unknown_options_raise(method: str) -> None:
    with pytest.raises(CalibratorError):
        fit(method, [0.1, 0.9], [0, 1], "prob", bins=10)


@pytest.mark.parametrize("method", METHODS)
def test_labels_may_be_bools_or_integral_floats(method: str) -> None:
    a = fit(method, [0.1, 0.4, 0.35, 0.8], [False, True, False, True], "prob")
    b = fit(method, [0.1, 0.4, 0.35, 0.8], [0.0, 1.0, 0.0, 1.0], "prob")
    assert a.params() == b.params()


@pytest.mark.parametrize("method", METHODS)
def test_apply_shapes_and_extremes(method: str) -> None:
    rng = np.random.default_rng(7)
    z = rng.normal(0, 2, (200, 3))
    y = rng.integers(0, 3, 200)
    y[:100] = z[:100].argmax(axis=1)  # both right and wrong top labels
    cal = fit(method, z, y, "logits")
    extreme = np.array([[1e308, -1e308, 0.0], [np.inf, -np.inf, 0.0], [0.0, 0.0, 0.0]])
    out = cal.apply(extreme)
    assert out.shape == (3, 3) and np.isfinite(out).all()
    np.testing.assert_allclose(out.sum(axis=1), 1.0, atol=1e-12)
    assert cal.apply(np.empty((0, 3))).shape == (0, 3)
    with pytest.raises(CalibratorError):
        cal.apply([0.1, 0.2])

    b = fit(method, z[:, 0], (y == 0).astype(int), "logit")
    out = b.apply([0.0, 1e308, -1e308, np.inf, -np.inf])
    assert out.shape == (5,) and np.isfinite(out).all() and ((out >= 0) & (out <= 1)).all()
    assert b.apply([]).shape == (0,)
