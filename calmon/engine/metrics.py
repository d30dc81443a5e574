"""Calibration metrics from binned counts: pure numpy, no state.

Definitions are the contract's (section 2): right-closed equal-width bins,
ECE/MCE over them, ACE over equal-mass groups of fine bins, Brier, NLL,
accuracy, observed/expected, and the noise floor of a perfectly calibrated
model with the same bin counts and mean confidences; and (v2) what says how
far to trust them: the debiased l2 calibration error, the smooth ECE, and an
interval for the population ECE.
"""

from __future__ import annotations

import hashlib
import math
import struct
import threading
import zlib
from dataclasses import dataclass, replace

import numpy as np

from calmon.engine.windows import CONF_SCALE, NLL_SCALE, Layout, bin_index


@dataclass(frozen=True)
class Bins:
    """Per-bin sums: samples, summed confidence, summed correctness."""

    count: np.ndarray
    conf: np.ndarray
    correct: np.ndarray


@dataclass(frozen=True)
class Stats:
    samples: int
    ece: float | None
    mce: float | None
    ace: float | None
    brier: float | None
    nll: float | None
    accuracy: float | None
    mean_confidence: float | None
    observed_rate: float | None
    observed_over_expected: float | None
    noise_floor: float | None
    bins: Bins
    ece_l2_debiased: float | None = None
    smece: float | None = None
    ece_lower: float | None = None
    ece_upper: float | None = None

    def as_row(self) -> dict[str, float | int | None]:
        return {name: getattr(self, name) for name in METRIC_NAMES}


METRIC_NAMES = ("samples", "ece", "mce", "ace", "brier", "nll", "accuracy", "mean_confidence",
                "observed_rate", "observed_over_expected", "noise_floor", "ece_l2_debiased",
                "smece", "ece_lower", "ece_upper")


def ece(count: np.ndarray, conf: np.ndarray, correct: np.ndarray) -> float:
    """sum over bins of (n_b / N) * |mean confidence_b - accuracy_b|."""
    n = count.sum()
    nz = count > 0
    gap = np.abs(conf[nz] / count[nz] - correct[nz] / count[nz])
    return float(np.sum(count[nz] / n * gap))


def mce(count: np.ndarray, conf: np.ndarray, correct: np.ndarray,
        min_samples: int = 1) -> float | None:
    """The largest bin gap over bins holding at least ``min_samples`` samples (None if
    none does): a bin of two samples says nothing about calibration."""
    nz = count >= max(min_samples, 1)
    if not nz.any():
        return None
    return float(np.max(np.abs(conf[nz] / count[nz] - correct[nz] / count[nz])))


def ace(fcount: np.ndarray, fconf: np.ndarray, fcorrect: np.ndarray, groups: int) -> float:
    """Adaptive ECE: fine bins merged into ``groups`` equal-mass groups; a group
    closes after the first fine bin where the running count reaches k*N/B."""
    n = fcount.sum()
    running = np.cumsum(fcount)
    thresholds = np.arange(1, groups) * n / groups
    ends = np.unique(np.searchsorted(running, thresholds, side="left"))
    ends = np.append(ends[ends < len(fcount) - 1], len(fcount) - 1)
    starts = np.concatenate(([0], ends[:-1] + 1))
    gc = np.add.reduceat(fcount, starts)
    gconf = np.add.reduceat(fconf, starts)
    gcorr = np.add.reduceat(fcorrect, starts)
    return ece(gc, gconf, gcorr)


def binomial_mad(n: int, p: float) -> float:
    """E|X - np| for X ~ Binomial(n, p), de Moivre's closed form (in log space)."""
    if n <= 0 or p <= 0.0 or p >= 1.0:
        return 0.0
    m = math.floor(n * p)
    if m >= n:
        return 0.0
    log = (math.log(2.0) + (n - m) * math.log1p(-p) + (m + 1) * math.log(p) + math.log(m + 1)
           + math.lgamma(n + 1) - math.lgamma(m + 2) - math.lgamma(n - m))
    return math.exp(log)


