"""What a calibrator document must satisfy before serving code applies it (contract v3 §6).

Anyone who can write to ``output_dir`` or ``calibrators_topic`` writes what serving code
applies, and some documents break it without any intent. So ``load()`` checks, before
building anything: the required fields, every number in the document (finite, integers
within 64 bits: a 401-digit integer is refused here instead of overflowing later), and
per method the ranges below. Every refusal is a CalibratorError.

The ranges are wide enough for any fit calmon makes and narrow enough that nothing
applied can overflow, saturate to a certainty or turn the ranking of scores around.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from itertools import pairwise
from typing import Any, Final

from calmon.calibrators.scores import BINARY_INPUTS, INPUTS
from calmon.errors import CalibratorError

REQUIRED: Final = ("model", "segment", "version", "method", "input", "params")
MAX_BYTES: Final = 1 << 20
"""A document (as read, or as canonical JSON when given as an object) is at most 1 MiB."""
MAX_KNOTS: Final = 10_000
"""Isotonic knots and histogram bins; calmon's fits stay below (isotonic thins its map)."""
MAX_CLASSES: Final = (1 << 20) - 1  # the largest limits.max_classes
MAX_VERSION: Final = (1 << 31) - 1
"""A version is an integer in [0, 2^31 - 1]: one publish a second for 68 years. Larger
ones (10^30) would pin a series forever, since a watcher only moves to higher versions."""
MAX_VERSION_STEP: Final = 1000
"""A watcher refuses a version more than this above the one it serves for the series:
calmon counts up by one per publish, and a watcher sees every one of them (the topic
keeps them; the directory watcher looks every ``min_interval``)."""
MAX_INT: Final = 1 << 63
T_MIN: Final = 0.01
T_MAX: Final = 100.0
BIAS_MAX: Final = 50.0
"""sigmoid(50) = 1 - 2e-22: any larger bias says "certain" and no data can support it."""
SLOPE_MAX: Final = 100.0  # a Platt slope a is a 1/T: the same range's upper end
SLACK: Final = 1e-9  # relative: closed range ends hold to rounding, not beyond


def check_document(doc: Any, *, input: str | None = None) -> Mapping[str, Any]:
    """``doc`` when it is a valid calibrator document, else CalibratorError.

    With ``input`` (the model's score kind), a document for another kind is refused.
    """
    if not isinstance(doc, Mapping):
        raise CalibratorError("a calibrator document must be a JSON object")
    missing = [key for key in REQUIRED if key not in doc]
    if missing:
        raise CalibratorError(f"calibrator document has no {', '.join(map(repr, missing))}")
    check_numbers(doc)
    for key in ("model", "segment"):
        if not isinstance(doc[key], str) or not doc[key]:
            raise CalibratorError(f"{key} must be a non-empty string, got {doc[key]!r}")
    check_version(doc["version"])
    kind = doc["input"]
    if not isinstance(kind, str) or kind not in INPUTS:
        raise CalibratorError(f"input must be one of {', '.join(INPUTS)}, got {kind!r}")
    if input is not None and kind != input:
        raise CalibratorError(f"input {kind!r} does not fit the model's scores ({input!r})")
    rule = RULES.get(doc["method"]) if isinstance(doc["method"], str) else None
    if rule is not None:
        params = doc["params"]
        if not isinstance(params, Mapping):
            raise CalibratorError(f"{doc['method']}: params must be an object")
        rule(params, kind)
    return doc


def check_version(version: Any) -> int:
    if isinstance(version, bool) or not isinstance(version, int):
        raise CalibratorError(f"version must be an integer, got {version!r}")
    if not 0 <= version <= MAX_VERSION:
        raise CalibratorError(f"version must lie in [0, {MAX_VERSION}], got {version}")
    return version


