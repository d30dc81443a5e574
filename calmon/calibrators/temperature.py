"""Temperature scaling (Guo et al. 2017): p = softmax(z / T) for multiclass scores, and
for binary scores temperature plus bias, p = sigmoid(z / T + b).

Binary models get the intercept because temperature alone cannot correct a prior
(base-rate) shift, the commonest drift of a binary model; sigmoid(z / T + b) is
Platt's form, fitted the same way. Documents without ``bias`` load with b = 0.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, Final, Self

import numpy as np

from calmon.calibrators.base import Calibrator, check_params, number
from calmon.calibrators.platt import _logistic
from calmon.calibrators.scores import is_binary, logsumexp, sigmoid, softmax, to_logits
from calmon.errors import CalibratorError

LOG_T_MAX: Final = math.log(1e4)
"""The fitted T is kept in [1e-4, 1e4]: the NLL optimum runs off to 0 on separable data and
to infinity on uninformative scores; the bound's NLL is then within rounding of the limit."""

TOL: Final = 1e-10  # on log T

# g(s) = dNLL/ds and g'(s) at inverse temperature s = 1/T, for the model's logits z.
Derivatives = Callable[[float], tuple[float, float]]
Objective = Callable[[float], float]


class TemperatureCalibrator(Calibrator):
    method = "temperature"
    param_names = ("temperature",)

    def __init__(self, temperature: float, input: str, bias: float = 0.0) -> None:
        super().__init__(input)
        if not (math.isfinite(temperature) and temperature > 0):
            raise CalibratorError(f"temperature must be finite and > 0, got {temperature!r}")
        if not math.isfinite(bias):
            raise CalibratorError(f"bias must be finite, got {bias!r}")
        if bias != 0.0 and not is_binary(input):
            raise CalibratorError("bias applies to binary inputs only")
        self.temperature = float(temperature)
        self.bias = float(bias)

    def _apply(self, scores: np.ndarray) -> np.ndarray:
        z = to_logits(scores, self.input)
        with np.errstate(over="ignore"):  # z / tiny T -> inf is clipped by sigmoid/softmax
            zt = z / self.temperature
        return sigmoid(zt + self.bias) if is_binary(self.input) else softmax(zt)

    @classmethod
    def _fit(cls, scores: np.ndarray, labels: np.ndarray, input: str, **options: Any) -> Self:
        if options:
            raise CalibratorError(f"temperature takes no options, got {sorted(options)}")
        z = to_logits(scores, input)
        if is_binary(input):
            y = labels.astype(np.float64)
            if y.min() == y.max():
                raise CalibratorError("temperature with bias needs both outcomes")
            a, b = _logistic(z, y)
            lo, hi = math.exp(-LOG_T_MAX), math.exp(LOG_T_MAX)
            t = min(max(1.0 / a, lo), hi) if a > 0 else hi
            if not (a > 0 and 1.0 / a == t):  # clamped (a <= 0: scores ranked backwards)
                b = float(np.log(y.mean()) - np.log1p(-y.mean())) if t == hi else b
            # never do worse than the identity (T = 1, b = 0)
            if not _nll_tb(z, y, t, b) <= _nll_tb(z, y, 1.0, 0.0):
                t, b = 1.0, 0.0
            return cls(t, input, b)
        derivatives, nll = _multiclass(z, labels)
        t = math.exp(-_solve(derivatives))
        # The NLL is convex in s, so this only trips on rounding: never do worse than T = 1.
        if not nll(1.0 / t) <= nll(1.0):
            t = 1.0
        return cls(t, input)

    def params(self) -> dict[str, Any]:
        if is_binary(self.input):
            return {"temperature": self.temperature, "bias": self.bias}
        return {"temperature": self.temperature}

    @classmethod
    def from_params(cls, params: Mapping[str, Any], input: str) -> Self:
        if isinstance(params, Mapping) and "bias" in params:  # optional key
            rest = check_params({k: v for k, v in params.items() if k != "bias"}, cls)
            return cls(number(rest["temperature"], "temperature"), input,
                       number(params["bias"], "bias"))
        params = check_params(params, cls)
        return cls(number(params["temperature"], "temperature"), input)


def _nll_tb(z: np.ndarray, y: np.ndarray, t: float, b: float) -> float:
    eta = z / t + b
    return float(np.mean(np.logaddexp(0.0, eta) - y * eta))


def _multiclass(z: np.ndarray, labels: np.ndarray) -> tuple[Derivatives, Objective]:
    z_y = z[np.arange(len(z)), labels]

    def derivatives(s: float) -> tuple[float, float]:
        p = softmax(s * z)
        mean_z = (p * z).sum(axis=1)
        # Variance of z under p, computed centred: sum p z^2 - mean^2 cancels badly.
        var_z = (p * (z - mean_z[:, None]) ** 2).sum(axis=1)
        return float(np.mean(mean_z - z_y)), float(np.mean(var_z))

    def nll(s: float) -> float:
        return float(np.mean(logsumexp(s * z) - s * z_y))

    return derivatives, nll


def _solve(derivatives: Derivatives) -> float:
    """Minimise the NLL over u = log s = -log T in [-LOG_T_MAX, LOG_T_MAX].

    The NLL is convex in s, so h(u) = g(e^u) is increasing in u with at most one root:
    bracket it, then take Newton steps (h'(u) = s g'(s)), bisecting whenever Newton would
    leave the bracket. Returns the boundary when the root lies beyond it.
    """

    def h(u: float) -> tuple[float, float]:
        s = math.exp(u)
        g, dg = derivatives(s)
        return g, s * dg

    u = 0.0
    hu, dhu = h(u)
    if hu == 0.0:
        return u
    lo, hi = -LOG_T_MAX, LOG_T_MAX
    if hu > 0:
        if h(lo)[0] >= 0:
            return lo
        hi = u
    else:
        if h(hi)[0] <= 0:
            return hi
        lo = u
    for _ in range(200):
        newton = u - hu / dhu if dhu > 0 else math.nan
        nxt = newton if lo < newton < hi else 0.5 * (lo + hi)
        done = abs(nxt - u) < TOL
        u = nxt
        if done:
            break
        hu, dhu = h(u)
        if hu == 0.0:
            break
        if hu > 0:
            hi = u
        else:
            lo = u
        if hi - lo < TOL:
            break
    return u
