"""Sequential, anytime-valid drift detection: a mixture e-detector per series.

Null hypothesis for one series: every joined sample's label is Bernoulli(p), where p is
the live calibrator's output (binary: P(y=1) against y; multiclass: top-label confidence
against correctness). Alternatives are Platt-form distortions of p,
q = sigmoid(a * logit(p) + b), on a small grid of (a, b) (sharpening/softening and
intercept shifts). For sample i the likelihood ratio L_ji = q_j/p (y = 1) or
(1 - q_j)/(1 - p) (y = 0) has expectation exactly 1 under the null.

The statistic is a weighted Shiryaev-Roberts e-detector, mixed over alternatives:

    S_jn = (S_j,n-1 + w_n) * L_jn        (S_j0 = 0)
    M_n  = mean_j S_jn + (1 - W_n)       (W_n = w_1 + ... + w_n <= 1)

S_jn = sum_k w_k prod_{i=k..n} L_ji is a mixture over change points k with summable
weights w_k, so M_n is a nonnegative martingale with M_0 = 1 under the null, and by
Ville's inequality P(sup_n M_n >= 1/alpha) <= alpha: the false-alarm probability is
bounded for ever, however many samples and checks come (Shin, Ramdas and Rinaldo 2023,
"E-detectors"; the weights make it valid over an infinite horizon, unlike a plain SR
or CUSUM threshold, whose false alarms only space out). The price is log(1/w_k) nats of
extra evidence for a change after k samples: w_k ~ 1 / (k log^2 k), about 16 nats after
35,000 samples. The alarm's change time is the CUSUM start: the k maximising the best
alternative's log-likelihood ratio of samples k..n.

Multiclass models have further alternatives that tilt one class: q = softmax(log p +
d e_c), for each class c (up to ``MAX_TILT_CLASSES``) and d in ``TILTS``, tested on
the full label: L = q_y / p_y = e^(d [y = c]) / (1 + p_c (e^d - 1)), again of mean 1
under the null (the label drawn from the calibrated p). A class-prior shift moves
one class's frequency while the top-label confidence hardly changes; these find it.
The tilts join the mixture when a series' detector first sees multiclass samples; a
batch without them (another K) counts as likelihood ratio 1 for them, which keeps M a
martingale.

Pure numpy; one batch update is vectorised (a log-space scan), so a simulated week of
checks costs milliseconds per series.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Final

import numpy as np

GRID_A: Final = (0.4, 0.6, 0.8, 1.0, 1.25, 1.6, 2.2)  # slope on logit(p): <1 sharpened input
GRID_B: Final = (-1.5, -0.75, 0.0, 0.75, 1.5)  # intercept: prior (base-rate) shifts
ALTERNATIVES: Final = np.array([(a, b) for a in GRID_A for b in GRID_B if (a, b) != (1.0, 0.0)])
TILTS: Final = np.array([-1.5, -0.75, 0.75, 1.5])  # log-odds tilt of one class
MAX_TILT_CLASSES: Final = 32  # past it each class's tilts would carry too little weight
_WEIGHT_SUM: Final = 2.2  # sum_{m>=2} 1/(m ln^2 m) = 2.1097...; dividing by 2.2 keeps W <= 1
_P_EPS: Final = 1e-12
_LOG_CAP: Final = 700.0  # exp(700) is still a finite float


def log_weights(k0: int, n: int) -> np.ndarray:
    """log w_k for k = k0+1 .. k0+n, w_k = 1 / (2.2 (k+1) ln^2(k+1))."""
    m = np.arange(k0 + 2, k0 + n + 2, dtype=np.float64)
    return -(math.log(_WEIGHT_SUM) + np.log(m) + 2.0 * np.log(np.log(m)))


_A: Final = ALTERNATIVES[:, :1].copy()
_B: Final = ALTERNATIVES[:, 1:].copy()


def tilt_log_lr(probs: np.ndarray, labels: np.ndarray) -> np.ndarray | None:
    """(K * len(TILTS), n) log-likelihood ratios of the one-class tilts against the
    calibrated class probabilities ``probs`` (n, K); None for binary scores or K past
    MAX_TILT_CLASSES. Row c * len(TILTS) + j tilts class c by TILTS[j]."""
    if probs.ndim != 2 or not 2 <= probs.shape[1] <= MAX_TILT_CLASSES:
        return None
    n, k = probs.shape
    pc = np.clip(probs, 0.0, 1.0).T[:, None, :]  # (K, 1, n)
    d = TILTS[None, :, None]  # (1, T, 1)
    hit = np.zeros((k, 1, n))
    hit[labels, 0, np.arange(n)] = 1.0
    # log(1 + p (e^d - 1)) >= log(e^d) > -inf for p in [0, 1]: always finite
    out = d * hit - np.log1p(pc * np.expm1(d))
    return np.asarray(np.clip(out.reshape(k * len(TILTS), n), -_LOG_CAP, _LOG_CAP))


def log_lr(p: np.ndarray, y: np.ndarray) -> np.ndarray:
    """(J, n) log-likelihood ratios of every alternative against Bernoulli(p)."""
    p = np.asarray(p, dtype=np.float64)
    pos = np.asarray(y, dtype=np.float64) > 0.5
    pc = np.clip(p, _P_EPS, 1.0 - _P_EPS)
    z = np.log(pc / (1.0 - pc))
    # log q = -log(1 + e^-eta) for y = 1, log(1 - q) = -log(1 + e^eta) for y = 0: one
    # logaddexp with the sign folded into eta. The denominators use the unclipped p so
    # E[L] = 1 holds exactly (p = 0 with y = 1 is infinite evidence, capped).
    sign = np.where(pos, -1.0, 1.0)
    eta = (_A * z + _B) * sign
    with np.errstate(divide="ignore"):
        log_p = np.log(np.where(pos, p, 1.0 - p))
    out: np.ndarray = np.clip(-np.logaddexp(0.0, eta) - log_p, -_LOG_CAP, _LOG_CAP)
    return out


@dataclass
class Detector:
    """State of one series' e-detector since its last reset."""

    log_s: np.ndarray  # (J,) log S_j
    k: int = 0  # samples since reset
    log_m_max: float = 0.0  # largest log M_n since reset
    alarm_k: int | None = None  # sample count at the first crossing
    w_sum: float = 0.0  # W_k
    log_m: float = 0.0  # log M_k now (0 right after a reset)

    @classmethod
    def new(cls) -> Detector:
        return cls(np.full(len(ALTERNATIVES), -np.inf))

    def update(self, p: np.ndarray, y: np.ndarray, log_threshold: float,
               tilt: np.ndarray | None = None) -> None:
        """Feed samples in arrival order; latch the alarm when M crosses the threshold.
        ``tilt``: the batch's tilt_log_lr (multiclass), added to the mixture on the
        detector's first batch."""
        n = len(p)
        if n == 0:
            return
        ll = _stack(self, log_lr(p, y), tilt)
        c = np.cumsum(ll, axis=1)
        lw = log_weights(self.k, n)
        buf = np.empty((len(ll), n + 1))
        buf[:, 0] = self.log_s
        np.subtract(lw[None, :], c - ll, out=buf[:, 1:])  # log w_k - log P_{k-1}
        log_s = np.minimum(c + np.logaddexp.accumulate(buf, axis=1)[:, 1:], _LOG_CAP)
        top = log_s.max(axis=0)
        with np.errstate(invalid="ignore"):  # all -inf columns cannot occur after a sample
            mix = top + np.log(np.exp(log_s - top).sum(axis=0)) - math.log(len(ll))
        w_sums = self.w_sum + np.cumsum(np.exp(lw))  # W_n, < 0.96
        log_m = np.logaddexp(mix, np.log1p(-w_sums))
        crossed = np.flatnonzero(log_m >= log_threshold)
        if self.alarm_k is None and len(crossed):
            self.alarm_k = self.k + int(crossed[0]) + 1
        self.log_m_max = max(self.log_m_max, float(log_m.max()))
        self.log_s = log_s[:, -1].copy()
        self.k += n
        self.w_sum = float(w_sums[-1])
        self.log_m = float(log_m[-1])

    @property
    def alarmed(self) -> bool:
        return self.alarm_k is not None

    def snapshot(self) -> dict[str, Any]:
        return {"log_s": [float(v) if math.isfinite(v) else None for v in self.log_s],
                "k": self.k, "log_m_max": self.log_m_max, "alarm_k": self.alarm_k,
                "w_sum": self.w_sum, "log_m": self.log_m}

    @classmethod
    def restore(cls, snap: dict[str, Any]) -> Detector:
        log_s = np.array([-np.inf if v is None else float(v) for v in snap["log_s"]])
        tilts, rest = divmod(len(log_s) - len(ALTERNATIVES), len(TILTS))
        if log_s.ndim != 1 or rest or not 0 <= tilts <= MAX_TILT_CLASSES:
            return cls.new()  # a grid from another version: start afresh
        return cls(log_s, int(snap["k"]), float(snap["log_m_max"]),
                   None if snap.get("alarm_k") is None else int(snap["alarm_k"]),
                   float(snap["w_sum"]), float(snap["log_m"]))