def check_numbers(doc: Any) -> None:
    """Every number anywhere in ``doc`` finite, every integer within +-2^63 (iterative:
    the depth is bounded by the caller, the breadth by the size limit)."""
    stack = [doc]
    while stack:
        v = stack.pop()
        if isinstance(v, float):
            if not math.isfinite(v):
                raise CalibratorError(f"a calibrator document holds a non-finite number {v}")
        elif isinstance(v, int) and not isinstance(v, bool):
            if not -MAX_INT < v < MAX_INT:
                raise CalibratorError("a calibrator document holds an integer out of range "
                                      f"({len(str(abs(v)))} digits)")
        elif isinstance(v, Mapping):
            stack.extend(v.values())
        elif isinstance(v, list | tuple):
            stack.extend(v)


def _number(params: Mapping[str, Any], key: str, lo: float, hi: float, method: str,
            *, open_lo: bool = False) -> float:
    v = params.get(key)
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise CalibratorError(f"{method}: {key} must be a number, got {v!r}")
    x = float(v)  # integers are within 2^63 (check_numbers): never overflows
    # closed ends hold to rounding: a fit's 1 / (1 / 100) may be 100.00000000000001
    lo_ok = lo < x if open_lo else lo - SLACK * abs(lo) <= x
    if not lo_ok or not x <= hi + SLACK * abs(hi):
        side = "(" if open_lo else "["
        raise CalibratorError(f"{method}: {key} must lie in {side}{lo:g}, {hi:g}], got {v!r}")
    return x


def _list(params: Mapping[str, Any], key: str, max_len: int, method: str) -> list[Any]:
    v = params.get(key)
    if not isinstance(v, list | tuple):
        raise CalibratorError(f"{method}: {key} must be a list")
    if len(v) > max_len:
        raise CalibratorError(f"{method}: {key} has {len(v)} entries, over the limit of "
                              f"{max_len}")
    return list(v)


def _temperature(params: Mapping[str, Any], kind: str) -> None:
    _number(params, "temperature", T_MIN, T_MAX, "temperature")
    if "bias" not in params:
        return
    if kind in BINARY_INPUTS:
        if isinstance(params["bias"], list | tuple):
            raise CalibratorError(f"temperature: a list of class biases does not fit the "
                                  f"binary input {kind!r}")
        _number(params, "bias", -BIAS_MAX, BIAS_MAX, "temperature")
        return
    biases = params["bias"]
    if not isinstance(biases, list | tuple):
        raise CalibratorError(f"temperature: bias for input {kind!r} must be a list of K "
                              "class biases")
    for i, _ in enumerate(_list(params, "bias", MAX_CLASSES, "temperature")):
        _number({"bias": biases[i]}, "bias", -BIAS_MAX, BIAS_MAX, f"temperature[{i}]")


def _platt(params: Mapping[str, Any], kind: str) -> None:
    # a > 0: a slope of 0 or below maps every score to one value or turns the ranking round
    _number(params, "a", 0.0, SLOPE_MAX, "platt", open_lo=True)
    _number(params, "b", -BIAS_MAX, BIAS_MAX, "platt")


def _outputs(values: list[Any], key: str, method: str) -> None:
    """Strictly inside (0, 1): "no certainties" (contract §6)."""
    for i, v in enumerate(values):
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise CalibratorError(f"{method}: {key}[{i}] must be a number, got {v!r}")
        if not 0.0 < v < 1.0:
            raise CalibratorError(f"{method}: {key}[{i}] must lie strictly between 0 and 1 "
                                  f"(no certainties), got {v!r}")


def _isotonic(params: Mapping[str, Any], kind: str) -> None:
    _list(params, "x", MAX_KNOTS, "isotonic")
    y = _list(params, "y", MAX_KNOTS, "isotonic")
    _outputs(y, "y", "isotonic")
    if any(b < a for a, b in pairwise(y)):
        raise CalibratorError("isotonic: y must be non-decreasing (a monotone map)")


def _histogram(params: Mapping[str, Any], kind: str) -> None:
    _list(params, "edges", MAX_KNOTS + 1, "histogram")
    _outputs(_list(params, "values", MAX_KNOTS, "histogram"), "values", "histogram")


RULES: Final = {"temperature": _temperature, "platt": _platt, "isotonic": _isotonic,
                "histogram": _histogram}
