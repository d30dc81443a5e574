"""Method names -> calibrator classes, and the two entry points fit() and load()."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from typing import Any, Final

from numpy.typing import ArrayLike

from calmon.calibrators.base import RESERVED, Calibrator
from calmon.calibrators.histogram import HistogramCalibrator
from calmon.calibrators.identity import IdentityCalibrator
from calmon.calibrators.isotonic import IsotonicCalibrator
from calmon.calibrators.platt import PlattCalibrator
from calmon.calibrators.scores import as_labels, as_scores, check_input
from calmon.calibrators.signing import KeyRing, canonical, keyring
from calmon.calibrators.temperature import TemperatureCalibrator
from calmon.calibrators.validate import MAX_BYTES, check_document
from calmon.errors import CalibratorError
from calmon.names import FIT_METHODS

METHODS: Final = FIT_METHODS  # what fits and auto tries
CLASSES: Final[dict[str, type[Calibrator]]] = {
    cls.method: cls
    for cls in (TemperatureCalibrator, PlattCalibrator, IsotonicCalibrator, HistogramCalibrator,
                IdentityCalibrator)  # identity: only what a rollback publishes
}
MAX_DEPTH: Final = 8  # documents nest 3 deep; anything deeper is not ours
VerifyKeys = KeyRing | Iterable[Any] | None  # None or []: no signature needed


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


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """Refuse duplicate keys: readers that keep the first and readers that keep the last
    would otherwise apply different documents under one signature."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key[:100]!r}")
        out[key] = value
    return out


def parse_document(data: bytes | str) -> Any:
    """JSON bytes of a calibrator document, bounded in size and nesting, without NaN,
    Infinity or duplicate keys. CalibratorError for anything else (never RecursionError,
    MemoryError or OverflowError)."""
    if len(data) > MAX_BYTES:
        raise CalibratorError(f"calibrator document over {MAX_BYTES} bytes")
    try:
        doc = json.loads(data, parse_constant=_refuse_constant, object_pairs_hook=_unique_keys)
    except (ValueError, RecursionError, TypeError) as exc:  # JSONDecodeError, Unicode, ints
        raise CalibratorError(f"not valid JSON: {str(exc)[:200]}") from None
    if _depth(doc, MAX_DEPTH) > MAX_DEPTH:
        raise CalibratorError(f"calibrator document nested deeper than {MAX_DEPTH}")
    return doc


def read_document(path: str | os.PathLike[str]) -> Any:
    """Read and parse a calibrator file without reading more than MAX_BYTES + 1."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_BYTES + 1)
    except (OSError, ValueError) as exc:  # ValueError: a NUL in the path
        raise CalibratorError(f"cannot read calibrator {path}: {exc}") from None
    try:
        return parse_document(data)
    except CalibratorError as exc:
        raise CalibratorError(f"{path}: {exc}") from None


def _class(method: Any) -> type[Calibrator]:
    if not isinstance(method, str) or method not in CLASSES:
        raise CalibratorError(f"method must be one of {', '.join(CLASSES)}, got {method!r}")
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


def load(source: str | os.PathLike[str] | Mapping[str, Any], verify_keys: VerifyKeys = None,
         *, input: str | None = None) -> Calibrator:
    """A calibrator from a JSON document (contract §6): a path to the file, or the
    already-parsed object. Keys other than method/params/input are kept in ``.meta``.

    With ``verify_keys`` (``[{"id", "public_key"}]`` as in the config, or a KeyRing), the
    document must carry a signature by one of them. With ``input`` (the model's score
    kind), a document for another kind is refused. Every refusal is a CalibratorError:
    see calibrators.validate for the ranges and limits.
    """
    ring = keyring(verify_keys)
    if isinstance(source, Mapping):
        doc: Any = source
        if _depth(doc, MAX_DEPTH) > MAX_DEPTH:
            raise CalibratorError(f"calibrator document nested deeper than {MAX_DEPTH}")
        if len(canonical(doc)) > MAX_BYTES:
            raise CalibratorError(f"calibrator document over {MAX_BYTES} bytes")
    elif isinstance(source, str | os.PathLike):
        doc = read_document(source)
    else:
        raise CalibratorError(f"load() takes a path or a dict, got {type(source).__name__}")
    if not isinstance(doc, Mapping):
        raise CalibratorError("a calibrator document must be a JSON object")
    if ring is not None:
        ring.verify(doc)
    check_document(doc, input=input)
    cls = _class(doc["method"])
    try:
        cal = cls.from_params(doc["params"], doc["input"])
    except (ValueError, TypeError, OverflowError) as exc:  # a method's own checks missed it
        raise CalibratorError(f"{doc['method']}: invalid params: {str(exc)[:200]}") from None
    cal.meta = {key: value for key, value in doc.items() if key not in RESERVED}
    return cal
