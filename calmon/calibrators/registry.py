"""Method names -> calibrator classes, and the two entry points fit() and load()."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
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
    elif isinstance(source, str | os.PathLike):
        try:
            doc = json.loads(Path(source).read_text(encoding="utf-8"))
        except OSError as exc:
            raise CalibratorError(f"cannot read calibrator {source}: {exc}") from exc
        except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError
            raise CalibratorError(f"{source} is not valid JSON: {exc}") from exc
    else:
        raise CalibratorError(f"load() takes a path or a dict, got {type(source).__name__}")
    if not isinstance(doc, Mapping):
        raise CalibratorError("a calibrator document must be a JSON object")
    for key in RESERVED:
        if key not in doc:
            raise CalibratorError(f"calibrator document has no {key!r}")
    cls = _class(doc["method"])
    if doc["input"] not in INPUTS:
        raise CalibratorError(f"input must be one of {', '.join(INPUTS)}, got {doc['input']!r}")
    cal = cls.from_params(doc["params"], doc["input"])
    cal.meta = {key: value for key, value in doc.items() if key not in RESERVED}
    return cal
