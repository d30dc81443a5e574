"""Parsed YAML -> the typed model, and back.

``convert`` finds the converter of a type in two tables: one by the type's form
(``Annotated``, optional, ``Literal``, ``tuple``, ``Mapping``), one by the type
itself (the scalars and ``Window``); dataclasses are walked field by field. A
converter appends ``path.to.key: what is wrong`` to ``errors`` and returns None
on a problem, so every problem of a file is reported, not just the first.

``${VAR}`` always gives a string: a key that needs a number (or a boolean) reads
the string as one, so ``index: ${POD_INDEX}`` works and ``port: "80a"`` is still
an error.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import yaml

from calmon.config.model import WINDOW_RANGE, Config, Window
from calmon.config.units import (
    DURATION,
    SIZE,
    Range,
    format_duration,
    format_size,
    parse_duration,
    parse_size,
)

Errors = list[str]
# (value, type, path, errors) -> the converted value, or None with a problem appended
Converter = Callable[[Any, Any, str, Errors], Any]

_INT_TEXT = re.compile(r"\s*[+-]?\d{1,30}\s*")
_FLOAT_TEXT = re.compile(r"\s*[+-]?(\d{1,30}(\.\d{0,30})?|\.\d{1,30})([eE][+-]?\d{1,3})?\s*")


def join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _describe(v: Any) -> str:
    kind = {bool: "boolean", int: "integer", float: "number", str: "string",
            list: "list", dict: "mapping", type(None): "null"}.get(type(v), type(v).__name__)
    return f"{kind} {v!r}" if not isinstance(v, dict | list) else kind


def convert(v: Any, tp: Any, path: str, errors: Errors) -> Any:
    """Turn parsed YAML into ``tp``; on a problem append to ``errors`` and return None."""
    conv = _BY_FORM.get(get_origin(tp)) or _BY_TYPE.get(tp)
    if conv is None and dataclasses.is_dataclass(tp):
        conv = _dataclass
    if conv is None:
        raise TypeError(f"config type {tp!r} at {path or '(top)'} is not handled")  # a bug
    return conv(v, tp, path, errors)


def _fail(errors: Errors, path: str, what: str) -> None:
    errors.append(f"{path or '(top)'}: {what}")


# ---------------------------------------------------------------- by form


@dataclass(frozen=True)
class _Unit:
    """How an ``Annotated`` marker's text is read and its bounds written."""

    kinds: tuple[type, ...]
    expected: str
    parse: Callable[[Any], float]
    spell: Callable[[float], str]


_UNITS: dict[Any, _Unit] = {
    DURATION: _Unit((str,), "a duration like 30s, 15m, 24h", parse_duration, format_duration),
    SIZE: _Unit((int, str), "a size like 512MiB or 2GiB", parse_size, format_size),
}


def _annotated(v: Any, tp: Any, path: str, errors: Errors) -> Any:
    """A duration or size marker reads its text; every ``Range`` mark bounds the value."""
    base, *marks = get_args(tp)
    unit = next((u for mark, u in _UNITS.items() if mark in marks), None)
    spell: Any = None
    if unit is not None:
        if isinstance(v, bool) or not isinstance(v, unit.kinds):
            _fail(errors, path, f"expected {unit.expected}, got {_describe(v)}")
            return None
        try:
            out: Any = unit.parse(v)
        except ValueError as e:
            _fail(errors, path, str(e))
            return None
        spell, shown = unit.spell, str(v).strip()
    else:
        out = convert(v, base, path, errors)
        shown = repr(out)
    for m in marks:
        if isinstance(m, Range) and isinstance(out, int | float):
            problem = m.check(out, spell)
            if problem:
                _fail(errors, path, f"{problem}, got {shown}")
                return None
    return out


def _optional(v: Any, tp: Any, path: str, errors: Errors) -> Any:
    args = [a for a in get_args(tp) if a is not type(None)]
    if v is None:
        return None
    if len(args) > 1 and isinstance(v, str):  # a word among other forms: instance: group
        word = next((a for a in args if get_origin(a) is Literal), None)
        if word is not None:
            return convert(v, word, path, errors)
    return convert(v, args[0], path, errors)


def _literal(v: Any, tp: Any, path: str, errors: Errors) -> Any:
    allowed = get_args(tp)
    if v not in allowed:
        _fail(errors, path, f"must be one of {', '.join(map(str, allowed))}, got {_describe(v)}")
        return None
    return v


def _tuple(v: Any, tp: Any, path: str, errors: Errors) -> Any:
    args = get_args(tp)
    if args == (str, ...) and isinstance(v, str):  # bootstrap_servers: "a:9092,b:9092"
        v = [s.strip() for s in v.split(",") if s.strip()]
    if not isinstance(v, list):
        _fail(errors, path, f"expected a list, got {_describe(v)}")
        return None
    if len(args) == 2 and args[1] is Ellipsis:
        args = (args[0],) * len(v)
    elif len(v) != len(args):
        _fail(errors, path, f"expected a list of {len(args)} values, got {len(v)}")
        return None
    n = len(errors)
    out = tuple(convert(x, a, f"{path}[{i}]", errors) for i, (x, a) in enumerate(zip(v, args)))
    return out if len(errors) == n else None


