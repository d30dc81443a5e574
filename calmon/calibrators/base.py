"""The Calibrator interface and its JSON document (contract section 6)."""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any, ClassVar, Self

import numpy as np
from numpy.typing import ArrayLike

from calmon.calibrators.scores import as_kind, check_input, finalize
from calmon.errors import CalibratorError

RESERVED: tuple[str, ...] = ("method", "params", "input")


class Calibrator(ABC):
    """A fitted map from raw scores of kind ``input`` to calibrated probabilities."""

    method: ClassVar[str]
    param_names: ClassVar[tuple[str, ...]]

    def __init__(self, input: str) -> None:
        self.input = check_input(input)
        # Keys of a loaded document besides method/params/input (model, version, ...).
        self.meta: dict[str, Any] = {}

    def apply(self, scores: ArrayLike, input: str | None = None) -> np.ndarray:
        """Calibrated probabilities, shaped like ``to_probs(scores, self.input)``.

        CalibratorError for scores of another kind than the calibrator was fitted on:
        ``input`` (the caller's kind) other than ``self.input``, or, for a probability
        calibrator, scores that cannot be probabilities (as ``CalibratorWatcher``)."""
        return finalize(self._apply(as_kind(scores, self.input, input)))

    @abstractmethod
    def _apply(self, scores: np.ndarray) -> np.ndarray:
        """Map validated scores to probabilities (finalize clips and renormalises)."""

    @classmethod
    @abstractmethod
    def _fit(cls, scores: np.ndarray, labels: np.ndarray, input: str, **options: Any) -> Self:
        """Fit on validated scores and labels (see scores.as_scores / as_labels)."""

    @abstractmethod
    def params(self) -> dict[str, Any]:
        """JSON-able parameters: plain floats and lists of floats."""

    @classmethod
    @abstractmethod
    def from_params(cls, params: Mapping[str, Any], input: str) -> Self:
        """Rebuild from ``params()`` output; CalibratorError when they are not valid."""

    def to_json(self, **meta: Any) -> dict[str, Any]:
        """``{"method", "params", "input", **meta}``; numpy values in meta become plain."""
        clash = sorted(set(meta) & set(RESERVED))
        if clash:
            raise CalibratorError(f"meta may not override {', '.join(clash)}")
        doc: dict[str, Any] = {"method": self.method, "params": self.params(), "input": self.input}
        doc.update({key: plain(value) for key, value in meta.items()})
        return doc

    def __repr__(self) -> str:
        return f"{type(self).__name__}(input={self.input!r}, params={self.params()!r})"


def plain(value: Any) -> Any:
    """Recursively turn numpy scalars/arrays into JSON-able Python values.

    Non-finite floats become None, so json.dumps never writes NaN/Infinity (not JSON).
    """
    if isinstance(value, np.ndarray):
        value = value.tolist()
    elif isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


# --- validation of loaded params -------------------------------------------------------


def check_params(params: Any, cls: type[Calibrator]) -> Mapping[str, Any]:
    """params must be an object with exactly the method's keys.

    Unknown keys are refused rather than ignored: they would mean a document written for a
    calibrator whose semantics this code does not implement.
    """
    if not isinstance(params, Mapping):
        raise CalibratorError(f"{cls.method}: params must be an object")
    missing = [name for name in cls.param_names if name not in params]
    extra = sorted(set(params) - set(cls.param_names))
    if missing:
        raise CalibratorError(f"{cls.method}: missing params {', '.join(missing)}")
    if extra:
        raise CalibratorError(f"{cls.method}: unknown params {', '.join(map(str, extra))}")
    return params


def number(value: Any, name: str) -> float:
    """A finite JSON number (bools refused, though Python treats them as ints)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise CalibratorError(f"{name} must be a number, got {value!r}")
    try:
        out = float(value)
    except OverflowError:  # an integer of hundreds of digits
        raise CalibratorError(f"{name} is out of range") from None
    if not math.isfinite(out):
        raise CalibratorError(f"{name} must be finite, got {value!r}")
    return out


def numbers(value: Any, name: str, *, min_len: int = 1) -> np.ndarray:
    """A list of at least ``min_len`` finite numbers, as float64."""
    if not isinstance(value, list | tuple) or len(value) < min_len:
        raise CalibratorError(f"{name} must be a list of at least {min_len} numbers")
    return np.array([number(v, f"{name}[{i}]") for i, v in enumerate(value)], dtype=np.float64)


def probabilities(value: Any, name: str, *, min_len: int = 1) -> np.ndarray:
    out = numbers(value, name, min_len=min_len)
    if ((out < 0) | (out > 1)).any():
        raise CalibratorError(f"{name} must lie in [0, 1]")
    return out


def increasing(value: Any, name: str, *, min_len: int = 1) -> np.ndarray:
    out = numbers(value, name, min_len=min_len)
    if (np.diff(out) <= 0).any():
        raise CalibratorError(f"{name} must be strictly increasing")
    return out


def floats(arr: np.ndarray) -> list[float]:
    """float64 array -> list of plain floats (exact: json writes the shortest repr)."""
    return [float(v) for v in arr]
