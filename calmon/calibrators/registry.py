"""Method names -> calibrator classes, and the two entry points fit() and load()."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any, Final

from numpy.typing import ArrayLike

from calmon.calibrators.base import RESERVED, Calibrator
from calmon.calibrators.histogram import HistogramCalibrator
from calmon.calibrators.isotonic import IsotonicCalibrator
from calmon.calibrators.platt import PlattCalibrator
from calmon.calibrators.scores import INPUTS, as_labels, as_scores, check_input
from calmon.calibrators.temperature import TemperatureCalibrator
from calmon.errors import CalibratorError

CLASSES: Final[dict[str, type[Calibrator]]] = {
    cls.method: cls
    for cls in (TemperatureCalibrator, PlattCalibrator, IsotonicCalibrator, HistogramCalibrator)
}
METHODS: Final = tuple(CLASSES)  # ("temperature", "platt", "isotonic", "histogram")
MAX_BYTES: Final = 16 * 1024 * 1024  # an isotonic map of a full buffer is ~2 MB
MAX_DEPTH: Final = 8  # documents nest 3 deep; anything deeper is not ours


def _depth(value: Any, limit: int) -> int:
    """Nesting depth of a parsed JSON value, giving up past ``limit`` (iterative)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, Mapping | list):
            deepest = max(deepest, d)
            if d > limit:
                return d
            stack.extend((c, d + 1) for c in (v.values() if isinstance(v, Mapping) else v))
    return deepest


def parse_document(data: bytes | str) -> Any:
    """JSON bytes of a calibrator document, bounded in size and nesting.
    CalibratorError for anything else (never RecursionError or MemoryError)."""
    if len(data) > MAX_BYTES:
        raise CalibratorError(f"calibrator document over {MAX_BYTES} bytes")
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError
        raise CalibratorError(f"not valid JSON: {str(exc)[:200]}") from None
    if _depth(doc, MAX_DEPTH) > MAX_DEPTH:
        raise CalibratorError(f"calibrator document nested deeper than {MAX_DEPTH}")
    return doc


def read_document(path: str | os.PathLike[str]) -> Any:
    """Read and parse a calibrator file without reading more than MAX_BYTES + 1."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_BYTES + 1)
    except OSError as exc:
        raise CalibratorError(f"cannot read calibrator {path}: {exc}") from exc
    try:
        return parse_document(data)
    except CalibratorError as exc:
        raise CalibratorError(f"{path}: {exc}") from None


def _class(method: Any) -> type[Calibrator]:
    if not isinstance(method, str) or method not in CLASSES:
        raise CalibratorError(f"method must be one of {', '.join(METHODS)}, got {method!r}")
    return CLASSES[method]


def fit(
    method: str, scores: ArrayLike, labels: ArrayLike, input: str, **options: Any
) -> Calibrator:
    """Fit ``method`` on raw scores of kind ``input`` and integer labels.

    Options are method specific (histogram: ``bins``). CalibratorError for an unknown
    method or input kind, malformed arrays, fewer than 2 samples, one class only (binary).
    """
    cls = _class(method)
    check_input(input)
    arr = as_scores(scores, input)
    return cls._fit(arr, as_labels(labels, arr, input), input, **options)


def load(source: str | os.PathLike[str] | Mapping[str, Any]) -> Calibrator:
    """A calibrator from a JSON document (contract section 6): a path to the file, or the
    already-parsed object. Keys other than method/params/input are kept in ``.meta``."""
    if isinstance(source, Mapping):
        doc: Any = source
        if _depth(doc, MAX_DEPTH) > MAX_DEPTH:
            raise CalibratorError(f"calibrator document nested deeper than {MAX_DEPTH}")
    elif isinstance(source, str | os.PathLike):
        doc = read_document(source)
    else:
        raise CalibratorError(f"load() takes a path or a dict, got {type(source).__name__}")
    if not isinstance(doc, Mapping):
        raise CalibratorError("a calibrator document must be a JSON object")
    for key in RESERVED:
        if key not in doc:
            raise CalibratorError(f"calibrator document has no {key!r}")
    version = doc.get("version")
    if version is not None and (isinstance(version, bool) or not isinstance(version, int)
                                or version < 0):
        raise CalibratorError(f"version must be a non-negative integer, got {version!r}")
    cls = _class(doc["method"])
    if doc["input"] not in INPUTS:
        raise CalibratorError(f"input must be one of {', '.join(INPUTS)}, got {doc['input']!r}")
    cal = cls.from_params(doc["params"], doc["input"])
    cal.meta = {key: value for key, value in doc.items() if key not in RESERVED}
    return cal
