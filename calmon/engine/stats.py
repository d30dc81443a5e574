"""The expensive statistics of many series at once: pure numpy, no state.

``metrics.ece_interval`` and ``metrics.smece`` are the reference, one series at a
time. These compute the same numbers (to 1e-12 relative, same seeds) for a stack of
series, so a refresh of a fleet costs numpy calls per stack, not per series:

- ``ece_interval_batch``: each series still draws from its own generator, seeded
  from its counts, in the reference's order (the draws are what make the numbers
  repeatable); everything computed from the draws (the bootstrap ECEs, pivots,
  quantiles, the calibration test) is one computation over the stack.
- ``smece_batch``: the bandwidth bisection runs in lockstep over the stack; at each
  step the series that try the same bandwidth share one kernel and one batched FFT.
- ``ece_l2_debiased_batch``: the debiased l2 error, one expression over the stack.
"""

from __future__ import annotations

import math
import zlib

import numpy as np

from calmon.engine import metrics
from calmon.engine.metrics import (
    INTERVAL_DRAWS,
    PSEUDO,
    PUSH_SE,
    SHRINK_SE,
    SMECE_EPS,
    SMECE_MESH,
    SMECE_REFINE,
)


def ece_l2_debiased_batch(count: np.ndarray, conf: np.ndarray, correct: np.ndarray) -> np.ndarray:
    """``metrics.ece_l2_debiased`` of each row of (S, B) bin sums."""
    n = count.sum(axis=1, keepdims=True)
    ok = count >= 2
    nb = np.where(ok, count, 2.0)
    acc = correct / nb
    terms = (acc - conf / nb) ** 2 - acc * (1.0 - acc) / (nb - 1.0)
    total = np.sum(np.where(ok, nb / np.maximum(n, 1.0) * terms, 0.0), axis=1)
    out: np.ndarray = np.sqrt(np.maximum(total, 0.0))
    return out


# ------------------------------------------------------------ ECE interval


def _means(n: np.ndarray, p: np.ndarray, exact: np.ndarray, draws: np.ndarray) -> np.ndarray:
    """``metrics.bin_means`` from its draws: binomial counts where ``exact``, standard
    normals elsewhere (all (S, D, B), p and exact (S, 1, B))."""
    nn = np.maximum(n, 1).astype(np.float64)
    out: np.ndarray = np.where(exact, 0.0, p * (1.0 - p)) / nn
    np.sqrt(out, out=out)
    out *= draws
    out += np.where(exact, 0.0, p)
    np.copyto(out, draws / nn, where=np.broadcast_to(exact, out.shape))
    return out


def _draw(rng: np.random.Generator, n: np.ndarray, p: np.ndarray, exact: np.ndarray,
          out: np.ndarray) -> None:
    """The draws of one ``metrics.bin_means`` call, in its order, into ``out`` (D, k)."""
    if exact.any():
        out[:, exact] = rng.binomial(n[:, exact], p[exact])
    if not exact.all():
        out[:, ~exact] = rng.standard_normal((n.shape[0], int((~exact).sum())))


CHUNK = 16  # series per stack: (CHUNK, draws, B) arrays stay in cache


def ece_interval_batch(count: np.ndarray, conf: np.ndarray, correct: np.ndarray, level: float,
                       draws: int = INTERVAL_DRAWS) -> tuple[np.ndarray, np.ndarray]:
    """``metrics.ece_interval`` of each row of (S, B) bin sums (rows with no samples:
    NaN). Returns (lower, upper), each (S,)."""
    parts = [_interval_stack(count[i:i + CHUNK], conf[i:i + CHUNK], correct[i:i + CHUNK],
                             level, draws) for i in range(0, len(count), CHUNK)]
    if not parts:
        return np.zeros(0), np.zeros(0)
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])


