"""The records of replay's two files on one event-time timeline, read in bulk.

Each file is read whole and cut into lines (``\\n``; trailing ``\\r`` dropped, blank
lines skipped, each line keeping its number for dead letters). Only the ``ts`` of each
record is decoded, by a msgspec struct of the ``fields.ts`` path (a nested path is a
struct inside a struct), and a line msgspec will not read that way goes through the
standard-library json, as a record always did; the engine still accepts or rejects
every line on its merits, the ts here only orders them.

The order (``order_key``): each record at its own ``ts``; a record without a readable
one (a label in the ``{"id", "label"}`` form) at its place in its file, taken to the
same relative place in the other file: the record k% of the way through its file is
read just after the records k% of the way through the other (at the time of the timed
record there or, untimed too, the one before it). A labels file in the order of its
predictions thus reads as labels that come promptly, however many fewer lines it has
(clicks only, with implicit negatives). Ties: predictions first, then by the raw
bytes, so any interleaving of the same timed records gives identical output. The sort
is one ``np.lexsort``; only runs of equal (time, kind) are ordered by their bytes.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from operator import attrgetter
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from calmon.engine.rawbatch import RawBatch
from calmon.engine.records import TS_MAX, TS_MIN, Kind, parse_ts

_WHITE = b" \t\n\r\x0b\x0c"  # what bytes.strip() removes


@dataclass
class Lines:
    """One file's non-blank lines, their line numbers and their own ts (NaN: none)."""

    path: Path
    kind: Kind
    values: list[bytes]
    lineno: np.ndarray
    ts: np.ndarray


def read_lines(path: Path, kind: Kind, ts_path: str) -> Lines:
    data = path.read_bytes()
    values, lineno = split_lines(data)
    return Lines(path, kind, values, lineno, own_ts(values, ts_path, data))


def split_lines(data: bytes) -> tuple[list[bytes], np.ndarray]:
    """The non-blank lines of ``data`` without their line ends, and their numbers (from
    1, blank lines counted)."""
    lines = data.split(b"\n")
    if lines and not lines[-1]:
        lines.pop()  # the end of the last line, not a line
    if b"\r" in data:
        lines = [line.rstrip(b"\r") if line[-1:] == b"\r" else line for line in lines]
    # a JSON line starts with "{": only the others can be blank
    blank = [i for i, line in enumerate(lines)
             if not line or (line[0] in _WHITE and not line.strip())]
    if not blank:
        return lines, np.arange(1, len(lines) + 1, dtype=np.int64)
    keep = np.ones(len(lines), bool)
    keep[blank] = False
    drop = set(blank)
    return ([line for i, line in enumerate(lines) if i not in drop],
            np.flatnonzero(keep).astype(np.int64) + 1)


def own_ts(values: list[bytes], ts_path: str, data: bytes | None = None) -> np.ndarray:
    """Each line's own ts as seconds, NaN where it has none that reads. ``data``: the
    file the lines were cut from, decoded whole when every line reads as the struct
    does (a number, or for the second try a number, a string or null, at the path)."""
    parts = ts_path.split(".")
    out = np.full(len(values), math.nan)
    if not values:
        return out
    blob = data if data is not None else b"\n".join(values)
    try:  # numbers only: no Python object per line beyond the struct
        got = msgspec.json.Decoder(_struct(parts, numbers=True)).decode_lines(blob)
        if len(got) == len(values):
            numbers = np.fromiter(map(attrgetter(".".join(["v"] * len(parts))), got),
                                  np.float64, len(got))
            return _in_range(numbers, out)
    except (msgspec.DecodeError, msgspec.ValidationError):
        pass
    try:  # numbers, ISO strings and nulls, at once
        decoded = msgspec.json.Decoder(_struct(parts)).decode_lines(blob)
        leaves = [_leaf(r, parts) for r in decoded] if len(decoded) == len(values) else None
    except (msgspec.DecodeError, msgspec.ValidationError):
        leaves = None
    if leaves is None:  # line by line, the standard-library json for what msgspec refuses
        one = msgspec.json.Decoder(_struct(parts))
        leaves = [_one(one, v, parts) for v in values]
    numbers = np.array([v if type(v) is float else math.nan for v in leaves], np.float64)
    _in_range(numbers, out)
    for i, v in enumerate(leaves):
        if v is not None and type(v) is not float:  # an ISO string, or a line json read
            out[i] = _ts(v)
    return out


def _in_range(numbers: np.ndarray, out: np.ndarray) -> np.ndarray:
    """``numbers`` into ``out`` where they are times parse_ts accepts."""
    ok = (numbers >= TS_MIN) & (numbers <= TS_MAX)  # NaN and infinities out
    out[ok] = numbers[ok]
    return out


