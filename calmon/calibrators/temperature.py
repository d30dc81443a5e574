"""Temperature scaling (Guo et al. 2017) with biases: p = sigmoid(z / T + b) for binary
scores, p = softmax(z / T + b) with one bias per class for multiclass scores.

The biases are there because temperature alone cannot correct a prior (base-rate)
shift, the commonest drift of a binary model and of a triage or routing model alike;
sigmoid(z / T + b) is Platt's form, fitted the same way. The K class biases are shrunk
toward 0 (a Gaussian prior, ``BIAS_SHRINK`` below), so a model whose priors did not move
keeps b ~ 0 and T alone does the work. Documents without ``bias`` load with b = 0.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Final, Self

import numpy as np

from calmon.calibrators.base import Calibrator, check_params, floats, number, numbers
from calmon.calibrators.platt import _logistic
from calmon.calibrators.scores import is_binary, logsumexp, sigmoid, softmax, to_logits
from calmon.calibrators.validate import T_MAX, T_MIN
from calmon.errors import CalibratorError

LOG_T_MAX: Final = math.log(100.0)
"""The fitted T is kept in [0.01, 100], the range load() accepts (calibrators.validate):
the NLL optimum runs off to 0 on separable data and to infinity on uninformative scores."""

BIAS_SHRINK: Final = 5.0
"""Ridge weight on the multiclass biases: the fit minimises sum_i NLL_i + 5/2 |b|^2, a
N(0, 1/5) prior per bias. It moves b by ~5 / (n p_k (1 - p_k)) of itself: nothing from
a few thousand samples, but a calibrated model's noise-level biases stay near 0, and an
absent class keeps a finite bias."""

BIAS_MAX: Final = 50.0  # documents carry biases within +-50 (contract section 6)
BIAS_MAX_K: Final = 256
"""Class biases are fitted up to 256 classes; beyond, temperature alone: the Newton step's
bias Hessian costs n K^2 a step (0.5 s at K = 200 and 20,000 samples, minutes at 1,000)."""


class TemperatureCalibrator(Calibrator):
    method = "temperature"
    param_names = ("temperature",)

    def __init__(self, temperature: float, input: str,
                 bias: float | Sequence[float] | np.ndarray = 0.0) -> None:
        super().__init__(input)
        if not (math.isfinite(temperature) and temperature > 0):
            raise CalibratorError(f"temperature must be finite and > 0, got {temperature!r}")
        self.temperature = float(temperature)
        if is_binary(input):
            if isinstance(bias, Sequence | np.ndarray):
                raise CalibratorError("a binary bias is one number")
            if not math.isfinite(bias):
                raise CalibratorError(f"bias must be finite, got {bias!r}")
            self.bias: float = float(bias)
            self.class_bias: np.ndarray | None = None
            return
        # multiclass: K biases, or a scalar 0 (none: pure temperature, any K)
        self.bias = 0.0
        if isinstance(bias, Sequence | np.ndarray):
            b = np.asarray(bias, dtype=np.float64)
            if b.ndim != 1 or len(b) < 2 or not np.isfinite(b).all():
                raise CalibratorError("multiclass bias must be a list of K >= 2 finite numbers")
            self.class_bias = b
        elif bias != 0.0:
            raise CalibratorError("multiclass bias must be a list of K numbers")
        else:
            self.class_bias = None

    def _apply(self, scores: np.ndarray) -> np.ndarray:
        z = to_logits(scores, self.input)
        with np.errstate(over="ignore"):  # z / tiny T -> inf is clipped by sigmoid/softmax
            zt = z / self.temperature
        if is_binary(self.input):
            return sigmoid(zt + self.bias)
        if self.class_bias is None:
            return softmax(zt)
        if zt.shape[1] != len(self.class_bias):
            raise CalibratorError(f"calibrator has {len(self.class_bias)} class biases, "
                                  f"scores have {zt.shape[1]} classes")
        return softmax(zt + self.class_bias)

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
            lo, hi = T_MIN, T_MAX  # exactly the document's range (exp(log 100) is not 100)
            t = min(max(1.0 / a, lo), hi) if a > 0 else hi
            if not (a > 0 and 1.0 / a == t):  # clamped (a <= 0: scores ranked backwards)
                b = float(np.log(y.mean()) - np.log1p(-y.mean())) if t == hi else b
            b = min(max(b, -BIAS_MAX), BIAS_MAX)  # what a document may carry
            # never do worse than the identity (T = 1, b = 0)
            if not _nll_tb(z, y, t, b) <= _nll_tb(z, y, 1.0, 0.0):
                t, b = 1.0, 0.0
            return cls(t, input, b)
        s, bias = fit_temperature_bias(z, labels)
        return cls(1.0 / s, input, 0.0 if bias is None else bias)

    def params(self) -> dict[str, Any]:
        if is_binary(self.input):
            return {"temperature": self.temperature, "bias": self.bias}
        if self.class_bias is None:
            return {"temperature": self.temperature}
        return {"temperature": self.temperature, "bias": floats(self.class_bias)}

    @classmethod
    def from_params(cls, params: Mapping[str, Any], input: str) -> Self:
        if isinstance(params, Mapping) and "bias" in params:  # optional key
            rest = check_params({k: v for k, v in params.items() if k != "bias"}, cls)
            t = number(rest["temperature"], "temperature")
            if is_binary(input):
                return cls(t, input, number(params["bias"], "bias"))
            return cls(t, input, numbers(params["bias"], "bias", min_len=2))
        params = check_params(params, cls)
        return cls(number(params["temperature"], "temperature"), input)


def fit_temperature_bias(z: np.ndarray, labels: np.ndarray,
                         shrink: float = BIAS_SHRINK) -> tuple[float, np.ndarray | None]:
    """(s, b) minimising sum_i -log softmax(s z_i + b)[y_i] + shrink/2 |b|^2 over
    s = 1/T in [1/T_max, 1/T_min] and |b_k| <= BIAS_MAX: damped Newton on a convex
    objective (it is linear in (s, b) inside a log-sum-exp), never worse than (1, 0).
    b is None (no biases) past BIAS_MAX_K classes."""
    n, k = z.shape
    rows = np.arange(n)
    z_y = z[rows, labels]
    counts = np.bincount(labels, minlength=k).astype(np.float64)
    s_lo, s_hi = 1.0 / T_MAX, 1.0 / T_MIN  # T = 1/s lands exactly on the range's ends

    def objective(s: float, b: np.ndarray) -> float:
        return float(logsumexp(s * z + b).sum() - s * z_y.sum() - b @ counts
                     + 0.5 * shrink * (b @ b))

    s, b = 1.0, np.zeros(k)
    f = start = objective(s, b)
    for _ in range(100):
        p = softmax(s * z + b)
        mean_z = (p * z).sum(axis=1)
        zc = z - mean_z[:, None]  # centred: sum p z^2 - mean^2 cancels badly
        g = np.concatenate(([float((mean_z - z_y).sum())],
                            p.sum(axis=0) - counts + shrink * b))
        h_ss = float((p * zc * zc).sum()) + 1e-12 * n  # s is unidentified when z says nothing
        if k > BIAS_MAX_K:
            step = np.zeros(k + 1)
            step[0] = -g[0] / h_ss
        else:
            h = np.empty((k + 1, k + 1))
            h[0, 0] = h_ss
            h[0, 1:] = h[1:, 0] = (p * zc).sum(axis=0)
            h[1:, 1:] = np.diag(p.sum(axis=0)) - p.T @ p + shrink * np.eye(k)
            try:
                step = np.linalg.solve(h, -g)
            except np.linalg.LinAlgError:
                step = -g / np.maximum(np.abs(np.diag(h)), 1e-12)
        if not np.isfinite(step).all():
            break
        # backtrack: halve until the (projected) point decreases the objective
        t, improved = 1.0, False
        for _ in range(40):
            s_new = min(max(s + t * float(step[0]), s_lo), s_hi)
            b_new = np.clip(b + t * step[1:], -BIAS_MAX, BIAS_MAX)
            f_new = objective(s_new, b_new)
            if f_new <= f:
                improved = True
                break
            t *= 0.5
        if not improved:
            break
        moved = max(abs(s_new - s) / s, float(np.abs(b_new - b).max()))
        s, b, done = s_new, b_new, f - f_new <= 1e-13 * max(1.0, abs(f))
        f = f_new
        if done and moved < 1e-9:
            break
    if not f <= start:  # only on rounding: never do worse than the identity
        return 1.0, np.zeros(k)
    return s, (b if k <= BIAS_MAX_K else None)


def _nll_tb(z: np.ndarray, y: np.ndarray, t: float, b: float) -> float:
    eta = z / t + b
    return float(np.mean(np.logaddexp(0.0, eta) - y * eta))
