"""Temperature scaling (with a bias, binary, or K class biases, multiclass): recovery of a
known temperature and prior shift, NLL never worse than the identity, and agreement with
scipy's minimiser of an independently written (penalised) NLL."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import minimize
from scipy.special import expit, log_expit, log_softmax, softmax

from calmon.calibrators import TemperatureCalibrator, fit
from tests.unit.calibrators.conftest import binary_data, multiclass_data


def binary_nll(logits: np.ndarray, y: np.ndarray, t: float) -> float:
    z = logits / t
    return float(-np.mean(y * log_expit(z) + (1 - y) * log_expit(-z)))


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


SHRINK = 5.0  # the documented ridge weight on the class biases (calmon: BIAS_SHRINK)


def penalised(z: np.ndarray, y: np.ndarray, s: float, b: np.ndarray) -> float:
    """sum_i -log softmax(s z_i + b)[y_i] + 5/2 |b|^2, written with scipy's log_softmax."""
    return float(-log_softmax(s * z + b, axis=1)[np.arange(len(y)), y].sum()
                 + 0.5 * SHRINK * b @ b)


def scipy_temperature_bias(z: np.ndarray, y: np.ndarray) -> tuple[float, np.ndarray]:
    k = z.shape[1]
    res = minimize(lambda w: penalised(z, y, w[0], w[1:]) / len(y),
                   x0=np.concatenate(([1.0], np.zeros(k))), method="BFGS",
                   options={"gtol": 1e-10})
    return float(res.x[0]), res.x[1:]


@pytest.mark.parametrize("s", [0.5, 2.0, 3.0])
def test_recovers_multiclass_temperature(rng: np.random.Generator, s: float) -> None:
    z, y = multiclass_data(rng, 20_000, 10, scale=2.0)
    cal = fit("temperature", z * s, y, "logits")
    assert cal.temperature == pytest.approx(s, rel=0.02)
    # priors did not move: the biases stay at noise level (and sum to ~0, the ridge optimum)
    assert cal.class_bias is not None and np.abs(cal.class_bias).max() < 0.1
    assert abs(cal.class_bias.sum()) < 1e-6
    a, b = scipy_temperature_bias(z * s, y)
    assert 1 / cal.temperature == pytest.approx(a, rel=1e-5)
    np.testing.assert_allclose(cal.class_bias, b, atol=1e-5)
    np.testing.assert_allclose(
        cal.apply(z * s), softmax(z * s / cal.temperature + cal.class_bias, axis=1),
        rtol=1e-10, atol=1e-300)
    # probs input: logits = log(clipped probs), a per-row shift of z * s, so the map is
    # the same on those logits.
    probs = softmax(z * s, axis=1)
    cal_p = fit("temperature", probs, y, "probs")
    logp = np.log(np.clip(probs, 1e-15, 1 - 1e-15))
    assert cal_p.temperature == pytest.approx(cal.temperature, rel=1e-6)
    np.testing.assert_allclose(
        cal_p.apply(probs), softmax(logp / cal_p.temperature + cal_p.class_bias, axis=1),
        rtol=1e-10, atol=1e-300)


@pytest.mark.parametrize(("k", "cls", "shift", "s"), [(5, 2, 2.0, 1.0), (5, 0, -1.5, 1.0),
                                                      (4, 3, 1.0, 2.0)])
def test_multiclass_biases_undo_a_prior_shift(rng: np.random.Generator, k: int, cls: int,
                                               shift: float, s: float) -> None:
    """Truth softmax(z + shift e_cls); the model reports z * s: T = s and b = shift e_cls
    (up to a constant, which softmax ignores) undo it."""
    z = rng.normal(0.0, 1.5, (30_000, k))
    truth = softmax(z + shift * np.eye(k)[cls], axis=1)
    u = rng.random(len(z))
    y = np.minimum((np.cumsum(truth, axis=1) < u[:, None]).sum(axis=1), k - 1)
    cal = fit("temperature", z * s, y, "logits")
    assert cal.temperature == pytest.approx(s, rel=0.05)
    b = cal.class_bias
    assert b is not None
    gaps = b - np.delete(b, cls).mean()
    assert gaps[cls] == pytest.approx(shift, abs=0.12)
    assert np.abs(np.delete(gaps, cls)).max() < 0.12
    served = cal.apply(z * s)
    assert np.abs(served - truth).mean() < 0.02
    assert np.abs(softmax(z * s, axis=1) - truth).mean() > 0.04


