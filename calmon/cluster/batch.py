"""One joined-sample micro-batch: a model's new samples of one checkpoint of one sender.

Layout: ``MAGIC`` (4 bytes), a big-endian u32 header length, a JSON header, then per
series the raw little-endian columns ts (f8), label (i4), kind (i1) and score (f8, n or
n x K). The header carries the sender, its source range per input partition
(``[topic, partition, from, to)``: what the owner deduplicates by), and the sender's
event time of the model ("now"), which the owner's clock for the model follows. A batch
too large for one Kafka record is cut in parts (``part``: [i, n], ``split``): the parts
share the source range, and the owner tells them apart by ``i``.

``decode`` checks the structure and the types (a ``BatchError`` carries the reason it is
counted under); ``cluster.checks`` checks every field's values.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from calmon.engine.buffer import SampleSet

MAGIC = b"CMJ1"
_LEN = struct.Struct(">I")
MAX_HEADER = 1 << 20


class BatchError(ValueError):
    """Bytes that are not a joined batch (counted and skipped by the owner) under
    ``reason`` (a reason of ``calmon_invalid_records_total``)."""

    def __init__(self, message: str, reason: str = "bad_batch") -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class Series:
    segment: str
    classes: int  # 0 binary, K multiclass
    added: int  # samples the sender's ring took since the last batch (>= len(samples))
    samples: SampleSet


@dataclass(frozen=True)
class JoinedBatch:
    model: str
    now: float  # the sender's event time of the model
    sender: int  # kafka.instance.index of the sender
    # (topic, partition) -> (from, to): the input offsets this batch's samples came from
    source: dict[tuple[str, int], tuple[int, int]]
    series: list[Series] = field(default_factory=list)
    part: tuple[int, int] = (0, 1)  # (i, n): part i of a batch cut in n (``split``)

    def __len__(self) -> int:
        return sum(len(s.samples) for s in self.series)


def encode(b: JoinedBatch) -> bytes:
    header: dict[str, Any] = {"model": b.model, "now": b.now if np.isfinite(b.now) else None,
              "sender": b.sender,
              "source": [[t, p, f, e] for (t, p), (f, e) in sorted(b.source.items())],
              "series": [{"segment": s.segment, "classes": s.classes, "added": s.added,
                          "n": len(s.samples)} for s in b.series]}
    if b.part != (0, 1):
        header["part"] = list(b.part)
    head = json.dumps(header, separators=(",", ":")).encode()
    parts = [MAGIC, _LEN.pack(len(head)), head]
    for s in b.series:
        x = s.samples
        parts += [np.ascontiguousarray(x.ts, "<f8").tobytes(),
                  np.ascontiguousarray(x.label, "<i4").tobytes(),
                  np.ascontiguousarray(x.kind, "<i1").tobytes(),
                  np.ascontiguousarray(x.score, "<f8").tobytes()]
    return b"".join(parts)


def _int(v: Any, what: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise BatchError(f"{what} is not an integer")
    return v


def _str(v: Any, reason: str) -> str:
    if not isinstance(v, str):
        raise BatchError(f"{reason}: not a string", reason)
    return v


def _header(data: bytes) -> tuple[dict[str, Any], int]:
    if data[:4] != MAGIC:
        raise BatchError("not a joined batch (bad magic)")
    (hlen,) = _LEN.unpack_from(data, 4)
    if hlen > MAX_HEADER or 8 + hlen > len(data):
        raise BatchError("bad header length")
    try:
        h = json.loads(data[8:8 + hlen])
    except UnicodeDecodeError:
        raise BatchError("header is not UTF-8", "not_utf8") from None
    if not isinstance(h, dict):
        raise BatchError("header is not an object")
    return h, 8 + hlen


def decode(data: bytes) -> JoinedBatch:
    """Raises BatchError on anything malformed; never trusts a length it cannot check."""
    try:
        h, pos = _header(data)
        series: list[Series] = []
        for s in h["series"]:
            n, k = _int(s["n"], "n"), _int(s["classes"], "classes")
            added = _int(s["added"], "added")
            if n < 0 or k < 0 or k == 1 or added < n:
                raise BatchError("bad series sizes")
            segment = _str(s["segment"], "bad_segment")
            cols = []
            for dtype, width in (("<f8", 1), ("<i4", 1), ("<i1", 1), ("<f8", max(k, 1))):
                size = np.dtype(dtype).itemsize * n * width
                if pos + size > len(data):
                    raise BatchError("truncated columns")
                cols.append(np.frombuffer(data, dtype, n * width, pos).copy())
                pos += size
            score = cols[3].reshape(n, k) if k else cols[3]
            series.append(Series(segment, k, added,
                                 SampleSet(cols[0], cols[1], cols[2], score, 0)))
        if pos != len(data):
            raise BatchError("trailing bytes")
        source = {(_str(t, "bad_source"), _int(p, "partition")): (_int(f, "from"), _int(e, "to"))
                  for t, p, f, e in h["source"]}
        if h["now"] is not None and (isinstance(h["now"], bool)
                                     or not isinstance(h["now"], int | float)):
            raise BatchError("now is not a number", "bad_ts")
        now = -np.inf if h["now"] is None else float(h["now"])
        i, parts = (_int(x, "part") for x in h.get("part", (0, 1)))
        return JoinedBatch(_str(h["model"], "bad_model"), now, _int(h["sender"], "sender"),
                           source, series, (i, parts))
    except BatchError:
        raise
    except (ValueError, KeyError, TypeError, IndexError, OverflowError, RecursionError,
            struct.error) as e:
        raise BatchError(f"malformed joined batch: {type(e).__name__}: {str(e)[:200]}") from None


def _width(classes: int) -> int:
    """Bytes a sample takes in the columns: ts, label, kind and its score(s)."""
    return 8 + 4 + 1 + 8 * max(classes, 1)


def split(b: JoinedBatch, budget: int) -> list[JoinedBatch]:
    """``b`` as parts of at most ``budget`` encoded bytes each (``b`` itself when it
    fits): a series too long for one part is cut, each cut its share of ``added`` (the
    last one also what the sender's ring lost). Parts share the source range and are
    numbered (``part``), so the owner takes each once and a re-sent one is a copy."""
    if len(encode(b)) <= budget:
        return [b]
    base = len(encode(JoinedBatch(b.model, b.now, b.sender, b.source, [], (1 << 30, 1 << 30))))
    groups: list[list[Series]] = []
    cur: list[Series] = []
    size = base
    for s in b.series:
        entry = len(json.dumps({"segment": s.segment, "classes": s.classes,
                                "added": s.added, "n": len(s.samples)})) + 8
        width, n, start = _width(s.classes), len(s.samples), 0
        while True:
            room = (budget - size - entry) // width
            if room < min(1, n) and cur:  # not even one more sample: a new part
                groups.append(cur)
                cur, size = [], base
                continue
            if room < min(1, n):
                raise ValueError(f"a joined batch part cannot fit {budget} bytes")
            take = min(room, n - start)
            end = start + take
            x = s.samples
            cut = slice(start, end)
            lost = s.added - n if end == n else 0  # the ring's lost count rides last
            cur.append(Series(s.segment, s.classes, take + lost, SampleSet(
                x.ts[cut], x.label[cut], x.kind[cut], x.score[cut], 0)))
            size += entry + take * width
            start = end
            if start >= n:
                break
    if cur:
        groups.append(cur)
    return [JoinedBatch(b.model, b.now, b.sender, b.source, g, (i, len(groups)))
            for i, g in enumerate(groups)]