def _mapping(v: Any, tp: Any, path: str, errors: Errors) -> Any:
    """A mapping of free keys: kept as given (``Mapping[str, Any]``), or each value
    converted to the declared type under ``path.<key>``."""
    if not isinstance(v, dict):
        _fail(errors, path, f"expected a mapping, got {_describe(v)}")
        return None
    args = get_args(tp)
    if len(args) != 2 or args[1] is Any:
        return types.MappingProxyType(dict(v))
    n = len(errors)
    out = {}
    for key, x in v.items():
        if not isinstance(key, str) or not key:
            _fail(errors, path, f"keys must be non-empty strings, got {_describe(key)}")
            continue
        out[key] = convert(x, args[1], join(path, key), errors)
    return types.MappingProxyType(out) if len(errors) == n else None


def _dataclass(v: Any, tp: Any, path: str, errors: Errors) -> Any:
    if not isinstance(v, dict):
        _fail(errors, path, f"expected a mapping, got {_describe(v)}")
        return None
    hints = typing.get_type_hints(tp, include_extras=True)
    names = [f.name for f in dataclasses.fields(tp)]
    for key in v:
        if key not in names:
            near = difflib.get_close_matches(str(key), names, n=1)
            hint = f" (did you mean {near[0]}?)" if near else ""
            errors.append(f"{join(path, str(key))}: unknown key{hint}")
    kwargs: dict[str, Any] = {}
    n = len(errors)
    for f in dataclasses.fields(tp):
        if f.name not in v:
            has_default = (f.default is not dataclasses.MISSING
                           or f.default_factory is not dataclasses.MISSING)
            if not has_default:
                errors.append(f"{join(path, f.name)}: required")
            continue
        kwargs[f.name] = convert(v[f.name], hints[f.name], join(path, f.name), errors)
    if len(errors) != n:
        return None
    return tp(**kwargs)


# ---------------------------------------------------------------- by type


def _bool(v: Any, tp: Any, path: str, errors: Errors) -> Any:
    if isinstance(v, str) and v.strip().lower() in ("true", "false"):
        return v.strip().lower() == "true"
    if not isinstance(v, bool):
        _fail(errors, path, f"expected true or false, got {_describe(v)}")
        return None
    return v


def _int(v: Any, tp: Any, path: str, errors: Errors) -> Any:
    if isinstance(v, str) and _INT_TEXT.fullmatch(v):
        return int(v)
    if isinstance(v, bool) or not isinstance(v, int):
        _fail(errors, path, f"expected an integer, got {_describe(v)}")
        return None
    return v


def _float(v: Any, tp: Any, path: str, errors: Errors) -> Any:
    if isinstance(v, str) and _FLOAT_TEXT.fullmatch(v) and math.isfinite(float(v)):
        return float(v)
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        _fail(errors, path, f"expected a number, got {_describe(v)}")
        return None
    return float(v)


def _str(v: Any, tp: Any, path: str, errors: Errors) -> Any:
    if not isinstance(v, str) or not v:
        _fail(errors, path, f"expected a non-empty string, got {_describe(v)}")
        return None
    return v


def _window(v: Any, tp: Any, path: str, errors: Errors) -> Window | None:
    if not isinstance(v, str):
        _fail(errors, path, f"expected a duration like 1h, got {_describe(v)}")
        return None
    try:
        seconds = parse_duration(v)
    except ValueError as e:
        _fail(errors, path, str(e))
        return None
    problem = WINDOW_RANGE.check(seconds, format_duration)
    if problem:
        _fail(errors, path, f"{problem}, got {v.strip()}")
        return None
    return Window(v.strip(), seconds)


_BY_FORM: dict[Any, Converter] = {
    Annotated: _annotated, Union: _optional, types.UnionType: _optional, Literal: _literal,
    tuple: _tuple, Mapping: _mapping,
}
_BY_TYPE: dict[Any, Converter] = {
    bool: _bool, int: _int, float: _float, str: _str, Window: _window, Mapping: _mapping,
}


# ---------------------------------------------------------------- printing


def to_dict(cfg: Any) -> Any:
    """The effective config as plain YAML-able data, durations spelt as durations."""
    if isinstance(cfg, Window):
        return cfg.name
    if dataclasses.is_dataclass(cfg):
        hints = typing.get_type_hints(type(cfg), include_extras=True)
        out = {}
        for f in dataclasses.fields(cfg):
            val = getattr(cfg, f.name)
            is_dur = DURATION in getattr(hints[f.name], "__metadata__", ())
            out[f.name] = format_duration(val) if is_dur and val is not None else to_dict(val)
        return out
    if isinstance(cfg, tuple):
        return [to_dict(x) for x in cfg]
    if isinstance(cfg, Mapping):
        return {k: to_dict(x) for k, x in cfg.items()}
    return cfg


def dump(cfg: Config) -> str:
    return yaml.safe_dump(to_dict(cfg), sort_keys=False, default_flow_style=None)
