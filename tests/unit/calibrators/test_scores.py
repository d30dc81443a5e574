"""to_probs and the input validation: compared with scipy's expit/softmax."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from scipy.special import expit, softmax

from calmon.calibrators import INPUTS, to_probs
from calmon.errors import CalibratorError


def test_inputs_are_the_contract_kinds() -> None:
    assert INPUTS == ("prob", "logit", "probs", "logits")


def test_binary_conversions_match_scipy(rng: np.random.Generator) -> None:
    z = rng.normal(0, 5, 1000)
    np.testing.assert_allclose(to_probs(z, "logit"), expit(z), rtol=1e-14, atol=0)
    p = rng.random(1000)
    np.testing.assert_array_equal(to_probs(p, "prob"), p)
    assert to_probs([0.0, 1.0, 0.25], "prob").tolist() == [0.0, 1.0, 0.25]


def test_multiclass_conversions_match_scipy(rng: np.random.Generator) -> None:
    z = rng.normal(0, 5, (500, 7))
    np.testing.assert_allclose(to_probs(z, "logits"), softmax(z, axis=1), rtol=1e-12, atol=1e-300)
    p = rng.random((500, 7))
    np.testing.assert_allclose(to_probs(p, "probs"), p / p.sum(axis=1, keepdims=True), rtol=1e-15)
    # Python lists are accepted; an all-zero row becomes uniform.
    out = to_probs([[0.0, 0.0, 0.0], [0.2, 0.8, 0.0]], "probs")
    np.testing.assert_allclose(out, [[1 / 3, 1 / 3, 1 / 3], [0.2, 0.8, 0.0]], rtol=1e-15)


def test_extreme_inputs_stay_finite() -> None:
    # No overflow, 0/0 or log(0) on the way either (underflow to 0 is harmless).
    with np.errstate(over="raise", invalid="raise", divide="raise"):
        big = [0.0, 1.0, -1.0, 1e308, -1e308, np.inf, -np.inf, 1e-320]
        out = to_probs(big, "logit")
        assert np.isfinite(out).all()
        assert out.tolist()[:2] == [0.5, expit(1.0)]
        assert out[3] == 1.0 and out[4] == 0.0 and out[5] == 1.0 and out[6] == 0.0
        rows = [[1e308, -1e308], [np.inf, -np.inf], [1e308, 1e308], [-1e308, -1e308]]
        out = to_probs(rows, "logits")
        np.testing.assert_allclose(out, [[1, 0], [1, 0], [0.5, 0.5], [0.5, 0.5]])
        assert to_probs([-0.5, 0.0, 1.0, 2.0, np.inf], "prob").tolist() == [0, 0, 1, 1, 1]
        out = to_probs([[0.0, 1.0], [np.inf, 1.0], [1e-320, 0.0]], "probs")
        np.testing.assert_allclose(out, [[0, 1], [0.5, 0.5], [1, 0]])


@pytest.mark.parametrize(
    ("scores", "kind"),
    [
        ([[0.5]], "prob"),
        ([0.5, 0.5], "probs"),
        ([[0.5], [0.5]], "probs"),
        ([0.1, np.nan], "logit"),
        (["a", "b"], "logit"),
        ([[1, 2], [3]], "logits"),
        ([0.5], "proba"),
    ],
)
def test_bad_scores_raise(scores: object, kind: str) -> None:
    with pytest.raises(CalibratorError):
        to_probs(scores, kind)


finite_or_inf = st.floats(allow_nan=False, allow_infinity=True, width=64)


@settings(max_examples=150, deadline=None)
@given(arrays(np.float64, st.integers(0, 20), elements=finite_or_inf))
def test_binary_to_probs_never_nan_or_inf(z: np.ndarray) -> None:
    for kind in ("prob", "logit"):
        out = to_probs(z, kind)
        assert out.shape == z.shape
        assert np.isfinite(out).all() and (out >= 0).all() and (out <= 1).all()


@settings(max_examples=150, deadline=None)
@given(
    st.integers(2, 6).flatmap(
        lambda k: arrays(
            np.float64, st.tuples(st.integers(0, 10), st.just(k)), elements=finite_or_inf
        )
    )
)
def test_multiclass_to_probs_rows_sum_to_one(z: np.ndarray) -> None:
    for kind in ("probs", "logits"):
        out = to_probs(z, kind)
        assert out.shape == z.shape
        assert np.isfinite(out).all() and (out >= 0).all() and (out <= 1).all()
        np.testing.assert_allclose(out.sum(axis=1), 1.0, rtol=0, atol=1e-12)
