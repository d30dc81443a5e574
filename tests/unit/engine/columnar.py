"""Helpers of the columnar-path tests: the same records as a ``list[Raw]`` or as a
``RawBatch`` of partition parts, and an engine's outcome in a form two engines that
must agree can be compared with ``==``.

What may legitimately differ between two runs of the same input (the order of dict
entries and of a sample buffer, garbage the join has not collected yet, buckets not
evicted yet) is normalised away; every count and every fixed-point window sum is
compared exactly.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from calmon.engine import idindex
from calmon.engine.engine import Engine
from calmon.engine.rawbatch import RawBatch
from calmon.engine.records import Kind, Raw
from calmon.engine.snapshot import Refresher, full_snapshot
from calmon.engine.windows import dense_cells

TOPIC = {Kind.PREDICTION: "predictions", Kind.LABEL: "labels"}
INDEX_MODES = {"dict": None, "buckets": 0}  # idindex.SMALL: as shipped, or buckets always


@contextmanager
def index_mode(small: int | None) -> Iterator[None]:
    """Joins made inside find pending predictions through a dict (None: as shipped,
    while there are few) or through numpy buckets from the first one (0)."""
    saved = idindex.SMALL
    if small is not None:
        idindex.SMALL = small
    try:
        yield
    finally:
        idindex.SMALL = saved


def raw(kind: Kind, value: bytes | None, partition: int, offset: int,
        stamp_ms: int | None = None) -> Raw:
    """A record as a Kafka source would make it: ``topic/partition/offset`` source, and
    the Kafka timestamp in seconds (``stamp_ms / 1000``, as a RawBatch converts it)."""
    return Raw(kind, value, None if stamp_ms is None else stamp_ms / 1000.0,
               f"{TOPIC[kind]}/{partition}/{offset}")


def as_rawbatch(raws: list[Raw]) -> RawBatch:
    """The same records, in the same order, as a RawBatch of ``add_partition`` parts:
    one part per run of consecutive records of one topic and partition. Every record's
    source must be ``topic/partition/offset`` and its timestamp whole milliseconds."""
    out = RawBatch()
    i = 0
    while i < len(raws):
        topic, partition, _ = raws[i].source.split("/")
        j = i
        while j < len(raws) and raws[j].source.split("/")[:2] == [topic, partition]:
            j += 1
        run = raws[i:j]
        assert all(r.kind is run[0].kind for r in run)
        out.add_partition(run[0].kind, topic, int(partition), [r.value for r in run],
                          [None if r.timestamp is None else round(r.timestamp * 1000)
                           for r in run],
                          [int(r.source.split("/")[2]) for r in run])
        i = j
    assert list(out) == raws  # the conversion itself: the same records back
    return out


def plain(x: Any) -> Any:
    """numpy arrays and tuples as lists, NaN as a string: something ``==`` compares."""
    if isinstance(x, np.ndarray):
        if x.dtype.kind in "biu" or (x.dtype.kind == "f" and not np.isnan(x).any()):
            return x.tolist()  # already plain: nested lists of Python ints and floats
        return plain(x.tolist())
    if isinstance(x, dict):
        return {_key(k): plain(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [plain(v) for v in x]
    if isinstance(x, np.generic):
        return plain(x.item())
    if isinstance(x, float) and math.isnan(x):
        return "nan"
    return x


def _key(k: Any) -> Any:
    """A dict key through ``plain``, still hashable."""
    out = plain(k)
    return tuple(out) if isinstance(out, list) else out


def _tables(part: list[dict[str, Any]]) -> list[list[Any]]:
    """Bucket tables (windows, score histograms): sorted (series, bucket, vector) rows."""
    return [sorted(plain([[int(k[0]), int(k[1]), v] for k, v in zip(*dense_cells(t))]))
            for t in part]


def normalised_join(snap: dict[str, Any], now: float) -> dict[str, Any]:
    ids = snap["ids"]
    vectors = {ids[int(i)]: plain(v) for i, v in snap["vectors"].items()}
    pending = sorted(
        [pid, *plain([snap[f][i] for f in ("ts", "score", "combo", "kind", "label",
                                           "label_ts")]), vectors.get(pid)]
        for i, pid in enumerate(ids))
    # joined ids are remembered (for duplicates) until their deadline; entries past it
    # are garbage, collected whenever the sweep gets to them
    # (an id may be listed twice: joined again after its first entry expired)
    done = sorted({(pid, d) for pid, d in snap["done"] if d > now})
    labels = snap["labels"]  # columns (engine/waiting.py): rows of [id, label, ts, deadline]
    rows = [[lid, *plain([labels[f][i] for f in ("label", "ts", "deadline")])]
            for i, lid in enumerate(labels["ids"])]
    for i, *whole in labels["rare"]:
        rows[i] += plain(whole)
    return {"pending": pending, "labels": sorted(rows), "done": done}


def normalised(engine: Engine) -> dict[str, Any]:
    """The engine's snapshot with what may legitimately differ normalised away."""
    engine.read_state(engine.version)  # evicts what slid out of every window, as any read
    snap = engine.snapshot()
    now = snap["now"]
    buffers = {int(sid): {"classes": ring["classes"], "total": ring["total"],
                          # the ring's order is the order samples joined in, which the
                          # batching may change (a sweep joins at the batch's end)
                          "rows": sorted(plain([[t, y, k, s] for t, y, k, s in zip(
                              ring["ts"], ring["label"], ring["kind"], ring["score"])]))}
               for sid, ring in (snap["buffers"] or {}).items()}
    return {
        "now": now, "models": plain(snap["models"]), "counters": snap["counters"],
        "series": plain(snap["series"]), "join": normalised_join(snap["join"], now),
        "windows": _tables(snap["windows"]), "scores": _tables(snap["scores"]),
        "buffers": buffers,
    }


def outcome(engine: Engine, with_rows: bool = True, expensive: bool = True) -> dict[str, Any]:
    """Counters, pending counts, every window row's numbers (bins included) and the
    normalised snapshot. Without ``expensive``, the rows leave out the statistics that
    are a function of the window sums alone (debiased and smooth ECE, the interval):
    the snapshot's windows are compared exactly already."""
    out = {"counters": dict(engine.counters), "pending": engine.join.pending,
           "pending_labels": engine.join.pending_labels, "state": normalised(engine)}
    if with_rows:
        out["rows"] = sorted(
            plain([r.model, r.segment, r.window, r.binary, r.stats.as_row(),
                   r.estimates.as_row(), r.stats.bins.count, r.stats.bins.conf,
                   r.stats.bins.correct])
            for r in (full_snapshot(engine) if expensive
                      else Refresher(engine, slice_rows=0).update()).rows)
    return out
