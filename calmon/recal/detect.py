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

The change points are points of PREDICTION time, not positions in arrival order (see
``Detector``): under label delay the labels of predictions made before a change arrive
mixed with those made after it, and must not dilute the evidence about it.

Pure numpy; one batch update touches only the grid points after its oldest sample.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
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
    """log w_j for j = k0 .. k0+n-1, w_j = 1 / (2.2 (j+2) ln^2(j+2)) (sum < 0.96)."""
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


BLOCK: Final = 64  # grid points summed together, so an update touches only recent ones
MAX_GRID: Final = 16 * BLOCK  # change times kept open per series; older ones are frozen


def _weight_sum(lo: int, hi: int) -> float:
    """sum of w_j for j in [lo, hi): exact up to a million terms, else a lower bound."""
    if hi <= lo:
        return 0.0
    if hi - lo <= 1_000_000:
        return float(np.exp(log_weights(lo, hi - lo)).sum())
    # integral of 1/(m ln^2 m) from lo+2 to hi+2: below the sum (the terms decrease)
    return (1.0 / math.log(lo + 2) - 1.0 / math.log(hi + 2)) / _WEIGHT_SUM


def _lse(x: np.ndarray, axis: int) -> np.ndarray:
    """log sum exp along ``axis`` (-inf for all -inf), without warnings."""
    top = x.max(axis=axis, keepdims=True)
    top[~np.isfinite(top)] = 0.0
    total = np.exp(x - top).sum(axis=axis)
    out = np.full(total.shape, -np.inf)
    np.log(total, out=out, where=total > 0)
    out += np.squeeze(top, axis)
    return out


def _lse_list(values: list[float]) -> float:
    top = max(values)
    if top == -math.inf:
        return top
    return top + math.log(sum(math.exp(v - top) for v in values))


