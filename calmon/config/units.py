"""The value kinds of config: durations and sizes as written, and numeric bounds.

Every duration and size key has bounds (the ``Range`` of its field), so a 1 ns
window or a 10^8-sample buffer is an error, not a surprise.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated, Any


def _bound(x: float) -> str:
    """A bound as written: 1048575, not 1.04858e+06."""
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e15 else f"{x:g}"


@dataclass(frozen=True)
class Range:
    """Annotated marker: numeric bounds (inclusive unless ``open_*``)."""

    lo: float | None = None
    hi: float | None = None
    open_lo: bool = False
    open_hi: bool = False

    def check(self, v: float, spell: Any = None) -> str | None:
        """What is wrong with ``v``, bounds written by ``spell`` (default: numbers)."""
        spell = spell or _bound
        if self.lo is not None and (v <= self.lo if self.open_lo else v < self.lo):
            return f"must be {'>' if self.open_lo else '>='} {spell(self.lo)}"
        if self.hi is not None and (v >= self.hi if self.open_hi else v > self.hi):
            return f"must be {'<' if self.open_hi else '<='} {spell(self.hi)}"
        return None


class _DurationMarker:
    """Annotated marker: a duration string (``500ms``, ``30s``, ``15m``, ``24h``, ``7d``)."""


DURATION = _DurationMarker()
MINUTE, HOUR, DAY = 60.0, 3600.0, 86400.0
YEAR = 365 * DAY
# seconds, with the bounds every duration key has unless it says otherwise: at least
# 1 s (1 s intervals and cooldowns are valid), at most a year
Duration = Annotated[float, DURATION, Range(1.0, YEAR)]
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_DURATION_RE = re.compile(r"^\s*(-?\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)\s*$")


def parse_duration(text: str) -> float:
    """``'15m'`` -> 900.0. Raises ValueError when the text is not a positive duration."""
    m = _DURATION_RE.match(text)
    if not m:
        raise ValueError(f"expected a duration like 500ms, 30s, 15m, 24h or 7d, got {text!r}")
    seconds = float(m.group(1)) * _UNITS[m.group(2)]
    if seconds <= 0:
        raise ValueError(f"must be a positive duration, got {text!r}")
    return seconds


class _SizeMarker:
    """Annotated marker: a size in bytes (``1048576``, ``512MiB``, ``2GiB``, ``1GB``)."""


SIZE = _SizeMarker()
Size = Annotated[int, SIZE]  # bytes, > 0
MIB, GIB, TIB = 2**20, 2**30, 2**40
_SIZE_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "m": 10**6, "mb": 10**6, "g": 10**9,
               "gb": 10**9, "t": 10**12, "tb": 10**12, "ki": 2**10, "kib": 2**10,
               "mi": 2**20, "mib": 2**20, "gi": 2**30, "gib": 2**30, "ti": 2**40, "tib": 2**40}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*$")


def parse_size(text: str | int) -> int:
    """``'2GiB'`` -> 2147483648. Raises ValueError when the text is not a positive size."""
    if isinstance(text, int) and not isinstance(text, bool):
        if text <= 0:
            raise ValueError(f"must be a positive size, got {text!r}")
        return text
    m = _SIZE_RE.match(str(text))
    unit = m.group(2).lower() if m else ""
    if not m or unit not in _SIZE_UNITS:
        raise ValueError(f"expected a size like 512MiB, 2GiB or a number of bytes, got {text!r}")
    n = int(float(m.group(1)) * _SIZE_UNITS[unit])
    if n <= 0:
        raise ValueError(f"must be a positive size, got {text!r}")
    return n


def format_size(n: float) -> str:
    """Bytes as written in a bound: 16777216 -> '16MiB', 1000 -> '1000'."""
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size and float(n / size).is_integer():
            return f"{int(n // size)}{unit}"
    return _bound(n)


def format_duration(seconds: float) -> str:
    """The shortest exact spelling: 86400 -> '1d', 5400 -> '90m', 0.5 -> '500ms'."""
    for unit in ("d", "h", "m", "s"):
        n = seconds / _UNITS[unit]
        if n >= 1 and float(n).is_integer():
            return f"{int(n)}{unit}"
    return f"{seconds * 1000:g}ms"
