"""Top-label reduction: a 1-D calibration map applied to a multiclass model.

Binary scores are calibrated on P(y=1) against y. Multiclass scores are calibrated on the
top-label confidence against correctness (argmax == label), as the contract's metrics do
(Guo et al. 2017); the calibrated top probability replaces the old one and the other
classes are rescaled proportionally so each row still sums to 1.
"""

from __future__ import annotations

from abc import abstractmethod
from typing import Any, ClassVar, Self

import numpy as np

from calmon.calibrators.base import Calibrator
from calmon.calibrators.scores import is_binary, logit, to_logits, to_probs


def top_label(probs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(confidence, argmax) per row; ties go to the lowest class index, like np.argmax."""
    idx = probs.argmax(axis=1)
    return probs[np.arange(len(probs)), idx], idx


def replace_top(probs: np.ndarray, idx: np.ndarray, new_top: np.ndarray) -> np.ndarray:
    """Set probs[i, idx[i]] = new_top[i] and rescale the other classes to fill 1 - new_top.

    When the other classes hold no mass at all, the remainder is spread uniformly over them
    (proportional rescaling is undefined there). The argmax may change when new_top falls
    below another class: that is what the calibrated probabilities say.
    """
    n, k = probs.shape
    rows = np.arange(n)
    new_top = np.clip(new_top, 0.0, 1.0)
    others = probs.copy()
    others[rows, idx] = 0.0
    rest = others.sum(axis=1)
    empty = rest < np.finfo(np.float64).tiny  # avoids (1 - new_top) / 0 -> inf
    scale = (1.0 - new_top) / np.where(empty, 1.0, rest)
    out = others * scale[:, None]
    out[empty] = ((1.0 - new_top[empty]) / (k - 1))[:, None]
    out[rows, idx] = new_top
    return out


class TopLabelCalibrator(Calibrator):
    """A calibrator defined by a 1-D map, lifted to multiclass through the top label.

    Subclasses implement ``_fit_xy`` and ``_map`` on x = P(y=1) (binary) or the top-label
    confidence (multiclass); with ``on_logit`` they see the log-odds of that instead (for a
    binary "logit" input the model's own logit, so nothing saturates on the way).
    """

    on_logit: ClassVar[bool] = False

    @classmethod
    def _reduce(
        cls, scores: np.ndarray, input: str
    ) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
        """(x, probs, argmax): probs and argmax are None for binary inputs."""
        if is_binary(input):
            x = to_logits(scores, input) if cls.on_logit else to_probs(scores, input)
            return x, None, None
        probs = to_probs(scores, input)
        conf, idx = top_label(probs)
        return (logit(conf) if cls.on_logit else conf), probs, idx

    @classmethod
    def _fit(cls, scores: np.ndarray, labels: np.ndarray, input: str, **options: Any) -> Self:
        x, _, idx = cls._reduce(scores, input)
        y = labels if idx is None else (idx == labels)
        return cls._fit_xy(x, y.astype(np.float64), input, **options)

    def _apply(self, scores: np.ndarray) -> np.ndarray:
        x, probs, idx = self._reduce(scores, self.input)
        p = np.clip(self._map(x), 0.0, 1.0)
        return p if probs is None or idx is None else replace_top(probs, idx, p)

    @classmethod
    @abstractmethod
    def _fit_xy(cls, x: np.ndarray, y: np.ndarray, input: str, **options: Any) -> Self:
        """Fit on x (see class doc) and y in {0., 1.} (label or correctness)."""

    @abstractmethod
    def _map(self, x: np.ndarray) -> np.ndarray:
        """Calibrated probability of y = 1 (or of the top label being right)."""