def _interval_stack(count: np.ndarray, conf: np.ndarray, correct: np.ndarray, level: float,
                    draws: int) -> tuple[np.ndarray, np.ndarray]:
    s_n, b_n = count.shape
    lower = np.full(s_n, np.nan)
    upper = np.full(s_n, np.nan)
    total = count.sum(axis=1)
    live = np.flatnonzero(total > 0)
    if len(live) == 0:
        return lower, upper
    cnt, cf, co = count[live], conf[live], correct[live]
    tot = total[live][:, None]
    nz = cnt > 0
    nb = np.where(nz, cnt, 1.0)
    w = np.where(nz, cnt / tot, 0.0)
    c = np.where(nz, cf / nb, 0.0)
    a = np.where(nz, co / nb, 0.0)
    gap = a - c
    t_obs = np.sum(w * np.abs(gap), axis=1)
    q = np.where(nz, (co + PSEUDO) / (nb + 2.0 * PSEUDO), 0.0)
    se = np.sqrt(q * (1.0 - q) / nb)
    sign = np.where(gap >= 0, 1.0, -1.0)
    shrunk = sign * np.maximum(np.abs(gap) - SHRINK_SE * se, 0.0)
    reach = np.maximum(np.abs(gap), PUSH_SE * se)
    sign = np.where((c + sign * reach > 1.0) | (c + sign * reach < 0.0), -sign, sign)
    pushed = sign * reach
    pc = np.clip(c, 0.0, 1.0)
    exact_q = nb * np.minimum(q, 1.0 - q) < 20
    exact_c = nb * np.minimum(pc, 1.0 - pc) < 20
    # the draws, series by series, each from its own generator in the reference's order
    n_star = np.zeros((len(live), draws, b_n), np.int64)
    raw = np.zeros((3, len(live), draws, b_n))
    fixed_n = np.broadcast_to(np.where(nz, cnt, 0.0).astype(np.int64)[:, None, :], n_star.shape)
    for i, s in enumerate(live.tolist()):
        m = nz[i]
        seed = zlib.crc32(np.ascontiguousarray(count[s], np.float64).tobytes()
                          + np.ascontiguousarray(correct[s], np.float64).tobytes())
        rng = np.random.default_rng(seed)
        ns = rng.multinomial(round(float(total[s])), w[i, m], size=draws)
        n_star[i][:, m] = ns
        for k in range(3):
            part = np.empty(ns.shape)
            if k < 2:
                _draw(rng, ns, q[i, m], exact_q[i, m], part)
            else:
                _draw(rng, fixed_n[i][:, m], pc[i, m], exact_c[i, m], part)
            raw[k, i][:, m] = part
    alpha = 1.0 - level
    bounds = []
    share = n_star / tot[:, :, None]
    q3, c3 = q[:, None, :], c[:, None, :]
    for k, (centre, qq) in enumerate(((shrunk, 1.0 - alpha / 2), (pushed, alpha / 2))):
        p = np.clip(c + centre, 0.0, 1.0)
        noise = _means(n_star, q3, exact_q[:, None, :], raw[k]) - q3
        t_star = np.sum(share * np.abs(p[:, None, :] + noise - c3), axis=2)
        pivot = t_star - np.sum(w * np.abs(p - c), axis=1)[:, None]
        bounds.append(t_obs - np.quantile(pivot, qq, axis=1))
    pc3 = pc[:, None, :]
    null = np.sum(w[:, None, :] * np.abs(_means(fixed_n, pc3, exact_c[:, None, :], raw[2]) - pc3),
                  axis=2)
    lo = np.where(t_obs <= np.quantile(null, 1.0 - alpha / 2, axis=1), 0.0, bounds[0])
    lo = np.minimum(np.maximum(lo, 0.0), 1.0)
    lower[live] = lo
    upper[live] = np.minimum(np.maximum(bounds[1], lo), 1.0)
    return lower, upper


# ------------------------------------------------------------ smooth ECE