def noise_floor(count: np.ndarray, conf: np.ndarray) -> float:
    """Mean ECE of a perfectly calibrated model with the same bin counts and mean
    confidences: labels ~ Bernoulli(mean confidence of the bin)."""
    n = count.sum()
    total = 0.0
    for nb, cb in zip(count.tolist(), conf.tolist()):
        if nb > 0:
            total += binomial_mad(round(nb), cb / nb)
    return float(total / n)


def null_ece_quantile(count: np.ndarray, conf: np.ndarray, q: float,
                      draws: int = 4000, seed: int = 0) -> float:
    """The q-quantile of the ECE a perfectly calibrated model would show with these
    bin counts and mean confidences (Monte Carlo, seeded so it is repeatable)."""
    nz = count > 0
    nb = count[nz].astype(np.int64)
    pb = np.clip(conf[nz] / count[nz], 0.0, 1.0)
    rng = np.random.default_rng(seed)
    x = rng.binomial(nb, pb, size=(draws, len(nb)))
    null = np.abs(x - nb * pb).sum(axis=1) / nb.sum()
    return float(np.quantile(null, q))


def ece_l2_debiased(count: np.ndarray, conf: np.ndarray, correct: np.ndarray) -> float:
    """Kumar et al. 2019: sqrt(max(0, sum_b (n_b/N) ((acc_b - conf_b)^2 - acc_b (1 - acc_b)
    / (n_b - 1)))), bins under two samples contributing 0 (``unbiased_l2_ce``)."""
    n = count.sum()
    ok = count >= 2
    nb = count[ok]
    acc = correct[ok] / nb
    terms = (acc - conf[ok] / nb) ** 2 - acc * (1.0 - acc) / (nb - 1.0)
    return math.sqrt(max(0.0, float(np.sum(nb / n * terms))))


# ------------------------------------------------------------ smooth ECE

SMECE_EPS = 1e-3  # relplot's smECE defaults: bandwidth search to 1e-3, 10 bisections,
SMECE_MESH = 200  # at least 200 evaluation points, density floor 1e-4
SMECE_REFINE = 10


def smece(fcount: np.ndarray, fconf: np.ndarray, fcorrect: np.ndarray) -> float:
    """Smooth ECE (Blasiok and Nakkiran 2023) at the bandwidth fixed point, every sample
    taken at its fine bin's mean confidence. The same discretisation as relplot.smECE
    (grid, linear splatting, reflected Gaussian, interpolation), from per-bin sums: both
    the residual and the density are linear in the samples of a bin."""
    nz = fcount > 0
    n = fcount[nz].astype(np.float64)
    f = fconf[nz] / n
    resid = fconf[nz] - fcorrect[nz]  # sum over the bin of (f - y)

    def at(sigma: float) -> float:
        t = np.linspace(0.0, 1.0, max(round(10 / sigma), SMECE_MESH))
        grid = max(2000, round(20 / sigma)) // 2 + 1
        ys = smooth(f, resid, t, sigma, grid)
        dens = smooth(f, n, t, sigma, grid) + 1e-4
        rs = ys / dens
        return float(np.sum(np.abs(rs) * dens) / np.sum(dens))

    def fits(alpha: float) -> bool:
        return alpha < SMECE_EPS or alpha < at(alpha)

    if fits(1.0):
        return at(1.0)
    start, end = 1.0, 0.0
    for _ in range(SMECE_REFINE):
        mid = (start + end) / 2
        if fits(mid):
            end = mid
        else:
            start = mid
    return at(start)


