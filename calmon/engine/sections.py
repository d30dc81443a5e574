"""An engine's state cut in sections, for group mode's incremental changelog (contract
§8): the ``head`` (clocks, models, counters, the join's pending state), the series
``index``, and the series' own state (window buckets, score histograms, estimation
maps, refit buffers, classwise buckets) in groups of ``GROUP`` series by id, section
``g<k>`` holding series ``k * GROUP`` to ``(k + 1) * GROUP - 1``.

The join's joined-id memory (``done``: the ids joined within ``join.ttl``, oldest
first, up to ``join.max_pending``) is cut out of the head into pieces ``d<hash>``
(``split_done``): a piece ends after an id whose CRC-32 is 0 mod ``DONE_EVERY`` (or at
``DONE_MAX`` ids), so the cuts depend on the ids alone and a piece is named by its
content; new ids change the last piece, expired ones the first, and the rest are
written once. A checkpoint writes the head, the index when it changed, the new
pieces, and the groups holding a series the engine touched
(``Saving.take_touched``); ``assemble`` puts sections back together exactly as
``Engine.snapshot()`` makes them, for ``Engine.restore``. Groups
rather than one section a series: a full write of 5,000 series would be 5,000 records
(each a Kafka record with its headers, each an encode), while a group of 32 is a few
KiB. Pure: no I/O.
"""

from __future__ import annotations

import hashlib
import json
import zlib
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from calmon.engine.saving import Saving

GROUP = 32
HEAD = "h"
INDEX = "i"
DONE = "d"  # the prefix of a joined-id memory piece's section
DONE_EVERY = 1024  # ids a piece holds on average
DONE_MAX = 4096
_PACKED = ("keys", "nnz", "pos", "val", "dense_keys", "dense")


def group_name(k: int) -> str:
    return f"g{k}"


def groups_of(sids: Iterable[int]) -> set[int]:
    return {s // GROUP for s in sids}


def live_groups(engine: Saving) -> set[int]:
    """The groups of every series with state of its own."""
    with engine.lock:
        sids = engine.windows.series() | engine.scores.series() | set(engine.maps._last)
        if engine.buffers is not None:
            sids |= set(engine.buffers.rings)
        if engine.classwise is not None:
            sids |= {s for (s, _c) in engine._class_series}
        return groups_of(sids)


def group(engine: Saving, k: int) -> dict[str, Any] | None:
    """Group ``k``'s per-series state, None when it holds nothing."""
    with engine.lock:
        sids = range(k * GROUP, (k + 1) * GROUP)
        out = engine.snapshot_series(sids)
    empty = (all(len(p["keys"]) + len(p["dense_keys"]) == 0
                 for table in (out["windows"], out["scores"]) for p in table)
             and not out["maps"] and not out["buffers"]
             and (out["classwise"] is None or all(
                 len(p["keys"]) + len(p["dense_keys"]) == 0
                 for p in out["classwise"]["windows"])))
    return None if empty else out


def _concat(packs: list[list[dict[str, np.ndarray]]]) -> list[dict[str, np.ndarray]]:
    """Per window, the packed tables of several groups as one (groups in id order)."""
    if not packs:
        return []
    out = []
    for w in range(len(packs[0])):
        parts = [p[w] for p in packs]
        out.append({f: np.concatenate([np.asarray(q[f]) for q in parts]) for f in _PACKED})
    return out


def assemble(head: dict[str, Any], index: dict[str, Any],
             groups: dict[int, dict[str, Any]], empty: dict[str, Any]) -> dict[str, Any]:
    """``Engine.snapshot()`` from its sections; ``empty``: ``snapshot_series([])`` of an
    engine with the same config (the shape of tables with no series)."""
    parts = [groups[k] for k in sorted(groups)]
    snap = {k: v for k, v in head.items() if k != "classwise_series"}
    snap["series"] = index
    for table in ("windows", "scores"):
        snap[table] = _concat([empty[table], *[p[table] for p in parts]])
    snap["maps"] = sorted((row for p in parts for row in p["maps"]), key=lambda r: r[0])
    if empty["buffers"] is None:
        snap["buffers"] = None
    else:
        snap["buffers"] = {sid: ring for p in parts for sid, ring in (p["buffers"] or {}).items()}
    if empty["classwise"] is None:
        snap["classwise"] = None
    else:
        snap["classwise"] = {
            "windows": _concat([empty["classwise"]["windows"],
                                *[p["classwise"]["windows"] for p in parts]]),
            "series": head.get("classwise_series") or []}
    return snap


def _piece(entries: list[Any]) -> str:
    text = json.dumps(entries, separators=(",", ":"))
    return DONE + hashlib.blake2b(text.encode(), digest_size=10).hexdigest()


def split_done(head: dict[str, Any]) -> tuple[dict[str, Any], dict[str, list[Any]]]:
    """The head with its join's joined-id memory replaced by the names of its pieces
    (``done_pieces``), and the pieces by name."""
    join = head["join"]
    pieces: dict[str, list[Any]] = {}
    names: list[str] = []
    cur: list[Any] = []
    for entry in join["done"]:
        cur.append(entry)
        if len(cur) >= DONE_MAX or zlib.crc32(str(entry[0]).encode()) % DONE_EVERY == 0:
            names.append(_piece(cur))
            pieces[names[-1]] = cur
            cur = []
    if cur:
        names.append(_piece(cur))
        pieces[names[-1]] = cur
    return {**head, "join": {**join, "done": [], "done_pieces": names}}, pieces


def join_done(head: dict[str, Any], piece: Callable[[str], list[Any]]) -> dict[str, Any]:
    """``split_done`` undone: ``piece(name)`` is a piece's entries (KeyError: missing)."""
    join = dict(head["join"])
    names = join.pop("done_pieces", None)
    if names is not None:
        if not isinstance(names, list):
            raise ValueError("join: done_pieces is not a list")
        join["done"] = [e for name in names for e in piece(str(name))]
    return {**head, "join": join}