def _stack(det: Detector, ll: np.ndarray, tilt: np.ndarray | None) -> np.ndarray:
    """The batch's log-LRs in the detector's rows: the tilts join on its first batch; a
    batch without (matching) tilts gives them log-LR 0 (a ratio of 1 keeps M valid)."""
    j = len(ALTERNATIVES)
    if tilt is not None and det.k == 0 and len(det.log_s) == j:
        det.log_s = np.concatenate((det.log_s, np.full(len(tilt), -np.inf)))
    extra = len(det.log_s) - j
    if extra == 0:
        return ll
    if tilt is None or len(tilt) != extra:
        tilt = np.zeros((extra, ll.shape[1]))
    return np.vstack((ll, tilt))


def change_point(p: np.ndarray, y: np.ndarray, tilt: np.ndarray | None = None) -> int:
    """CUSUM estimate of where the change began: the index k (0-based, in feeding order)
    maximising, over alternatives (the tilts too, when given), the log-likelihood ratio
    of samples k..end."""
    if len(p) == 0:
        return 0
    ll = log_lr(p, y) if tilt is None else np.vstack((log_lr(p, y), tilt))
    suffix = np.cumsum(ll[:, ::-1], axis=1)[:, ::-1]  # suffix[j, k] = sum_{i>=k} ll[j, i]
    _, k = np.unravel_index(int(np.argmax(suffix)), suffix.shape)
    return int(k)
