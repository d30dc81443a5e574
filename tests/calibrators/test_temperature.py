"""Temperature scaling: recovery of a known temperature, NLL never worse than T = 1, and
agreement with scipy's bounded scalar minimiser of an independently written NLL."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import minimize_scalar
from scipy.special import expit, log_expit, log_softmax, softmax

from calmon.calibrators import TemperatureCalibrator, fit
from tests.calibrators.conftest import binary_data, multiclass_data


def binary_nll(logits: np.ndarray, y: np.ndarray, t: float) -> float:
    z = logits / t
    return float(-np.mean(y * log_expit(z) + (1 - y) * log_expit(-z)))


def multiclass_nll(logits: np.ndarray, y: np.ndarray, t: float) -> float:
    return float(-np.mean(log_softmax(logits / t, axis=1)[np.arange(len(y)), y]))


def scipy_temperature(nll, lo: float = -9.0, hi: float = 9.0) -> float:
    res = minimize_scalar(
        lambda u: nll(np.exp(u)), bounds=(lo, hi), method="bounded", options={"xatol": 1e-10}
    )
    return float(np.exp(res.x))


@pytest.mark.parametrize("s", [0.5, 2.0, 3.0])
def test_recovers_binary_temperature(rng: np.random.Generator, s: float) -> None:
    z, y = binary_data(rng, 20_000, scale=2.0)
    cal = fit("temperature", z * s, y, "logit")  # reported logits z * s: T = s undoes it
    assert isinstance(cal, TemperatureCalibrator)
    assert cal.temperature == pytest.approx(s, rel=0.02)
    assert cal.temperature == pytest.approx(
        scipy_temperature(lambda t: binary_nll(z * s, y, t)), rel=1e-6
    )
    np.testing.assert_allclose(cal.apply(z * s), expit(z * s / cal.temperature), rtol=1e-13)
    # prob input: the same model given as probabilities fits the same temperature.
    cal_p = fit("temperature", expit(z * s), y, "prob")
    assert cal_p.temperature == pytest.approx(cal.temperature, rel=1e-6)


@pytest.mark.parametrize("s", [0.5, 2.0, 3.0])
def test_recovers_multiclass_temperature(rng: np.random.Generator, s: float) -> None:
    z, y = multiclass_data(rng, 20_000, 10, scale=2.0)
    cal = fit("temperature", z * s, y, "logits")
    assert cal.temperature == pytest.approx(s, rel=0.02)
    assert cal.temperature == pytest.approx(
        scipy_temperature(lambda t: multiclass_nll(z * s, y, t)), rel=1e-6
    )
    np.testing.assert_allclose(
        cal.apply(z * s), softmax(z * s / cal.temperature, axis=1), rtol=1e-10, atol=1e-300
    )
    # probs input: logits = log(clipped probs), a per-row shift of z * s, so T is the same.
    probs = softmax(z * s, axis=1)
    cal_p = fit("temperature", probs, y, "probs")
    logp = np.log(np.clip(probs, 1e-15, 1 - 1e-15))
    assert cal_p.temperature == pytest.approx(
        scipy_temperature(lambda t: multiclass_nll(logp, y, t)), rel=1e-6
    )
    np.testing.assert_allclose(
        cal_p.apply(probs), softmax(logp / cal_p.temperature, axis=1), rtol=1e-10, atol=1e-300
    )


def test_identity_when_scores_are_uninformative() -> None:
    cal = fit("temperature", [0.0, 0.0, 0.0, 0.0], [0, 1, 0, 1], "logit")
    assert cal.temperature == 1.0


def test_separable_data_gives_a_bounded_small_temperature() -> None:
    z = np.array([-2.0, -1.0, 1.0, 2.0])
    cal = fit("temperature", z, [0, 0, 1, 1], "logit")
    assert 0 < cal.temperature <= 1e-3
    assert binary_nll(z, np.array([0, 0, 1, 1]), cal.temperature) < 1e-100


@settings(max_examples=60, deadline=None)
@given(
    st.integers(0, 2**32 - 1),
    st.integers(2, 60),
    st.floats(0.01, 30.0),
    st.sampled_from(["logit", "prob", "logits", "probs"]),
)
def test_never_raises_fit_nll(seed: int, n: int, scale: float, kind: str) -> None:
    rng = np.random.default_rng(seed)
    if kind in ("logit", "prob"):
        z = rng.normal(0, scale, n)
        y = rng.integers(0, 2, n)
        y[:2] = [0, 1]  # both classes present
        scores = z if kind == "logit" else expit(z)
        if kind == "prob":
            q = np.clip(scores, 1e-15, 1 - 1e-15)
            z = np.log(q) - np.log(1 - q)

        def nll(t: float) -> float:
            return binary_nll(z, y, t)
    else:
        z = rng.normal(0, scale, (n, 4))
        y = rng.integers(0, 4, n)
        scores = z if kind == "logits" else softmax(z, axis=1)
        if kind == "probs":
            z = np.log(np.clip(scores, 1e-15, 1 - 1e-15))

        def nll(t: float) -> float:
            return multiclass_nll(z, y, t)

    t = fit("temperature", scores, y, kind).temperature
    assert 1e-4 * (1 - 1e-12) <= t <= 1e4 * (1 + 1e-12)
    assert nll(t) <= nll(1.0) + 1e-12
    # and it is the optimum over the allowed range, to the solver's tolerance
    assert nll(t) <= nll(scipy_temperature(nll, np.log(1e-4), np.log(1e4))) + 1e-9
