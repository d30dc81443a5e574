"""Histogram binning (Zadrozny & Elkan 2001): each confidence bin maps to the
Laplace-smoothed frequency of its fit samples, (positives + 1) / (samples + 2), so no
output is ever exactly 0 or 1."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, Self

import numpy as np

from calmon.calibrators.base import check_params, floats, increasing, probabilities
from calmon.calibrators.toplabel import TopLabelCalibrator
from calmon.calibrators.validate import MAX_KNOTS
from calmon.errors import CalibratorError

DEFAULT_BINS: Final = 15


def bin_edges(bins: int) -> np.ndarray:
    # i / B (one correctly rounded division each), not linspace, so edges are exactly the
    # contract's i/B and the bins agree with the metrics' bins.
    return np.arange(bins + 1, dtype=np.float64) / bins


def bin_index(x: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Right-closed bins: bin i holds (edges[i], edges[i+1]]; bin 0 also holds edges[0] and
    anything below, the last bin anything above."""
    return np.clip(np.searchsorted(edges, x, side="left") - 1, 0, len(edges) - 2)


class HistogramCalibrator(TopLabelCalibrator):
    """An empty bin (no fit samples) maps to its own centre: with no evidence there, the
    map stays close to the identity rather than borrowing a neighbour's frequency."""

    method = "histogram"
    param_names = ("edges", "values")

    def __init__(self, edges: np.ndarray, values: np.ndarray, input: str) -> None:
        super().__init__(input)
        if len(edges) != len(values) + 1 or len(values) < 1:
            raise CalibratorError("histogram needs len(edges) == len(values) + 1 >= 2")
        self.edges = np.asarray(edges, dtype=np.float64)
        self.values = np.asarray(values, dtype=np.float64)

    def _map(self, x: np.ndarray) -> np.ndarray:
        return np.asarray(self.values[bin_index(x, self.edges)])

    @classmethod
    def _fit_xy(cls, x: np.ndarray, y: np.ndarray, input: str, **options: Any) -> Self:
        unknown = set(options) - {"bins"}
        if unknown:
            raise CalibratorError(f"histogram takes only bins, got {sorted(unknown)}")
        bins = options.get("bins", DEFAULT_BINS)
        if (isinstance(bins, bool) or not isinstance(bins, int | np.integer)
                or not 1 <= bins <= MAX_KNOTS):
            raise CalibratorError(f"histogram bins must be an integer in [1, {MAX_KNOTS}], "
                                  f"got {bins!r}")
        edges = bin_edges(int(bins))
        idx = bin_index(x, edges)
        counts = np.bincount(idx, minlength=len(edges) - 1)
        sums = np.bincount(idx, weights=y, minlength=len(edges) - 1)
        centres = (edges[:-1] + edges[1:]) / 2
        values = np.where(counts > 0, (sums + 1.0) / (counts + 2.0), centres)
        return cls(edges, values, input)

    def params(self) -> dict[str, Any]:
        return {"edges": floats(self.edges), "values": floats(self.values)}

    @classmethod
    def from_params(cls, params: Mapping[str, Any], input: str) -> Self:
        params = check_params(params, cls)
        edges = increasing(params["edges"], "edges", min_len=2)
        values = probabilities(params["values"], "values")
        if len(edges) != len(values) + 1:
            raise CalibratorError("histogram needs len(edges) == len(values) + 1")
        return cls(edges, values, input)
