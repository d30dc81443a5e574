"""Histogram binning against per-bin label means computed by a plain loop."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.special import expit, softmax

from calmon.calibrators import HistogramCalibrator, fit
from calmon.errors import CalibratorError
from tests.unit.calibrators.conftest import (
    binary_data,
    multiclass_data,
    no_certainties,
    replace_top,
)


def loop_bin(x: float, bins: int) -> int:
    """The contract's bins: i holds (i/B, (i+1)/B], bin 0 also holds 0."""
    for i in range(bins):
        if i / bins < x <= (i + 1) / bins:
            return i
    assert x == 0.0
    return 0


def loop_values(x: np.ndarray, y: np.ndarray, bins: int) -> list[float]:
    total = [0.0] * bins
    count = [0] * bins
    for xi, yi in zip(x.tolist(), y.tolist(), strict=True):
        b = loop_bin(xi, bins)
        total[b] += yi
        count[b] += 1
    return [(total[i] + 1) / (count[i] + 2) if count[i] else (i + 0.5) / bins
            for i in range(bins)]


@pytest.mark.parametrize("bins", [15, 10, 7, 1])
def test_binary_values_are_laplace_smoothed_bin_label_means(rng: np.random.Generator,
                                                            bins: int) -> None:
    z, y = binary_data(rng, 3000)
    p = expit(2 * z)
    p[:40] = np.arange(40) % (bins + 1) / bins  # exactly on the edges, including 0 and 1
    cal = fit("histogram", p, y, "prob", bins=bins)
    assert isinstance(cal, HistogramCalibrator)
    np.testing.assert_array_equal(cal.edges, [i / bins for i in range(bins + 1)])
    values = loop_values(p, y, bins)
    np.testing.assert_allclose(cal.values, values, rtol=1e-12, atol=0)
    expected = [values[loop_bin(v, bins)] for v in p.tolist()]
    np.testing.assert_allclose(cal.apply(p), expected, rtol=1e-12, atol=0)


def test_default_is_15_bins_and_empty_bins_map_to_centres() -> None:
    p = np.array([0.0, 0.01, 0.02, 0.99, 1.0])
    cal = fit("histogram", p, [0, 1, 0, 1, 1], "prob")
    assert len(cal.values) == 15
    assert cal.values[0] == pytest.approx((1 + 1) / (3 + 2))  # Laplace: never 0 or 1
    assert cal.values[14] == pytest.approx((2 + 1) / (2 + 2))
    np.testing.assert_allclose(cal.values[1:14], [(i + 0.5) / 15 for i in range(1, 14)])


def test_logit_input_bins_the_probability(rng: np.random.Generator) -> None:
    z, y = binary_data(rng, 2000)
    cal = fit("histogram", 3 * z, y, "logit", bins=10)
    np.testing.assert_allclose(cal.values, loop_values(expit(3 * z), y, 10), rtol=1e-12)


@pytest.mark.parametrize("kind", ["logits", "probs"])
def test_multiclass_top_label(rng: np.random.Generator, kind: str) -> None:
    z, y = multiclass_data(rng, 3000, 3)
    probs = softmax(2 * z, axis=1)
    scores = 2 * z if kind == "logits" else probs
    cal = fit("histogram", scores, y, kind)
    conf, top = probs.max(axis=1), probs.argmax(axis=1)
    values = loop_values(conf, (top == y).astype(float), 15)
    np.testing.assert_allclose(cal.values, values, rtol=1e-12)
    new_top = np.array([values[loop_bin(c, 15)] for c in conf.tolist()])
    expected = no_certainties(replace_top(probs, new_top))
    np.testing.assert_allclose(cal.apply(scores), expected, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("bins", [0, -1, 2.5, True, "15"])
def test_bad_bins(bins: object) -> None:
    with pytest.raises(CalibratorError):
        fit("histogram", [0.1, 0.9], [0, 1], "prob", bins=bins)
