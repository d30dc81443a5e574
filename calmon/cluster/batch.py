"""One joined-sample micro-batch: a model's new samples of one checkpoint of one sender.

Layout: ``MAGIC`` (4 bytes), a big-endian u32 header length, a JSON header, then per
series the raw little-endian columns ts (f8), label (i4), kind (i1) and score (f8, n or
n x K). The header carries the sender, its source range per input partition
(``[topic, partition, from, to)``: what the owner deduplicates by), and the sender's
event time of the model ("now"), which the owner's clock for the model follows.
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
    """Bytes that are not a joined batch (counted and skipped by the owner)."""


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

    def __len__(self) -> int:
        return sum(len(s.samples) for s in self.series)


def encode(b: JoinedBatch) -> bytes:
    header = {"model": b.model, "now": b.now if np.isfinite(b.now) else None,
              "sender": b.sender,
              "source": [[t, p, f, e] for (t, p), (f, e) in sorted(b.source.items())],
              "series": [{"segment": s.segment, "classes": s.classes, "added": s.added,
                          "n": len(s.samples)} for s in b.series]}
    head = json.dumps(header, separators=(",", ":")).encode()
    parts = [MAGIC, _LEN.pack(len(head)), head]
    for s in b.series:
        x = s.samples
        parts += [np.ascontiguousarray(x.ts, "<f8").tobytes(),
                  np.ascontiguousarray(x.label, "<i4").tobytes(),
                  np.ascontiguousarray(x.kind, "<i1").tobytes(),
                  np.ascontiguousarray(x.score, "<f8").tobytes()]
    return b"".join(parts)


def decode(data: bytes) -> JoinedBatch:
    """Raises BatchError on anything malformed; never trusts a length it cannot check."""
    try:
        if data[:4] != MAGIC:
            raise BatchError("not a joined batch (bad magic)")
        (hlen,) = _LEN.unpack_from(data, 4)
        if hlen > MAX_HEADER or 8 + hlen > len(data):
            raise BatchError("bad header length")
        h: dict[str, Any] = json.loads(data[8:8 + hlen])
        pos = 8 + hlen
        series: list[Series] = []
        for s in h["series"]:
            n, k = int(s["n"]), int(s["classes"])
            if n < 0 or k < 0 or k == 1 or int(s["added"]) < n:
                raise BatchError("bad series sizes")
            cols = []
            for dtype, width in (("<f8", 1), ("<i4", 1), ("<i1", 1), ("<f8", max(k, 1))):
                size = np.dtype(dtype).itemsize * n * width
                if pos + size > len(data):
                    raise BatchError("truncated columns")
                cols.append(np.frombuffer(data, dtype, n * width, pos).copy())
                pos += size
            score = cols[3].reshape(n, k) if k else cols[3]
            series.append(Series(str(s["segment"]), k, int(s["added"]),
                                 SampleSet(cols[0], cols[1], cols[2], score, 0)))
        if pos != len(data):
            raise BatchError("trailing bytes")
        source = {(str(t), int(p)): (int(f), int(e)) for t, p, f, e in h["source"]}
        now = -np.inf if h["now"] is None else float(h["now"])
        return JoinedBatch(str(h["model"]), now, int(h["sender"]), source, series)
    except BatchError:
        raise
    except (ValueError, KeyError, TypeError, IndexError, struct.error) as e:
        raise BatchError(f"malformed joined batch: {type(e).__name__}: {e}") from None
