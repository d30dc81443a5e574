"""Isotonic regression: the increasing step map of least squared error (pool adjacent
violators), interpolated linearly between its thresholds, as scikit-learn's
IsotonicRegression(out_of_bounds="clip") predicts, then Laplace-smoothed.

Smoothing: each level set of the fit (a block of w samples with mean m) becomes
(m w + 1) / (w + 2), and a weighted PAVA (weights w + 2) restores monotonicity. So no
output is ever exactly 0 or 1: a block of 5 negatives says 1/7, not "impossible", and
the NLL of a later positive there stays finite."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, Self

import numpy as np

from calmon.calibrators.base import check_params, floats, increasing, probabilities
from calmon.calibrators.toplabel import TopLabelCalibrator
from calmon.calibrators.validate import MAX_KNOTS
from calmon.errors import CalibratorError

TIE: Final = float(np.finfo(np.float64).resolution)
"""x values closer than this (1e-15) to the first x of a group are pooled as ties, as
scikit-learn's _make_unique does; the group keeps that first x."""


class IsotonicCalibrator(TopLabelCalibrator):
    method = "isotonic"
    param_names = ("x", "y")

    def __init__(self, x: np.ndarray, y: np.ndarray, input: str) -> None:
        super().__init__(input)
        if len(x) != len(y) or len(x) < 1:
            raise CalibratorError("isotonic x and y must be non-empty and of equal length")
        self.x, self.y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)

    def _map(self, x: np.ndarray) -> np.ndarray:
        # np.interp holds the end values outside [x[0], x[-1]]: sklearn's "clip".
        return np.asarray(np.interp(x, self.x, self.y))

    @classmethod
    def _fit_xy(cls, x: np.ndarray, y: np.ndarray, input: str, **options: Any) -> Self:
        if options:
            raise CalibratorError(f"isotonic takes no options, got {sorted(options)}")
        ux, uy, uw = _pool_ties(x, y)
        fitted = _laplace(_pava(uy, uw), uw)
        # Keep the ends and every point whose y differs from a neighbour's: the others lie
        # on a flat segment and interpolation does not need them (sklearn's trimming).
        keep = np.ones(len(fitted), dtype=bool)
        keep[1:-1] = (fitted[1:-1] != fitted[:-2]) | (fitted[1:-1] != fitted[2:])
        kx, ky = ux[keep], fitted[keep]
        if len(kx) > MAX_KNOTS:
            # documents hold at most MAX_KNOTS knots: keep the ends and evenly spaced ones
            # between (interpolating a monotone sequence's subsequence stays monotone)
            pick = np.unique(np.linspace(0, len(kx) - 1, MAX_KNOTS).round().astype(np.intp))
            kx, ky = kx[pick], ky[pick]
        return cls(kx, ky, input)

    def params(self) -> dict[str, Any]:
        return {"x": floats(self.x), "y": floats(self.y)}

    @classmethod
    def from_params(cls, params: Mapping[str, Any], input: str) -> Self:
        params = check_params(params, cls)
        x = increasing(params["x"], "x")
        y = probabilities(params["y"], "y")
        if len(x) != len(y):
            raise CalibratorError("isotonic x and y must have the same length")
        if (np.diff(y) < 0).any():
            raise CalibratorError("isotonic y must be non-decreasing")
        return cls(x, y, input)


def _pool_ties(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Sort by x and merge tied x into one point: (x, mean y, count)."""
    order = np.lexsort((y, x))
    xs, ys = x[order], y[order]
    # A new group starts where x moves at least TIE past the group's first x. Almost
    # always that is simply where x changes, so only near-ties need the sequential scan.
    starts = np.flatnonzero(np.diff(xs) >= TIE) + 1
    if np.any((np.diff(xs) > 0) & (np.diff(xs) < TIE)):
        starts_list, first = [], xs[0]
        for i in range(1, len(xs)):
            if xs[i] - first >= TIE:
                starts_list.append(i)
                first = xs[i]
        starts = np.array(starts_list, dtype=np.intp)
    bounds = np.concatenate(([0], starts))
    counts = np.diff(np.concatenate((bounds, [len(xs)]))).astype(np.float64)
    return xs[bounds], np.add.reduceat(ys, bounds) / counts, counts


def _laplace(fitted: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Laplace-smooth each level set of a PAVA fit, then make it monotone again."""
    starts = np.flatnonzero(np.concatenate(([True], fitted[1:] != fitted[:-1])))
    bw = np.add.reduceat(w, starts)
    smoothed = (fitted[starts] * bw + 1.0) / (bw + 2.0)
    sizes = np.diff(np.concatenate((starts, [len(fitted)])))
    return np.repeat(_pava(smoothed, bw + 2.0), sizes)


def _pava(y: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Weighted pool-adjacent-violators: the increasing fit minimising sum w (fit - y)^2."""
    means: list[float] = []
    weights: list[float] = []
    sizes: list[int] = []
    for yi, wi in zip(y.tolist(), w.tolist(), strict=True):
        m, ww, size = yi, wi, 1
        # Merge back while the previous block is above this one (a violation).
        while means and means[-1] > m:
            pm, pw, ps = means.pop(), weights.pop(), sizes.pop()
            m = (pm * pw + m * ww) / (pw + ww)
            ww += pw
            size += ps
        means.append(m)
        weights.append(ww)
        sizes.append(size)
    return np.repeat(np.array(means, dtype=np.float64), sizes)