def smooth(f: np.ndarray, w: np.ndarray, t: np.ndarray, sigma: float, grid: int) -> np.ndarray:
    """Weights ``w`` at ``f`` splatted linearly onto ``grid`` points of [0, 1], convolved
    with a Gaussian reflected at 0 and 1, read at ``t`` by linear interpolation."""
    values = np.zeros(grid)
    idx = (f * (grid - 1)).astype(int).clip(0, grid - 2)
    frac = f * (grid - 1) - idx
    np.add.at(values, idx, (1 - frac) * w)
    np.add.at(values, idx + 1, frac * w)
    u = np.linspace(0.0, 1.0, grid)
    ker = np.exp(-(u - 0.5) * (u - 0.5) / (2 * sigma**2)) / (math.sqrt(2 * math.pi) * sigma)
    ext = np.concatenate([values[::-1][:-1], values, values[::-1][1:]])
    full_len = len(ext) + grid - 1
    nfft = 1 << (full_len - 1).bit_length()
    full = np.fft.irfft(np.fft.rfft(ext, nfft) * np.fft.rfft(ker, nfft), nfft)[:full_len]
    start = grid - 1 + grid // 2  # np.convolve(ext, ker, "valid")[grid//2 : grid//2 + grid]
    smoothed = full[start:start + grid]
    inds = (t * (grid - 1)).astype(int).clip(0, grid - 2)
    resid = (t - inds / (grid - 1)) * (grid - 1)
    out: np.ndarray = smoothed[inds] * (1 - resid) + smoothed[inds + 1] * resid
    return out


# ------------------------------------------------------------ ECE interval

INTERVAL_DRAWS = 1000
# how far (in standard errors) a bin's gap is moved toward 0 for the lower bound and away
# from 0 for the upper one; tuned by the coverage simulation in tests/unit/engine
SHRINK_SE = 2.0
PUSH_SE = 2.0
PSEUDO = 0.5  # pseudo-successes and failures per bin (Jeffreys) for the spread of accuracies


def within_interval(value: float, interval: tuple[float | None, float | None]) -> bool:
    """Whether ``value`` (a calibrated ECE) lies inside ``interval`` (the raw ECE's): a
    difference the samples cannot tell, whichever is larger. False without an interval."""
    lower, upper = interval
    return lower is not None and upper is not None and lower <= value <= upper


def ece_interval(count: np.ndarray, conf: np.ndarray, correct: np.ndarray, level: float,
                 draws: int = INTERVAL_DRAWS) -> tuple[float, float]:
    """An interval at ``level`` for the population binned ECE.

    The plug-in ECE T is biased upward, most where a bin's true gap d_b is 0 (E|e| where
    e is the bin's sampling error) and not at all where |d_b| is large. So the pivot
    T - ECE is simulated by a parametric bootstrap (bin counts multinomial, accuracies
    binomial with the spread the bin shows; the spread of mean confidences is far smaller
    and left out) twice: around gaps shrunk toward 0 by SHRINK_SE standard errors, the
    most biased truth the data allow, for the lower bound; and around gaps of at least
    PUSH_SE standard errors, nearly unbiased, for the upper bound. Each bound thus errs
    on its safe side. The lower bound is moreover 0 while T is within the spread of a
    calibrated model's ECE (a test of calibration, inverted), so calibrated models are
    covered at every n. Seeded from the counts: the same input gives the same interval.
    """
    nz = count > 0
    nb = count[nz]
    total = float(nb.sum())
    w = nb / total
    c = conf[nz] / nb
    a = correct[nz] / nb
    gap = a - c
    t_obs = float(np.sum(w * np.abs(gap)))
    # accuracies shrunk a little toward 1/2: no zero variance in small bins
    q = (correct[nz] + PSEUDO) / (nb + 2.0 * PSEUDO)
    se = np.sqrt(q * (1.0 - q) / nb)
    sign = np.where(gap >= 0, 1.0, -1.0)
    shrunk = sign * np.maximum(np.abs(gap) - SHRINK_SE * se, 0.0)
    reach = np.maximum(np.abs(gap), PUSH_SE * se)  # |gap| >= 2 se: bias ~ 0 anyway
    # toward the side there is room on (a bin of confidence 1, all correct, may be 0.98)
    sign = np.where((c + sign * reach > 1.0) | (c + sign * reach < 0.0), -sign, sign)
    pushed = sign * reach
    seed = zlib.crc32(np.ascontiguousarray(count, np.float64).tobytes()
                      + np.ascontiguousarray(correct, np.float64).tobytes())
    rng = np.random.default_rng(seed)
    n_star = rng.multinomial(round(total), w, size=draws)
    alpha = 1.0 - level
    bounds = []
    for centre, qq in ((shrunk, 1.0 - alpha / 2), (pushed, alpha / 2)):
        p = np.clip(c + centre, 0.0, 1.0)
        # the centre moves the mean only: the noise keeps the spread the data show
        noise = bin_means(rng, n_star, nb, q) - q
        t_star = np.sum(n_star / total * np.abs(p + noise - c), axis=1)
        pivot = t_star - float(np.sum(w * np.abs(p - c)))
        bounds.append(t_obs - float(np.quantile(pivot, qq)))
    # and the test of "calibrated" (labels Bernoulli(mean confidence) with these bin counts;
    # conservative, as a Poisson binomial varies less than a binomial): while it does not
    # reject, 0 stays inside, so a calibrated model is covered at every n
    fixed = np.broadcast_to(nb.astype(np.int64), n_star.shape)
    pc = np.clip(c, 0.0, 1.0)
    null = np.sum(w * np.abs(bin_means(rng, fixed, nb, pc) - pc), axis=1)
    if t_obs <= float(np.quantile(null, 1.0 - alpha / 2)):
        bounds[0] = 0.0
    lower = min(max(bounds[0], 0.0), 1.0)
    upper = min(max(bounds[1], lower), 1.0)
    return lower, upper