def test_multiclass_bias_documents_round_trip_and_are_checked(
        rng: np.random.Generator) -> None:
    from calmon.calibrators import load
    from calmon.errors import CalibratorError

    z, y = multiclass_data(rng, 2_000, 3)
    cal = fit("temperature", z, y, "logits")
    doc = cal.to_json(model="m", segment="__all__", version=1)
    assert isinstance(doc["params"]["bias"], list) and len(doc["params"]["bias"]) == 3
    again = load(doc)
    np.testing.assert_array_equal(again.apply(z), cal.apply(z))
    # a document without biases still loads: pure temperature, any K
    plain = load({"model": "m", "segment": "__all__", "version": 1, "method": "temperature",
                  "params": {"temperature": 2.0}, "input": "logits"})
    np.testing.assert_allclose(plain.apply(z), softmax(z / 2.0, axis=1), rtol=1e-12)
    for bad in (0.5, [0.1], [0.1, "x", 0.2], [0.0, float("nan"), 0.0], True):
        with pytest.raises(CalibratorError):
            load({**doc, "params": {"temperature": 1.0, "bias": bad}})
    with pytest.raises(CalibratorError):  # 3 biases, 4 classes
        cal.apply(rng.normal(size=(5, 4)))


def test_uninformative_scores_give_the_base_rate() -> None:
    cal = fit("temperature", [0.0, 0.0, 0.0, 0.0], [0, 1, 1, 1], "logit")
    # T stops at 100, the largest a document may carry: sigmoid(z / 100 + logit(0.75))
    assert cal.temperature == pytest.approx(100.0)
    np.testing.assert_allclose(cal.apply([-3.0, 0.0, 3.0]),
                               expit(np.array([-3.0, 0.0, 3.0]) / 100 + np.log(3)), rtol=1e-9)


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
        # T within [0.01, 100] and |b| <= 50: what load() accepts (contract section 6)
        assert 1e-2 * (1 - 1e-12) <= cal.temperature <= 1e2 * (1 + 1e-12)
        assert abs(cal.bias) <= 50
        mine = binary_nll_ab(z, y, 1 / cal.temperature, cal.bias)
        assert mine <= binary_nll_ab(z, y, 1.0, 0.0) + 1e-9
        a, b = scipy_platt(z, y)
        if 1e-2 <= a <= 1e2 and abs(b) <= 50:  # inside the allowed range: the same optimum
            assert mine <= binary_nll_ab(z, y, a, b) + 1e-4
        return
    else:
        z = rng.normal(0, scale, (n, 4))
        y = rng.integers(0, 4, n)
        scores = z if kind == "logits" else softmax(z, axis=1)
        if kind == "probs":
            z = np.log(np.clip(scores, 1e-15, 1 - 1e-15))

    cal = fit("temperature", scores, y, kind)
    t, b = cal.temperature, cal.class_bias
    assert b is not None and np.isfinite(b).all() and np.abs(b).max() <= 50
    assert 1e-2 * (1 - 1e-12) <= t <= 1e2 * (1 + 1e-12)
    mine = penalised(z, y, 1 / t, b)
    assert mine <= penalised(z, y, 1.0, np.zeros(4)) + 1e-9
    # and the optimum, where scipy's unbounded one lies inside the allowed range
    a, b_ref = scipy_temperature_bias(z, y)
    if 1e-2 <= a <= 1e2 and np.abs(b_ref).max() <= 50:
        assert mine <= penalised(z, y, a, b_ref) + 1e-6 * n


def test_past_256_classes_temperature_alone(rng: np.random.Generator) -> None:
    """Beyond BIAS_MAX_K classes no biases are fitted (the Newton step would cost n K^2):
    the document carries the temperature only, which is the temperature-only optimum."""
    z, y = multiclass_data(rng, 3_000, 300, scale=1.0)
    cal = fit("temperature", z * 2.0, y, "logits")
    assert cal.class_bias is None and set(cal.params()) == {"temperature"}

    def nll(t: float) -> float:
        return float(-log_softmax(z * 2.0 / t, axis=1)[np.arange(len(y)), y].mean())

    best = minimize(lambda u: nll(float(np.exp(u[0]))), x0=[0.0], method="Nelder-Mead",
                    options={"xatol": 1e-8, "fatol": 1e-12})
    assert nll(cal.temperature) <= nll(float(np.exp(best.x[0]))) + 1e-9
