"""Temperature scaling: recovery of a known temperature, NLL never worse than T = 1, and
agreement with scipy's bounded scalar minimiser of an independently written NLL."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import minimize, minimize_scalar
from scipy.special import expit, log_expit, log_softmax, softmax

from calmon.calibrators import TemperatureCalibrator, fit
from tests.unit.calibrators.conftest import binary_data, multiclass_data


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


def binary_nll_ab(z: np.ndarray, y: np.ndarray, a: float, b: float) -> float:
    eta = a * z + b
    return float(-np.mean(y * log_expit(eta) + (1 - y) * log_expit(-eta)))


def scipy_platt(z: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    res = minimize(lambda w: binary_nll_ab(z, y, w[0], w[1]), x0=[1.0, 0.0], method="BFGS",
                   options={"gtol": 1e-10})
    return float(res.x[0]), float(res.x[1])


@pytest.mark.parametrize(("s", "shift"), [(0.5, 0.0), (2.0, 0.0), (3.0, 0.0), (1.0, 1.5),
                                          (2.5, -1.0)])
def test_recovers_binary_temperature_and_bias(rng: np.random.Generator, s: float,
                                              shift: float) -> None:
    # truth sigmoid(z + shift); the model reports z * s: T = s and bias = shift undo it
    z, _ = binary_data(rng, 20_000, scale=2.0)
    y = (rng.random(len(z)) < expit(z + shift)).astype(np.int64)
    cal = fit("temperature", z * s, y, "logit")
    assert isinstance(cal, TemperatureCalibrator)
    assert cal.temperature == pytest.approx(s, rel=0.05)
    assert cal.bias == pytest.approx(shift, abs=0.08)
    a, b = scipy_platt(z * s, y)
    assert 1 / cal.temperature == pytest.approx(a, rel=1e-5)
    assert cal.bias == pytest.approx(b, abs=1e-5)
    np.testing.assert_allclose(cal.apply(z * s), expit(z * s / cal.temperature + cal.bias),
                               rtol=1e-13)
    # prob input: the same model given as probabilities fits the same map.
    cal_p = fit("temperature", expit(z * s), y, "prob")
    assert cal_p.temperature == pytest.approx(cal.temperature, rel=1e-6)
    assert cal_p.bias == pytest.approx(cal.bias, abs=1e-6)


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


def test_uninformative_scores_give_the_base_rate() -> None:
    cal = fit("temperature", [0.0, 0.0, 0.0, 0.0], [0, 1, 1, 1], "logit")
    np.testing.assert_allclose(cal.apply([-3.0, 0.0, 3.0]), 0.75, rtol=1e-3)


def test_separable_data_gives_a_bounded_small_temperature() -> None:
    z = np.array([-2.0, -1.0, 1.0, 2.0])
    cal = fit("temperature", z, [0, 0, 1, 1], "logit")
    assert 1e-4 <= cal.temperature <= 0.1
    assert binary_nll_ab(z, np.array([0, 0, 1, 1]), 1 / cal.temperature, cal.bias) < 1e-3


@settings(max_examples=60, deadline=None)
@given(
    st.integers(0, 2**32 - 1),
    st.integers(2, 60),
    st.floats(0.01, 30.0),
    st.sampled_from(["logit", "prob", "logits", "probs"]),
)
def test_never_raises_fit_nll(seed: int, n: int, scale: float, kind: str) -> None:
    rng = np.random.default_rng(seed)
    if kind in ("logit", "prob"):  # temperature and bias: compared with scipy in 2-D
        z = rng.normal(0, scale, n)
        y = rng.integers(0, 2, n)
        y[:2] = [0, 1]  # both classes present
        scores = z if kind == "logit" else expit(z)
        if kind == "prob":
            q = np.clip(scores, 1e-15, 1 - 1e-15)
            z = np.log(q) - np.log(1 - q)

        cal = fit("temperature", scores, y, kind)
        assert 1e-4 * (1 - 1e-12) <= cal.temperature <= 1e4 * (1 + 1e-12)
        mine = binary_nll_ab(z, y, 1 / cal.temperature, cal.bias)
        assert mine <= binary_nll_ab(z, y, 1.0, 0.0) + 1e-9
        a, b = scipy_platt(z, y)
        if 1e-4 <= a <= 1e4:  # inside the allowed range: the same optimum
            assert mine <= binary_nll_ab(z, y, a, b) + 1e-4
        return
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