def bin_means(rng: np.random.Generator, n: np.ndarray, nb: np.ndarray,
              p: np.ndarray) -> np.ndarray:
    """Draws of x / n with x ~ Binomial(n, p) (0 where n is 0): exact for bins with few
    expected successes or failures, the normal approximation (fast, and accurate there)
    for the others."""
    out = np.empty(n.shape)
    exact = nb * np.minimum(p, 1.0 - p) < 20
    if exact.any():
        ne = n[:, exact]
        out[:, exact] = rng.binomial(ne, p[exact]) / np.maximum(ne, 1)
    if not exact.all():
        pa = p[~exact]
        na = np.maximum(n[:, ~exact], 1)
        out[:, ~exact] = pa + np.sqrt(pa * (1.0 - pa) / na) * rng.standard_normal(na.shape)
    return out


_CACHE: dict[bytes, tuple[float, float, float]] = {}
_CACHE_SIZE = 4096
_CACHE_LOCK = threading.Lock()


def _uncertainty(vec: np.ndarray, count: np.ndarray, conf: np.ndarray, correct: np.ndarray,
                 fcount: np.ndarray, fconf: np.ndarray, fcorrect: np.ndarray,
                 level: float) -> tuple[float, float, float]:
    """(smECE, ECE lower, ECE upper), remembered by the window's counts: the views of a
    scrape recompute them only for the windows that changed since the last one."""
    key = hashlib.blake2b(vec.tobytes() + struct.pack("d", level), digest_size=16).digest()
    with _CACHE_LOCK:  # readers of several engines' views may share it
        hit = _CACHE.get(key)
    if hit is None:
        hit = (smece(fcount, fconf, fcorrect), *ece_interval(count, conf, correct, level))
        with _CACHE_LOCK:
            while len(_CACHE) >= _CACHE_SIZE:
                del _CACHE[next(iter(_CACHE))]  # oldest first
            _CACHE[key] = hit
    return hit