def _smooth_batch(f: list[np.ndarray], weights: list[np.ndarray], t: np.ndarray, sigma: float,
                  grid: int) -> np.ndarray:
    """``metrics.smooth`` of several (f, w) pairs with the same bandwidth: one kernel,
    one batched FFT. Returns (len(f), len(t))."""
    rows = len(f)
    keys, vals = [], []
    for r, (fr, wr) in enumerate(zip(f, weights)):
        idx = (fr * (grid - 1)).astype(int).clip(0, grid - 2)
        frac = fr * (grid - 1) - idx
        # the reference's two np.add.at passes, in the same order per grid point
        keys += [idx + r * grid, idx + 1 + r * grid]
        vals += [(1 - frac) * wr, frac * wr]
    values = np.bincount(np.concatenate(keys), np.concatenate(vals),
                         minlength=rows * grid).reshape(rows, grid)
    u = np.linspace(0.0, 1.0, grid)
    ker = np.exp(-(u - 0.5) * (u - 0.5) / (2 * sigma**2)) / (math.sqrt(2 * math.pi) * sigma)
    rev = values[:, ::-1]
    ext = np.concatenate([rev[:, :-1], values, rev[:, 1:]], axis=1)
    full_len = ext.shape[1] + grid - 1
    nfft = 1 << (full_len - 1).bit_length()
    full = np.fft.irfft(np.fft.rfft(ext, nfft, axis=1) * np.fft.rfft(ker, nfft), nfft,
                        axis=1)[:, :full_len]
    start = grid - 1 + grid // 2
    smoothed = full[:, start:start + grid]
    inds = (t * (grid - 1)).astype(int).clip(0, grid - 2)
    resid = (t - inds / (grid - 1)) * (grid - 1)
    out: np.ndarray = smoothed[:, inds] * (1 - resid) + smoothed[:, inds + 1] * resid
    return out


def _at_batch(f: list[np.ndarray], n: list[np.ndarray], resid: list[np.ndarray],
              sigma: float) -> np.ndarray:
    """The reference's ``at(sigma)`` for several series at one bandwidth."""
    t = np.linspace(0.0, 1.0, max(round(10 / sigma), SMECE_MESH))
    grid = max(2000, round(20 / sigma)) // 2 + 1
    both = _smooth_batch(f + f, resid + n, t, sigma, grid)
    k = len(f)
    ys, dens = both[:k], both[k:] + 1e-4
    rs = ys / dens
    out: np.ndarray = np.sum(np.abs(rs) * dens, axis=1) / np.sum(dens, axis=1)
    return out


def smece_batch(fcount: np.ndarray, fconf: np.ndarray, fcorrect: np.ndarray) -> np.ndarray:
    """``metrics.smece`` of each row of (S, F) fine-bin sums (rows with no samples: NaN)."""
    s_n = fcount.shape[0]
    out = np.full(s_n, np.nan)
    live = [s for s in range(s_n) if fcount[s].sum() > 0]
    f, n, resid = {}, {}, {}
    for s in live:
        nz = fcount[s] > 0
        n[s] = fcount[s][nz].astype(np.float64)
        f[s] = fconf[s][nz] / n[s]
        resid[s] = fconf[s][nz] - fcorrect[s][nz]

    def at(sigmas: dict[int, float]) -> dict[int, float]:
        """at(sigma) per series, the series sharing a bandwidth computed together."""
        groups: dict[float, list[int]] = {}
        for s, sg in sigmas.items():
            groups.setdefault(sg, []).append(s)
        got: dict[int, float] = {}
        for sg, members in groups.items():
            vals = _at_batch([f[s] for s in members], [n[s] for s in members],
                             [resid[s] for s in members], sg)
            got.update(zip(members, vals.tolist()))
        return got

    first = at(dict.fromkeys(live, 1.0))
    todo = []
    for s in live:
        if first[s] > 1.0:  # the reference: 1.0 < SMECE_EPS (never) or 1.0 < at(1.0)
            out[s] = first[s]
        else:
            todo.append(s)
    start = dict.fromkeys(todo, 1.0)
    end = dict.fromkeys(todo, 0.0)
    for _ in range(SMECE_REFINE):
        mids = {s: (start[s] + end[s]) / 2 for s in todo}
        need = {s: m for s, m in mids.items() if not m < SMECE_EPS}
        vals = at(need)
        for s, m in mids.items():
            if m < SMECE_EPS or m < vals[s]:
                end[s] = m
            else:
                start[s] = m
    final = at({s: start[s] for s in todo})
    for s in todo:
        out[s] = final[s]
    return out


__all__ = ["ece_interval_batch", "ece_l2_debiased_batch", "metrics", "smece_batch"]