def _struct(parts: list[str], numbers: bool = False) -> Any:
    """A msgspec struct holding only the value at this path. ``numbers``: a float leaf
    (NaN when absent) under parents that default to empty; else a number, string or
    null leaf (None when absent) under parents that may be absent."""
    leaf: Any = float if numbers else float | str | None
    default: Any = math.nan if numbers else None
    for i, name in enumerate(reversed(parts)):
        st = msgspec.defstruct(f"Ts{len(parts) - i}", [("v", leaf, default)],
                               rename={"v": name}, gc=False)
        if numbers:
            leaf, default = st, msgspec.field(default_factory=st)
        else:
            leaf, default = st | None, None
    return leaf


def _leaf(record: Any, parts: list[str]) -> Any:
    for _ in parts:
        if record is None:
            return None
        record = record.v
    return record


class _Slow:
    """A value the standard-library json read (what msgspec refused), kept as is."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


def _one(decoder: Any, value: bytes, parts: list[str]) -> Any:
    try:
        return _leaf(decoder.decode(value), parts)
    except (msgspec.DecodeError, msgspec.ValidationError):
        try:
            obj: Any = json.loads(value)
            for p in parts:
                obj = obj[p]
        except Exception:  # not JSON, not an object, no ts: placed by its file position
            return None
        return _Slow(obj)


def _ts(v: Any) -> float:
    try:
        return parse_ts(v.value if isinstance(v, _Slow) else v)
    except Exception:  # an unreadable ts: placed by its file position
        return math.nan


def order_key(own: np.ndarray, other: np.ndarray) -> np.ndarray:
    """The time each record of one file is read at: its own ts, or, where it has none
    (NaN), the time at the same relative place of the other file (``other``: that
    file's own ts, NaN where missing): the timed record there or the last before it
    (the first timed one for a leading gap). +inf when the other file has no time."""
    out = np.array(own, dtype=np.float64)
    gap = np.isnan(out)
    if not gap.any():
        return out
    timed = np.flatnonzero(~np.isnan(other))
    if not len(timed):
        out[gap] = math.inf
        return out
    # the other file's time at each of its lines: carried forward over its gaps
    carried = other[timed[np.maximum(np.searchsorted(timed, np.arange(len(other)),
                                                     side="right") - 1, 0)]]
    place = (np.flatnonzero(gap) * len(other)) // len(own)
    out[gap] = carried[place]
    return out


@dataclass
class Timeline:
    """Both files' records in the order they are read: ``t`` (ascending) the time each
    is read at, ``kinds`` and ``values`` the records, ``which``/``lineno`` where each
    came from (0: the predictions file, 1: the labels file)."""

    t: np.ndarray
    kinds: list[Kind]
    values: list[bytes | None]
    which: np.ndarray
    lineno: np.ndarray
    paths: tuple[Path, Path]

    def __len__(self) -> int:
        return len(self.values)

    def source(self, i: int) -> str:
        return f"{self.paths[int(self.which[i])]}:{int(self.lineno[i])}"

    def batch(self, start: int, end: int) -> RawBatch:
        """Records start..end-1 as one batch for ``Engine.feed``."""
        out = RawBatch()
        if end > start:
            out.add_lines(self.kinds[start:end], self.values[start:end],
                          lambda j: self.source(start + j))
        return out


def timeline(predictions: Lines, labels: Lines) -> Timeline:
    """Both files in read order (see the module's docstring)."""
    t = np.concatenate([order_key(predictions.ts, labels.ts),
                        order_key(labels.ts, predictions.ts)])
    n_p = len(predictions.values)
    kind = np.concatenate([np.zeros(n_p, np.int8), np.ones(len(labels.values), np.int8)])
    values = predictions.values + labels.values
    order = np.lexsort((kind, t))
    st, sk = t[order], kind[order]
    tied = np.flatnonzero((st[1:] == st[:-1]) & (sk[1:] == sk[:-1]))
    if len(tied):  # runs of equal (time, kind): by their bytes, stably
        order = order.copy()
        starts = tied[np.concatenate(([True], np.diff(tied) > 1))]
        ends = tied[np.concatenate((np.diff(tied) > 1, [True]))] + 2
        for a, b in zip(starts.tolist(), ends.tolist()):
            run = order[a:b].tolist()
            order[a:b] = sorted(run, key=values.__getitem__)
    idx = order.tolist()
    kinds = [Kind.PREDICTION, Kind.LABEL]
    lineno = np.concatenate([predictions.lineno, labels.lineno])
    return Timeline(t[order], [kinds[k] for k in kind[order].tolist()],
                    [values[i] for i in idx], kind[order], lineno[order],
                    (predictions.path, labels.path))