def from_vector(vec: np.ndarray, layout: Layout, binary: bool, mce_min_samples: int = 1,
                interval_level: float = 0.9) -> Stats:
    """Stats of one window from its summed bucket vector (see ``windows.Layout``)."""
    st = plugin_stats(vec, layout, binary, mce_min_samples)
    if st.samples == 0:
        return st
    lay = layout
    f = lay.fine_bins
    count, conf, correct = st.bins.count, st.bins.conf, st.bins.correct
    fcount = vec[lay.fcount:lay.fcount + f]
    fconf = vec[lay.fconf:lay.fconf + f] / CONF_SCALE
    fcorrect = vec[lay.fcorrect:lay.fcorrect + f]
    smooth, lower, upper = _uncertainty(vec, count, conf, correct, fcount, fconf, fcorrect,
                                        interval_level)
    return replace(st, ece_l2_debiased=ece_l2_debiased(count, conf, correct), smece=smooth,
                   ece_lower=lower, ece_upper=upper)


def plugin_stats(vec: np.ndarray, layout: Layout, binary: bool,
                 mce_min_samples: int = 1) -> Stats:
    """The cheap exact part of ``from_vector`` (counts and plug-in metrics, the noise
    floor): the uncertainty fields are left None."""
    lay = layout
    b, f = lay.bins, lay.fine_bins
    # copies, not views: a view would keep the whole window vector (24 KB with the
    # fine bins) alive as long as the row
    count = vec[lay.count:lay.count + b].copy()
    conf = vec[lay.conf:lay.conf + b] / CONF_SCALE
    correct = vec[lay.correct:lay.correct + b].copy()
    bins = Bins(count, conf, correct)
    n = round(count.sum())
    if n == 0:
        return Stats(0, None, None, None, None, None, None, None, None, None, None, bins=bins)
    fcount = vec[lay.fcount:lay.fcount + f]
    fconf = vec[lay.fconf:lay.fconf + f] / CONF_SCALE
    fcorrect = vec[lay.fcorrect:lay.fcorrect + f]
    sum_conf = float(conf.sum())
    sum_correct = float(correct.sum())
    return Stats(
        samples=n,
        ece=ece(count, conf, correct),
        mce=mce(count, conf, correct, mce_min_samples),
        ace=ace(fcount, fconf, fcorrect, b),
        brier=float(vec[lay.brier] / CONF_SCALE / n),
        nll=float(vec[lay.nll] / NLL_SCALE / n),
        accuracy=float(vec[lay.acc] / n),
        mean_confidence=sum_conf / n,
        observed_rate=sum_correct / n if binary else None,
        observed_over_expected=(sum_correct / sum_conf if binary and sum_conf > 0 else None),
        noise_floor=noise_floor(count, conf),
        bins=bins,
    )


def confidence_and_correct(probs: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-sample calibration target: binary P(y=1) against y; multiclass top-label
    confidence against correctness (Guo et al. 2017)."""
    if probs.ndim == 1:
        return probs, labels.astype(np.float64)
    return probs.max(axis=1), (probs.argmax(axis=1) == labels).astype(np.float64)


def bins_from_samples(conf: np.ndarray, correct: np.ndarray, bins: int) -> Bins:
    b = bin_index(conf, bins)
    return Bins(np.bincount(b, minlength=bins).astype(np.float64),
                np.bincount(b, conf, minlength=bins), np.bincount(b, correct, minlength=bins))


def nll_from_samples(probs: np.ndarray, labels: np.ndarray) -> float:
    if probs.ndim == 1:
        py = np.where(labels == 1, probs, 1.0 - probs)
    else:
        py = probs[np.arange(len(labels)), labels]
    return float(np.mean(-np.log(np.clip(py, 1e-15, 1.0))))


def classwise_ece_from_samples(probs: np.ndarray, labels: np.ndarray,
                               bins: int) -> tuple[float, np.ndarray]:
    """(mean over classes, per class) of the ECE of p_k against [y = k] (Kull et al. 2019),
    the samples' version of the engine's classwise ECE."""
    k = probs.shape[1]
    per = np.empty(k)
    for c in range(k):
        b = bins_from_samples(probs[:, c], (labels == c).astype(np.float64), bins)
        per[c] = ece(b.count, b.conf, b.correct)
    return float(per.mean()), per
