"""Synthetic data for the calibrator tests, generated independently of calmon."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.special import expit, softmax


def binary_data(rng: np.random.Generator, n: int, scale: float = 2.0):
    """True logits z and labels drawn from sigmoid(z)."""
    z = rng.normal(0.0, scale, n)
    y = (rng.random(n) < expit(z)).astype(np.int64)
    return z, y


def multiclass_data(rng: np.random.Generator, n: int, k: int, scale: float = 2.0):
    """True logits z (n, k) and labels drawn from softmax(z)."""
    z = rng.normal(0.0, scale, (n, k))
    p = softmax(z, axis=1)
    u = rng.random(n)
    y = np.minimum((np.cumsum(p, axis=1) < u[:, None]).sum(axis=1), k - 1)
    return z, y


def replace_top(probs: np.ndarray, new_top: np.ndarray) -> np.ndarray:
    """Expected multiclass output: the argmax entry set to new_top, the other entries scaled
    by (1 - new_top) / (their sum), summed directly (1 - conf cancels near conf = 1)."""
    top = probs.argmax(axis=1)
    rows = np.arange(len(probs))
    others = probs.copy()
    others[rows, top] = 0.0
    out = others * ((1 - new_top) / others.sum(axis=1))[:, None]
    out[rows, top] = new_top
    return out


def no_certainties(p: np.ndarray, floor: float = 1e-7) -> np.ndarray:
    """The contract's output bound, row by row: binary clipped into [floor, 1 - floor]; a
    multiclass row with a class below floor mixed with the uniform distribution by the
    least weight that lifts its smallest class to floor."""
    p = np.asarray(p, dtype=np.float64)
    if p.ndim == 1:
        return np.minimum(np.maximum(p, floor), 1 - floor)
    out = p.copy()
    for i, row in enumerate(p):
        k, low = len(row), row.min()
        if low < floor:
            w = (floor - low) / (1.0 / k - low)
            out[i] = (1 - w) * row + w / k
    return out


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(20261130)