@dataclass
class Detector:
    """State of one series' e-detector since its last reset, indexed by PREDICTION time.

    The candidate change times are a grid tau_j = origin + j * spacing. For each tau_j
    and alternative a, P_aj is the product of the likelihood ratios of every sample
    predicted at or after tau_j, in whatever order the labels arrive: whether a sample
    enters P_aj depends on its prediction time only (known before its label), so each
    P_aj is a martingale under the null in arrival order, and so is

        M = sum_j w_j mean_a P_aj  (+ 1 - the w_j of the grid points opened so far)

    with M_0 = 1: Ville's inequality holds for ever, and late labels of predictions
    made before a change never dilute the evidence about it (they enter no product
    of a later tau). The oldest grid points are frozen past ``MAX_GRID`` (a stopped
    martingale is one too), so memory is bounded. Samples predicted before ``origin``
    are ignored: after a publish the origin is its ``fitted_at``. Without times
    (``ts=None``) each sample is its own grid point: the Shiryaev-Roberts e-detector
    over sample counts.

    Stored: ``log_p`` = log P_aj - ``off``_a (a batch adds the same vector to every grid
    point older than its samples: that goes into ``off``), and per block of ``BLOCK``
    grid points log sum_j w_j exp(log_p_aj), recomputed only for the blocks a batch
    reaches, so an update costs the recent grid points, not all of them.
    """

    origin: float | None = None  # tau_0 (None: set by the first samples)
    spacing: float = 1.0
    log_p: np.ndarray = field(default_factory=lambda: np.zeros((len(ALTERNATIVES), 0)))
    first: int = 0  # grid index of log_p's column 0 (a multiple of BLOCK)
    opened: int = 0  # grid points opened (columns of log_p in use: opened - first)
    off: np.ndarray = field(default_factory=lambda: np.zeros(len(ALTERNATIVES)))
    log_frozen: float = -math.inf  # log of the frozen points' sum w_j mean_a P_aj
    w_open: float = 0.0  # sum of w_j over the grid points opened so far
    k: int = 0  # samples fed since reset
    log_m_max: float = 0.0  # largest log M seen since reset
    alarm_k: int | None = None  # samples fed when M first crossed the threshold
    log_m: float = 0.0  # log M now (0 right after a reset)
    blk: np.ndarray = field(default_factory=lambda: np.zeros((len(ALTERNATIVES), 0)))
    _dirty: int = 1 << 62  # first block whose sum is stale

    @classmethod
    def new(cls, origin: float | None = None, spacing: float = 1.0) -> Detector:
        return cls(origin, float(spacing))

    def update(self, p: np.ndarray, y: np.ndarray, log_threshold: float,
               tilt: np.ndarray | None = None, ts: np.ndarray | None = None,
               now: float | None = None) -> None:
        """Feed samples (any order); latch the alarm when M crosses the threshold.
        ``tilt``: the batch's tilt_log_lr (multiclass), added to the mixture on the
        detector's first batch; ``ts``: the samples' prediction times; ``now``: no grid
        point is opened past it."""
        n = len(p)
        if n == 0:
            return
        if tilt is not None and self.k == 0 and len(self.off) == len(ALTERNATIVES):
            extra = len(tilt)  # the tilts join: rows at P = 1 for every point so far
            self.log_p = np.vstack((self.log_p, np.zeros((extra, self.log_p.shape[1]))))
            self.off = np.concatenate((self.off, np.zeros(extra)))
            self.blk = np.vstack((self.blk, np.zeros((extra, self.blk.shape[1]))))
            self._reblock(0)
        if ts is None:  # sequential: sample k is predicted at time k
            ts = np.arange(self.k, self.k + n, dtype=np.float64)
            self.origin = 0.0 if self.origin is None else self.origin
        ts = np.asarray(ts, dtype=np.float64)
        if self.origin is None:
            self.origin = math.floor(float(ts.min()) / self.spacing) * self.spacing
        keep = ts >= self.origin
        ll_all = _stack(len(self.off), log_lr(p, y), tilt)
        if not keep.all():
            ll_all, ts = ll_all[:, keep], ts[keep]
        self.k += n
        if len(ts):
            top = float(ts.max()) if now is None else min(float(ts.max()), now)
            self._open(math.floor((top - self.origin) / self.spacing) + 1)
            order = np.argsort(ts, kind="stable")
            t_sorted = ts[order]
            ll = ll_all[:, order]
            suffix = np.zeros((len(ll), len(order) + 1))
            suffix[:, :-1] = np.cumsum(ll[:, ::-1], axis=1)[:, ::-1]
            total = suffix[:, 0].copy()
            self.off += total  # every grid point at or before the oldest sample
            # grid points after the oldest sample see only the samples after them
            j0 = max(self.first, math.floor((t_sorted[0] - self.origin) / self.spacing) + 1)
            if j0 < self.opened:
                taus = self.origin + self.spacing * np.arange(j0, self.opened)
                idx = np.searchsorted(t_sorted, taus, side="left")
                c0 = j0 - self.first
                self.log_p[:, c0:c0 + len(taus)] += suffix[:, idx] - total[:, None]
                self._dirty = min(self._dirty, c0 // BLOCK)
        self.log_m = self._log_m()
        if self.alarm_k is None and self.log_m >= log_threshold:
            self.alarm_k = self.k
        self.log_m_max = max(self.log_m_max, self.log_m)

    def _lw(self, b: int) -> np.ndarray:
        """log w_j of block b's grid points (-inf where not opened yet)."""
        j0 = self.first + b * BLOCK
        lw = np.full(BLOCK, -np.inf)
        m = max(0, min(BLOCK, self.opened - j0))
        lw[:m] = log_weights(j0, m)
        return lw

    def _reblock(self, start: int) -> None:
        self._dirty = 1 << 62
        for b in range(start, self.blk.shape[1]):
            cols = self.log_p[:, b * BLOCK:(b + 1) * BLOCK]
            self.blk[:, b] = _lse(cols + self._lw(b)[None, :], axis=1)

    def _open(self, upto: int) -> None:
        """Open grid points up to index ``upto`` (exclusive), freezing the oldest."""
        if upto <= self.opened:
            return
        if upto - self.opened > MAX_GRID:  # a long gap: the points it skips stay at 1
            self._freeze(self.blk.shape[1])
            skip_to = (upto - MAX_GRID) // BLOCK * BLOCK
            gap = _weight_sum(self.opened, skip_to)
            self.log_frozen = float(np.logaddexp(self.log_frozen, math.log(max(gap, 1e-300))))
            self.w_open += gap
            self.first = self.opened = skip_to
        start = (self.opened - self.first) // BLOCK
        self.w_open += _weight_sum(self.opened, upto)
        need = -(-(upto - self.first) // BLOCK)
        grow = need - self.blk.shape[1]
        if grow > 0:
            self.log_p = np.concatenate([self.log_p, np.zeros((len(self.off), grow * BLOCK))],
                                        axis=1)
            self.blk = np.concatenate([self.blk, np.full((len(self.off), grow), -np.inf)],
                                      axis=1)
        # new points start at P = 1: stored as -off
        self.log_p[:, self.opened - self.first:upto - self.first] = -self.off[:, None]
        self.opened = upto
        self._reblock(min(start, self._dirty))
        if self.blk.shape[1] > MAX_GRID // BLOCK:
            self._freeze(self.blk.shape[1] - MAX_GRID // BLOCK)

    def _freeze(self, blocks: int) -> None:
        if blocks <= 0:
            return
        part = _lse(self.blk[:, :blocks] + self.off[:, None], axis=1)  # (J,)
        self.log_frozen = _lse_list([self.log_frozen,
                                     _lse_list(part.tolist()) - math.log(len(part))])
        self.log_p = self.log_p[:, blocks * BLOCK:].copy()
        self.blk = self.blk[:, blocks:].copy()
        self.first = min(self.first + blocks * BLOCK, self.opened)

    def _log_m(self) -> float:
        if self._dirty < self.blk.shape[1]:
            self._reblock(self._dirty)
        parts = [self.log_frozen, math.log1p(-min(self.w_open, 0.999999))]
        if self.blk.shape[1]:
            per_alt = _lse(self.blk, axis=1) + self.off
            parts.append(float(_lse(per_alt[None, :], axis=1)[0]) - math.log(len(per_alt)))
        return _lse_list(parts)

    def change_ts(self) -> float | None:
        """CUSUM estimate of where the change began: the open grid point whose samples
        (those predicted since it) have the largest log-likelihood ratio under the best
        alternative (to the grid's spacing)."""
        cols = self.opened - self.first
        if self.origin is None or cols <= 0:
            return None
        best = (self.log_p[:, :cols] + self.off[:, None]).max(axis=0)
        # the latest of tied points: points with no samples between them tie exactly
        j = cols - 1 - int(np.argmax(best[::-1]))
        return self.origin + self.spacing * (self.first + j)

    @property
    def alarmed(self) -> bool:
        return self.alarm_k is not None

    def snapshot(self) -> dict[str, Any]:
        return {"origin": self.origin, "spacing": self.spacing,
                "log_p": self.log_p.copy(), "first": self.first, "opened": self.opened,
                "off": self.off.copy(), "log_frozen": _finite(self.log_frozen),
                "w_open": self.w_open, "k": self.k, "log_m_max": self.log_m_max,
                "alarm_k": self.alarm_k, "log_m": self.log_m}

    @classmethod
    def restore(cls, snap: dict[str, Any]) -> Detector:
        """The detector of ``snapshot()``; a new one for a state of another version."""
        try:
            off = np.asarray(snap["off"], dtype=np.float64)
            j = len(off)
            log_p = np.asarray(snap["log_p"], dtype=np.float64).reshape(j, -1)
            tilts, rest = divmod(j - len(ALTERNATIVES), len(TILTS))
            if rest or not 0 <= tilts <= MAX_TILT_CLASSES or log_p.shape[1] % BLOCK or not (
                    np.isfinite(log_p).all() and np.isfinite(off).all()):
                return cls.new()
            frozen = snap.get("log_frozen")
            d = cls(None if snap["origin"] is None else float(snap["origin"]),
                    float(snap["spacing"]), log_p, int(snap["first"]), int(snap["opened"]),
                    off, -math.inf if frozen is None else float(frozen),
                    float(snap["w_open"]), int(snap["k"]), float(snap["log_m_max"]),
                    None if snap.get("alarm_k") is None else int(snap["alarm_k"]),
                    float(snap["log_m"]), np.zeros((j, log_p.shape[1] // BLOCK)))
        except (KeyError, TypeError, ValueError):
            return cls.new()
        d._reblock(0)
        return d


def _finite(v: float) -> float | None:
    return v if math.isfinite(v) else None


def _stack(rows: int, ll: np.ndarray, tilt: np.ndarray | None) -> np.ndarray:
    """The batch's log-LRs in the detector's ``rows``: a batch without (matching) tilts
    gives them log-LR 0 (a ratio of 1 keeps M valid)."""
    extra = rows - len(ALTERNATIVES)
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
