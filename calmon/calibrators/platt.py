"""Platt scaling: p = sigmoid(a * logit + b), a 2-parameter logistic regression."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Final, Self

import numpy as np

from calmon.calibrators.base import check_params, number
from calmon.calibrators.scores import logit, sigmoid
from calmon.calibrators.toplabel import TopLabelCalibrator
from calmon.calibrators.validate import BIAS_MAX, SLOPE_MAX, T_MAX
from calmon.errors import CalibratorError

RIDGE: Final = 1e-10
"""L2 weight on the slope a, against the summed NLL: the objective of scikit-learn's
LogisticRegression(C=1e10). Negligible on ordinary data; it keeps a finite when the
scores separate the labels perfectly (the plain MLE would be a = infinity)."""

MAX_ITER: Final = 200
SLOPE_MIN: Final = 1.0 / T_MAX  # the flattest map a fit returns (documents need a > 0)


class PlattCalibrator(TopLabelCalibrator):
    """Binary: sigmoid(a * z + b) on the model's log-odds z. Multiclass: the same on the
    log-odds of the top-label confidence, the other classes rescaled (see toplabel)."""

    method = "platt"
    param_names = ("a", "b")
    on_logit = True

    def __init__(self, a: float, b: float, input: str) -> None:
        super().__init__(input)
        if not (math.isfinite(a) and math.isfinite(b)):
            raise CalibratorError(f"platt a and b must be finite, got {a!r}, {b!r}")
        self.a, self.b = float(a), float(b)

    def _map(self, x: np.ndarray) -> np.ndarray:
        with np.errstate(over="ignore"):  # a huge a * x -> inf is clipped by sigmoid
            return sigmoid(self.a * x + self.b)

    @classmethod
    def _fit_xy(cls, x: np.ndarray, y: np.ndarray, input: str, **options: Any) -> Self:
        if options:
            raise CalibratorError(f"platt takes no options, got {sorted(options)}")
        if y.min() == y.max():
            raise CalibratorError("platt needs both outcomes (right and wrong top labels)")
        a, b = _logistic(x, y)
        if not SLOPE_MIN <= a <= SLOPE_MAX:
            # scores ranked backwards (a <= 0) or a step: the nearest slope load() accepts,
            # with the intercept refitted for it
            a = min(max(a, SLOPE_MIN), SLOPE_MAX)
            b = intercept_for(x, y, a)
        return cls(a, min(max(b, -BIAS_MAX), BIAS_MAX), input)

    def params(self) -> dict[str, Any]:
        return {"a": self.a, "b": self.b}

    @classmethod
    def from_params(cls, params: Mapping[str, Any], input: str) -> Self:
        params = check_params(params, cls)
        return cls(number(params["a"], "a"), number(params["b"], "b"), input)


def _logistic(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """argmin over (a, b) of sum NLL(sigmoid(a x + b), y) + RIDGE / 2 * a^2.

    Newton's method with backtracking, on x standardised (mean 0, sd 1) so the 2x2 Hessian
    stays well conditioned whatever the scale of the logits; the ridge is rescaled so the
    optimum is the same as on the raw x.
    """
    mu, sd = float(x.mean()), float(x.std())
    base = float(logit(np.array([y.mean()]))[0])
    # Constant x (to rounding): the slope is unidentified and the ridge sets it to 0.
    if not sd > 1e-12 * max(1.0, abs(mu)):
        return 0.0, base
    xs = (x - mu) / sd
    ridge = RIDGE / (sd * sd)  # RIDGE * a^2 == ridge * a_s^2 with a_s = a * sd

    def objective(w: np.ndarray) -> float:
        eta = w[0] * xs + w[1]
        return float(np.sum(np.logaddexp(0.0, eta) - y * eta) + 0.5 * ridge * w[0] ** 2)

    w = np.array([0.0, base])
    f = objective(w)
    for _ in range(MAX_ITER):
        p = sigmoid(w[0] * xs + w[1])
        r = p - y
        grad = np.array([np.dot(r, xs) + ridge * w[0], r.sum()])
        v = p * (1.0 - p)
        hxx, hx, h1 = float(np.dot(v, xs * xs)) + ridge, float(np.dot(v, xs)), float(v.sum())
        det = hxx * h1 - hx * hx
        if det > 0 and math.isfinite(det):
            step = np.array([h1 * grad[0] - hx * grad[1], hxx * grad[1] - hx * grad[0]]) / det
        else:  # flat Hessian (saturated predictions): fall back to a gradient step
            step = grad / max(1.0, float(np.abs(grad).max()))
        slope = float(np.dot(grad, step))
        t = 1.0
        while True:
            trial = w - t * step
            f_trial = objective(trial)
            if f_trial <= f - 1e-4 * t * slope or t < 1e-12:
                break
            t *= 0.5
        if not f_trial <= f:  # no descent left: at the optimum to rounding
            break
        moved = float(np.abs(trial - w).max())
        w, f = trial, f_trial
        if moved < 1e-12 * (1.0 + float(np.abs(w).max())):
            break
    a_s, b_s = float(w[0]), float(w[1])
    return a_s / sd, b_s - a_s * mu / sd


def intercept_for(x: np.ndarray, y: np.ndarray, a: float) -> float:
    """argmin over b in [-BIAS_MAX, BIAS_MAX] of sum NLL(sigmoid(a x + b), y), by bisection
    on the gradient (increasing in b)."""
    ax = a * x
    lo, hi = -BIAS_MAX, BIAS_MAX
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        if float(np.sum(sigmoid(ax + mid) - y)) > 0:
            hi = mid
        else:
            lo = mid
        if hi - lo < 1e-12:
            break
    return 0.5 * (lo + hi)


def logistic_toward(x: np.ndarray, y: np.ndarray, a0: float, b0: float,
                    strength: float) -> tuple[float, float]:
    """argmin over (a, b) of sum NLL(sigmoid(a x + b), y) + strength/2 ((a-a0)^2 + (b-b0)^2):
    a Platt fit shrunk toward (a0, b0), the prior weighing like ``strength`` samples'
    worth of curvature. With few samples the result stays near (a0, b0); with many the
    data win. The penalty makes the objective strongly convex, so Newton converges."""
    w = np.array([a0, b0], dtype=np.float64)
    prior = w.copy()

    def objective(v: np.ndarray) -> float:
        eta = v[0] * x + v[1]
        return float(np.sum(np.logaddexp(0.0, eta) - y * eta)
                     + 0.5 * strength * float(np.sum((v - prior) ** 2)))

    f = objective(w)
    for _ in range(MAX_ITER):
        p = sigmoid(w[0] * x + w[1])
        r = p - y
        grad = np.array([np.dot(r, x), r.sum()]) + strength * (w - prior)
        v = p * (1.0 - p)
        h = np.array([[np.dot(v, x * x) + strength, np.dot(v, x)],
                      [np.dot(v, x), v.sum() + strength]])
        step = np.linalg.solve(h, grad)
        t = 1.0
        while True:
            trial = w - t * step
            f_trial = objective(trial)
            if f_trial <= f - 1e-4 * t * float(np.dot(grad, step)) or t < 1e-12:
                break
            t *= 0.5
        if not f_trial <= f:
            break
        moved = float(np.abs(trial - w).max())
        w, f = trial, f_trial
        if moved < 1e-10 * (1.0 + float(np.abs(w).max())):
            break
    return float(w[0]), float(w[1])
