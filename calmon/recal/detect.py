"""Sequential, anytime-valid drift detection: a mixture e-detector per series.

Null hypothesis for one series: every joined sample's label is Bernoulli(p), where p is
the live calibrator's output (binary: P(y=1) against y; multiclass: top-label confidence
against correctness). Alternatives are Platt-form distortions of p,
q = sigmoid(a * logit(p) + b), on a small grid of (a, b) (sharpening/softening and
intercept shifts). For sample i the likelihood ratio L_ji = q_j/p (y = 1) or
(1 - q_j)/(1 - p) (y = 0) has expectation exactly 1 under the null.

The statistic is a weighted Shiryaev-Roberts e-detector, mixed over alternatives:

    S_jn = (S_j,n-1 + w_n) * L_jn        (S_j0 = 0)
    M_n  = sum_j v_j S_jn + (1 - W_n)     (W_n = w_1 + ... + w_n <= 1, sum_j v_j = 1)

S_jn = sum_k w_k prod_{i=k..n} L_ji is a mixture over change points k with summable
weights w_k, so M_n is a nonnegative martingale with M_0 = 1 under the null, and by
Ville's inequality P(sup_n M_n >= 1/alpha) <= alpha: the false-alarm probability is
bounded for ever, however many samples and checks come (Shin, Ramdas and Rinaldo 2023,
"E-detectors"; the weights make it valid over an infinite horizon, unlike a plain SR
or CUSUM threshold, whose false alarms only space out). The price is log(1/w_k) nats of
extra evidence for a change after k grid points: w_k ~ 1 / (k log^2 k), 9.8 nats a day
after a restart (5-minute grid), 14.1 nats after a month. The alarm's change time is the
CUSUM start: the k maximising the best alternative's log-likelihood ratio of samples k..n.

Multiclass models have further alternatives that tilt one class: q = softmax(log p +
d e_c), for EVERY class c and d in ``TILTS``, tested on the full label: L = q_y / p_y =
e^(d [y = c]) / (1 + p_c (e^d - 1)), again of mean 1 under the null (the label drawn
from the calibrated p). A class-prior shift moves one class's frequency while the
top-label confidence hardly changes; these find it. Half the mixture's weight v is on
the Platt alternatives and half on the K * len(TILTS) tilts, so a K = 1,000 model pays
log 2 nats for a temperature drift and log(8,000) for a one-class shift; the cost of a
batch is linear in K. The tilts join the mixture when a series' detector first sees
multiclass samples; a batch without them (another K) counts as likelihood ratio 1 for
them, which keeps M a martingale.

The change points are points of PREDICTION time, not positions in arrival order (see
``Detector``): under label delay the labels of predictions made before a change arrive
mixed with those made after it, and must not dilute the evidence about it. The points
are thinned with age (older ones kept at a coarser spacing, ~1/64 of their age), so the
change-time search reaches back to the detector's restart however long ago it was, in
bounded memory.

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
_WEIGHT_SUM: Final = 2.2  # sum_{m>=2} 1/(m ln^2 m) = 2.1097...; dividing by 2.2 keeps W <= 1
_P_EPS: Final = 1e-12
_LOG_CAP: Final = 700.0  # exp(700) is still a finite float
BLOCK: Final = 64  # grid points summed together, so an update touches only recent ones
MAX_GRID: Final = 16 * BLOCK  # grid points opened at once at most (a longer gap stays at 1)
RESOLUTION: Final = 128  # grid points kept at full resolution; older ones at ~2 age / this
CHANGE_SET_NATS: Final = 3.0  # the change-time set: within 3 nats of the best (~90%)


def log_weights(k0: int, n: int) -> np.ndarray:
    """log w_j for j = k0 .. k0+n-1, w_j = 1 / (2.2 (j+2) ln^2(j+2)) (sum < 0.96)."""
    m = np.arange(k0 + 2, k0 + n + 2, dtype=np.float64)
    return -(math.log(_WEIGHT_SUM) + np.log(m) + 2.0 * np.log(np.log(m)))


def _log_weights_at(j: np.ndarray) -> np.ndarray:
    m = j.astype(np.float64) + 2.0
    out: np.ndarray = -(math.log(_WEIGHT_SUM) + np.log(m) + 2.0 * np.log(np.log(m)))
    return out


_TABLE_MAX: Final = 1 << 18  # grid points whose weights are kept in a table (4 MiB)
_TABLE: list[np.ndarray] = [np.zeros(0), np.zeros(0)]  # log w_j and w_j, j = 0 ..


def _weights(lo: int, hi: int) -> tuple[np.ndarray, float]:
    """(log w_j for j in [lo, hi), the sum of those w_j): the floats of
    ``_log_weights_at`` and ``np.exp(...).sum()``, read from a table (both elementwise,
    so a slice of the table is the same floats) as a check opens a point or two."""
    if hi > _TABLE_MAX:
        lw = _log_weights_at(np.arange(lo, hi, dtype=np.int64))
        return lw, float(np.exp(lw).sum())
    if hi > len(_TABLE[0]):
        size = min(_TABLE_MAX, max(hi, 2 * len(_TABLE[0]), 4096))
        _TABLE[0] = _log_weights_at(np.arange(size, dtype=np.int64))
        _TABLE[1] = np.exp(_TABLE[0])
    return _TABLE[0][lo:hi], float(_TABLE[1][lo:hi].sum())


def row_log_weights(rows: int) -> np.ndarray:
    """log v of each alternative: uniform over the Platt ones, or half on them and half
    on the tilts (rows past ``ALTERNATIVES``) when there are tilts."""
    n_alt = len(ALTERNATIVES)
    tilts = rows - n_alt
    if tilts <= 0:
        return np.full(rows, -math.log(rows))
    return np.concatenate((np.full(n_alt, -math.log(2 * n_alt)),
                           np.full(tilts, -math.log(2 * tilts))))


_ROW_LW: dict[int, np.ndarray] = {}


def _row_lw(rows: int) -> np.ndarray:
    out = _ROW_LW.get(rows)
    if out is None:
        out = _ROW_LW[rows] = row_log_weights(rows)
    return out


_A: Final = ALTERNATIVES[:, :1].copy()
_B: Final = ALTERNATIVES[:, 1:].copy()


def tilt_log_lr(probs: np.ndarray, labels: np.ndarray) -> np.ndarray | None:
    """(K * len(TILTS), n) log-likelihood ratios of the one-class tilts against the
    calibrated class probabilities ``probs`` (n, K); None for binary scores. Row
    c * len(TILTS) + j tilts class c by TILTS[j]. Cost O(n K)."""
    if probs.ndim != 2 or probs.shape[1] < 2:
        return None
    n, k = probs.shape
    pc = np.clip(probs, 0.0, 1.0).T[:, None, :]  # (K, 1, n)
    d = TILTS[None, :, None]  # (1, T, 1)
    # log(1 + p (e^d - 1)) >= log(e^d) > -inf for p in [0, 1]: always finite
    out = -np.log1p(pc * np.expm1(d))
    lab = np.asarray(labels, dtype=np.int64)
    out[lab, :, np.arange(n)] += TILTS[None, :]
    return np.asarray(np.clip(out.reshape(k * len(TILTS), n), -_LOG_CAP, _LOG_CAP))


def log_lr(p: np.ndarray, y: np.ndarray) -> np.ndarray:
    """(J, n) log-likelihood ratios of every alternative against Bernoulli(p)."""
    p = np.asarray(p, dtype=np.float64)
    pos = np.asarray(y, dtype=np.float64) > 0.5
    pc = np.minimum(np.maximum(p, _P_EPS), 1.0 - _P_EPS)  # np.clip's floats, fewer calls
    z = np.log(pc / (1.0 - pc))
    # log q = -log(1 + e^-eta) for y = 1, log(1 - q) = -log(1 + e^eta) for y = 0: one
    # logaddexp with the sign folded into eta. The denominators use the unclipped p so
    # E[L] = 1 holds exactly (p = 0 with y = 1 is infinite evidence, capped). In place:
    # the same floats as (A z + B) sign, -logaddexp(0, eta) - log_p, clipped.
    eta = _A * z
    eta += _B
    eta *= np.where(pos, -1.0, 1.0)
    with np.errstate(divide="ignore"):
        log_p = np.log(np.where(pos, p, 1.0 - p))
    out: np.ndarray = np.logaddexp(0.0, eta, out=eta)
    np.negative(out, out=out)
    out -= log_p
    np.maximum(out, -_LOG_CAP, out=out)
    np.minimum(out, _LOG_CAP, out=out)
    return out


def _weight_sum(lo: int, hi: int) -> float:
    """sum of w_j for j in [lo, hi): exact up to a million terms, else a lower bound."""
    if hi <= lo:
        return 0.0
    if hi - lo <= 1_000_000:
        return float(np.exp(log_weights(lo, hi - lo)).sum())
    # integral of 1/(m ln^2 m) from lo+2 to hi+2: below the sum (the terms decrease)
    return (1.0 / math.log(lo + 2) - 1.0 / math.log(hi + 2)) / _WEIGHT_SUM


_R_BITS: Final = RESOLUTION.bit_length() - 1  # RESOLUTION = 2^_R_BITS
_EXACT_AGE: Final = 1 << 48  # float log2 and the bit length agree on ages below this


def _kept(j: np.ndarray, newest: int) -> np.ndarray:
    """Which grid points stay open: the newest ``RESOLUTION`` all; older ones at age in
    [R 2^(L-1), R 2^L) only at multiples of 2^L (R/2 points an octave of age, nested, so
    a point dropped never has to come back). Point 0, the restart, always stays."""
    age = np.maximum(newest - j, 0)
    if newest < _EXACT_AGE:  # floor(log2(age / R)) + 1 as the exponent frexp gives
        # age // R (the bit length): the same integers below 2^48, in two calls
        level = np.frexp(age >> _R_BITS)[1].astype(np.int64)
    else:
        level = np.zeros(len(j), dtype=np.int64)
        old = age >= RESOLUTION
        level[old] = np.floor(np.log2(age[old] / RESOLUTION)).astype(np.int64) + 1
    return np.asarray((j & ((np.int64(1) << level) - 1)) == 0)


def _lse(x: np.ndarray, axis: int) -> np.ndarray:
    """log sum exp along ``axis`` (-inf for all -inf), without warnings (the ufuncs'
    reduce: what x.max / x.sum call, without their wrappers)."""
    top = np.maximum.reduce(x, axis=axis, keepdims=True)
    top[~np.isfinite(top)] = 0.0
    e = np.subtract(x, top)
    total = np.add.reduce(np.exp(e, out=e), axis=axis)
    out = np.full(total.shape, -np.inf)
    np.log(total, out=out, where=total > 0)
    out += top.reshape(total.shape)  # squeezed, without np.squeeze's wrapper
    return out


def _lse_list(values: list[float]) -> float:
    top = max(values)
    if top == -math.inf:
        return top
    return top + math.log(sum(math.exp(v - top) for v in values))


def _empty_rows() -> np.ndarray:
    return np.zeros((len(ALTERNATIVES), 0))


@dataclass
class Detector:
    """State of one series' e-detector since its last reset, indexed by PREDICTION time.

    The candidate change times are grid points tau_j = origin + j * spacing. For each
    open tau_j and alternative a, P_aj is the product of the likelihood ratios of every
    sample predicted at or after tau_j, in whatever order the labels arrive: whether a
    sample enters P_aj depends on its prediction time only (known before its label), so
    each P_aj is a martingale under the null in arrival order, and so is

        M = sum_j w_j sum_a v_a P_aj  (+ 1 - the w_j of the grid points opened so far)

    with M_0 = 1: Ville's inequality holds for ever, and late labels of predictions
    made before a change never dilute the evidence about it (they enter no product
    of a later tau). Open points are thinned with age (``_kept``): a dropped point's
    term is frozen at its value then (a stopped martingale is one too), so memory is
    bounded and the points still reach back to the origin. Samples predicted before
    ``origin`` are ignored: after a publish the origin is its ``fitted_at``. Without
    times (``ts=None``) each sample is its own grid point: the Shiryaev-Roberts
    e-detector over sample counts.

    Stored: ``cols`` = the grid index j of each open column; ``log_p`` = log P_aj -
    ``off``_a (a batch adds the same vector to every point older than its samples: that
    goes into ``off``); per block of ``BLOCK`` columns log sum_j w_j exp(log_p_aj),
    recomputed only for the blocks a batch reaches.
    """

    origin: float | None = None  # tau_0 (None: set by the first samples)
    spacing: float = 1.0
    log_p: np.ndarray = field(default_factory=_empty_rows)
    cols: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    ncols: int = 0  # columns of log_p in use
    opened: int = 0  # grid points opened (or dropped) so far: the next j
    off: np.ndarray = field(default_factory=lambda: np.zeros(len(ALTERNATIVES)))
    log_frozen: float = -math.inf  # log of the dropped points' sum w_j sum_a v_a P_aj
    w_open: float = 0.0  # sum of w_j over the grid points opened so far
    k: int = 0  # samples fed since reset
    log_m_max: float = 0.0  # largest log M seen since reset
    alarm_k: int | None = None  # samples fed when M first crossed the threshold
    log_m: float = 0.0  # log M now (0 right after a reset)
    blk: np.ndarray = field(default_factory=_empty_rows)
    lw: np.ndarray = field(default_factory=lambda: np.zeros(0))  # log w_j of each column
    _dirty: int = 1 << 62  # first block whose sum is stale

    @classmethod
    def new(cls, origin: float | None = None, spacing: float = 1.0) -> Detector:
        return cls(origin, float(spacing))

    @property
    def row_lw(self) -> np.ndarray:
        return _row_lw(len(self.off))

    def update(self, p: np.ndarray, y: np.ndarray, log_threshold: float,
               tilt: np.ndarray | None = None, ts: np.ndarray | None = None,
               now: float | None = None, ll: np.ndarray | None = None) -> None:
        """Feed samples (any order); latch the alarm when M crosses the threshold.
        ``tilt``: the batch's tilt_log_lr (multiclass), added to the mixture on the
        detector's first batch; ``ts``: the samples' prediction times; ``now``: no grid
        point is opened past it; ``ll``: ``log_lr(p, y)`` when the caller has it."""
        n = len(p)
        if n == 0:
            return
        if tilt is not None and self.k == 0 and len(self.off) == len(ALTERNATIVES):
            extra = len(tilt)  # the tilts join: rows at P = 1 for every point so far
            self.log_p = np.vstack((self.log_p, np.zeros((extra, self.log_p.shape[1]))))
            self.off = np.concatenate((self.off, np.zeros(extra)))
            self.blk = np.vstack((self.blk, np.full((extra, self.blk.shape[1]), -np.inf)))
            self._reblock(0)
        if ts is None:  # sequential: sample k is predicted at time k
            ts = np.arange(self.k, self.k + n, dtype=np.float64)
            self.origin = 0.0 if self.origin is None else self.origin
        ts = np.asarray(ts, dtype=np.float64)
        lo = float(np.minimum.reduce(ts))  # ts.min(), unwrapped (NaN: the mask below)
        if self.origin is None:
            self.origin = math.floor(lo / self.spacing) * self.spacing
        ll_all = _stack(len(self.off), log_lr(p, y) if ll is None else ll, tilt)
        if not lo >= self.origin:  # some predate the origin: those are left out
            keep = ts >= self.origin
            ll_all, ts = ll_all[:, keep], ts[keep]
        self.k += n
        if len(ts):
            hi = float(np.maximum.reduce(ts))
            top = hi if now is None else min(hi, now)
            self._open(math.floor((top - self.origin) / self.spacing) + 1)
            self._add(ll_all, ts)
        self.log_m = self._log_m()
        if self.alarm_k is None and self.log_m >= log_threshold:
            self.alarm_k = self.k
        self.log_m_max = max(self.log_m_max, self.log_m)

    def _add(self, ll: np.ndarray, ts: np.ndarray) -> None:
        """Every open point's product gains the ratios of the samples predicted at or
        after it."""
        origin = self.origin
        assert origin is not None
        order = ts.argsort(kind="stable")
        t_sorted = ts[order]
        ll = ll[:, order]
        suffix = np.zeros((len(ll), len(order) + 1))
        suffix[:, :-1] = ll[:, ::-1].cumsum(axis=1)[:, ::-1]
        total = suffix[:, 0].copy()
        self.off += total  # every point at or before the oldest sample
        # points after the oldest sample see only the samples after them
        j0 = math.floor((t_sorted[0] - origin) / self.spacing) + 1
        c0 = int(self.cols[:self.ncols].searchsorted(j0, side="left"))
        if c0 < self.ncols:
            taus = origin + self.spacing * self.cols[c0:self.ncols]
            idx = t_sorted.searchsorted(taus, side="left")
            self.log_p[:, c0:self.ncols] += suffix[:, idx] - total[:, None]
            self._dirty = min(self._dirty, c0 // BLOCK)

    def _reblock(self, start: int) -> None:
        """The block sums from block ``start`` on, all at once (each block's sum is the
        same reduction of its own 64 columns as one by one: the same floats)."""
        self._dirty = 1 << 62
        # blocks past the open columns hold only -inf columns: their sums stay -inf
        blocks = min(self.blk.shape[1], -(-self.ncols // BLOCK)) - start
        if blocks <= 0:
            return
        sl = slice(start * BLOCK, (start + blocks) * BLOCK)
        x = self.log_p[:, sl] + self.lw[None, sl]
        self.blk[:, start:start + blocks] = _lse(x.reshape(len(x), blocks, BLOCK), axis=2)

    def _open(self, upto: int) -> None:
        """Open grid points up to index ``upto`` (exclusive); thin the old ones."""
        if upto <= self.opened:
            return
        if upto - self.opened > MAX_GRID:  # a long gap: the points it skips stay at 1
            skip_to = upto - MAX_GRID
            self._freeze_at_one(_weight_sum(self.opened, skip_to))
            self.w_open += _weight_sum(self.opened, skip_to)
            self.opened = skip_to
        new = np.arange(self.opened, upto, dtype=np.int64)
        lw, w = _weights(self.opened, upto)
        self.w_open += w
        self.opened = upto
        if len(new) > RESOLUTION:  # born old (a gap): stopped at P = 1 at once
            keep = _kept(new, upto - 1)
            self._freeze_at_one(float(np.exp(lw[~keep]).sum()))
            new, lw = new[keep], lw[keep]
        if self.ncols + len(new) > self.log_p.shape[1]:
            self._thin()
        need = self.ncols + len(new)
        if need > self.log_p.shape[1]:
            grow = -(-(need - self.log_p.shape[1]) // BLOCK)
            rows = len(self.off)
            self.log_p = np.concatenate([self.log_p, np.zeros((rows, grow * BLOCK))], axis=1)
            self.blk = np.concatenate([self.blk, np.full((rows, grow), -np.inf)], axis=1)
            self.cols = np.concatenate([self.cols, np.full(grow * BLOCK, -1, np.int64)])
            self.lw = np.concatenate([self.lw, np.full(grow * BLOCK, -np.inf)])
        sl = slice(self.ncols, need)
        self.log_p[:, sl] = -self.off[:, None]  # new points start at P = 1: stored as -off
        self.cols[sl] = new
        self.lw[sl] = lw
        self._dirty = min(self._dirty, self.ncols // BLOCK)
        self.ncols = need

    def _freeze_at_one(self, weight: float) -> None:
        if weight > 0:
            self.log_frozen = float(np.logaddexp(self.log_frozen, math.log(weight)))

    def _thin(self) -> None:
        """Drop the columns ``_kept`` no longer keeps, their terms frozen as they are."""
        n = self.ncols
        keep = _kept(self.cols[:n], self.opened - 1)
        kept = np.flatnonzero(keep)
        m = len(kept)
        if m == n:
            return
        gone = ~keep  # (a mask's gather along axis 1 is F-ordered: its sums' floats)
        terms = self.log_p[:, :n][:, gone] + self.off[:, None] + self.lw[None, :n][:, gone]
        part = _lse(_lse(terms, axis=1)[None, :] + self.row_lw[None, :], axis=1)[0]
        self.log_frozen = _lse_list([self.log_frozen, float(part)])
        cap = self.log_p.shape[1]
        # shrink to the blocks in use plus one, so memory follows the open points
        width = min(cap, (-(-m // BLOCK) + 1) * BLOCK)
        log_p, cols, lw = self.log_p.take(kept, axis=1), self.cols.take(kept), self.lw.take(kept)
        if width < cap:
            self.log_p = np.zeros((len(self.off), width))
            self.cols, self.lw = np.full(width, -1, np.int64), np.full(width, -np.inf)
        else:
            self.log_p[:, m:] = 0.0
            self.cols[m:], self.lw[m:] = -1, -np.inf
        self.log_p[:, :m], self.cols[:m], self.lw[:m] = log_p, cols, lw
        self.ncols = m
        # every block sum is stale: _log_m, which ends every update, computes them all
        # once the update's columns are in (the same reduction of the same columns)
        self.blk = np.full((len(self.off), self.log_p.shape[1] // BLOCK), -np.inf)
        self._dirty = 0

    def _log_m(self) -> float:
        if self._dirty < self.blk.shape[1]:
            self._reblock(self._dirty)
        parts = [self.log_frozen, math.log1p(-min(self.w_open, 0.999999))]
        if self.blk.shape[1]:
            terms = self.blk + (self.off + self.row_lw)[:, None]
            top = float(np.maximum.reduce(terms, axis=None))  # terms.max(), unwrapped
            if top > -math.inf:
                terms -= top
                parts.append(top + math.log(float(np.add.reduce(np.exp(terms, out=terms),
                                                                axis=None))))
        return _lse_list(parts)

    def _profile(self) -> np.ndarray:
        """Per open column, the best alternative's log-likelihood ratio of the samples
        predicted since it (the CUSUM profile)."""
        best: np.ndarray = (self.log_p[:, :self.ncols] + self.off[:, None]).max(axis=0)
        return best

    def change_ts(self) -> float | None:
        """CUSUM estimate of where the change began: the open grid point whose samples
        (those predicted since it) have the largest log-likelihood ratio under the best
        alternative (to the grid's spacing there)."""
        if self.origin is None or self.ncols <= 0:
            return None
        best = self._profile()
        # the latest of tied points: points with no samples between them tie exactly
        j = self.ncols - 1 - int(np.argmax(best[::-1]))
        return self.origin + self.spacing * float(self.cols[j])

    def change_set(self, nats: float = CHANGE_SET_NATS) -> tuple[float, float] | None:
        """(earliest, latest) grid point whose profile is within ``nats`` of the best:
        a confidence set for the change time. For a known alternative the true change
        point falls outside it with probability at most 2 e^-nats (on either side the
        profile's excess over the true point is a likelihood ratio martingale, Ville);
        3 nats: ~90%. With few positives the set is wide, and its late end keeps a refit
        off the samples before the change."""
        if self.origin is None or self.ncols <= 0:
            return None
        best = self._profile()
        inside = np.flatnonzero(best >= best.max() - nats)
        lo, hi = self.cols[inside[0]], self.cols[inside[-1]]
        return self.origin + self.spacing * float(lo), self.origin + self.spacing * float(hi)

    @property
    def alarmed(self) -> bool:
        return self.alarm_k is not None

    def snapshot(self) -> dict[str, Any]:
        n = self.ncols
        return {"origin": self.origin, "spacing": self.spacing,
                "log_p": self.log_p[:, :n].copy(), "cols": self.cols[:n].copy(),
                "opened": self.opened, "off": self.off.copy(),
                "log_frozen": _finite(self.log_frozen), "w_open": self.w_open, "k": self.k,
                "log_m_max": self.log_m_max, "alarm_k": self.alarm_k, "log_m": self.log_m}

    @classmethod
    def restore(cls, snap: dict[str, Any]) -> Detector:
        """The detector of ``snapshot()`` (or of the contiguous grid before thinning: its
        columns ``first``..); a new one for a state it cannot read."""
        try:
            off = np.asarray(snap["off"], dtype=np.float64)
            j = len(off)
            log_p = np.asarray(snap["log_p"], dtype=np.float64).reshape(j, -1)
            opened = int(snap["opened"])
            if "cols" in snap:
                cols = np.asarray(snap["cols"], dtype=np.int64).reshape(-1)
            else:  # the contiguous grid: first .. first + width, opened - first in use
                first = int(snap["first"])
                cols = np.arange(first, opened, dtype=np.int64)
                log_p = log_p[:, :len(cols)]
            tilts, rest = divmod(j - len(ALTERNATIVES), len(TILTS))
            if (rest or tilts < 0 or len(cols) != log_p.shape[1]
                    or (len(cols) and (np.any(np.diff(cols) <= 0) or cols[-1] >= opened
                                       or cols[0] < 0))
                    or not (np.isfinite(log_p).all() and np.isfinite(off).all())):
                return cls.new()
            frozen = snap.get("log_frozen")
            n = len(cols)
            width = (-(-n // BLOCK)) * BLOCK
            d = cls(None if snap["origin"] is None else float(snap["origin"]),
                    float(snap["spacing"]), np.zeros((j, width)),
                    np.full(width, -1, np.int64), n, opened, off,
                    -math.inf if frozen is None else float(frozen), float(snap["w_open"]),
                    int(snap["k"]), float(snap["log_m_max"]),
                    None if snap.get("alarm_k") is None else int(snap["alarm_k"]),
                    float(snap["log_m"]), np.zeros((j, width // BLOCK)),
                    np.full(width, -np.inf))
            d.log_p[:, :n], d.cols[:n], d.lw[:n] = log_p, cols, _log_weights_at(cols)
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


def fit_start(ts: np.ndarray, estimate: float, late: float, need: int) -> float:
    """Where a refit's samples start: the latest time in [estimate, late] (the change
    time's point estimate and the late end of its confidence set) that still leaves
    ``need`` samples of ``ts`` at or after it. The refit never waits longer than the
    point estimate would make it, and fits on the samples least likely to predate the
    change: all from ``late`` when those are enough."""
    after = np.sort(ts[ts >= estimate])
    if len(after) <= need or late <= estimate:
        return estimate
    return float(min(late, after[len(after) - need]))


def newest_regime(p: np.ndarray, y: np.ndarray, ts: np.ndarray, log_threshold: float,
                  spacing: float, tilt: np.ndarray | None = None) -> float | None:
    """Where a newer regime starts inside samples that all follow one change: the
    e-detector run over them in prediction time against ``p`` (a candidate fitted on
    all of them); when its statistic ends at or above ``log_threshold`` (one look, so
    Markov's inequality bounds it; fitting ``p`` on these samples only makes it
    harder to reach), the late end of its change-time set, else None. A refit then
    fits only the newest regime (a drift that reverted, a second step)."""
    if len(p) == 0:
        return None
    d = Detector.new(None, spacing)
    d.update(p, y, log_threshold, tilt, ts=ts)
    span = d.change_set()
    if not d.alarmed or span is None or span[1] <= float(np.min(ts)):
        return None
    return span[1]


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
