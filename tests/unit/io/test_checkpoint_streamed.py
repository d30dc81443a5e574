"""A checkpoint write is streamed (issue 35 item 13): it holds no second copy of the
state, and its file is the one the previous, all-in-memory writer made, which still
restores."""

from __future__ import annotations

import base64
import hashlib
import json
import struct
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np

from calmon.engine.engine import Engine
from calmon.engine.snapshot import full_snapshot
from calmon.io.checkpoint import _HEADER, FORMAT_VERSION, MAGIC, CheckpointStore
from tests.unit.engine.test_windows import state_key
from tests.unit.io.checkpoint_fixture import POSITIONS, WRITTEN_AT, batches, config


def _walk_out(x: Any, arrays: list[np.ndarray]) -> Any:
    """The previous writer's document walk: bytes as base64 at once."""
    if isinstance(x, np.ndarray):
        arrays.append(x)
        return {"__nd__": len(arrays) - 1}
    if isinstance(x, bytes | bytearray):
        return {"__b64__": base64.b64encode(bytes(x)).decode("ascii")}
    if isinstance(x, dict):
        return {"__map__": [[_walk_out(k, arrays), _walk_out(v, arrays)]
                            for k, v in x.items()]}
    if isinstance(x, list | tuple):
        if all(type(v) in (str, int, float, bool, type(None)) for v in x):
            return x
        return [_walk_out(v, arrays) for v in x]
    if isinstance(x, np.generic):
        return x.item()
    return x


def _previous_file(doc: dict[str, Any]) -> bytes:
    """The file the writer before issue 35 made of ``doc``: the payload and the header
    built in memory (its code, kept here as the reference)."""
    arrays: list[np.ndarray] = []
    walked = _walk_out(doc, arrays)
    specs, parts, offset = [], [], 0
    for a in arrays:
        a = np.ascontiguousarray(a)
        if a.dtype.str not in {"<i8", "<i4", "<f8", "|i1", "|u1", "|b1", "<u2", "<i2"}:
            a = a.astype(a.dtype.newbyteorder("<"))
        specs.append([a.dtype.str, list(a.shape), offset])
        data = a.reshape(-1).data.cast("B") if a.size else b""
        parts.append(bytes(data) + b"\0" * (-len(data) % 8))
        offset += len(parts[-1])
    meta = json.dumps({"arrays": specs, "doc": walked}, separators=(",", ":")).encode()
    meta += b" " * (-(8 + len(meta)) % 8)
    payload = b"".join([struct.pack(">Q", len(meta)), meta, *parts])
    return _HEADER.pack(MAGIC, FORMAT_VERSION, len(payload),
                        hashlib.sha256(payload).digest()) + payload


def _fed() -> Engine:
    e = Engine(config())
    for raws in batches(0):
        e.feed(raws)
    return e


def test_a_checkpoint_of_the_previous_writer_restores_and_the_new_one_is_the_same_file(
        tmp_path: Path) -> None:
    e = _fed()
    state = {"engine": e.snapshot(), "extra": {b"k": [b"\x00raw", (1, b"")], 3: b"v"}}
    doc = {"state": state, "written_at": WRITTEN_AT,
           "positions": [[t, p, o] for (t, p), o in sorted(POSITIONS.items())]}
    old = _previous_file(doc)
    (tmp_path / "ckpt-000000000003.calmon").write_bytes(old)
    ckpt = CheckpointStore(tmp_path).load()
    assert ckpt is not None and ckpt.positions == POSITIONS
    restored = Engine(config())
    restored.restore(ckpt.state["engine"])
    assert full_snapshot(e).pending > 0 and full_snapshot(e).counters["joined"] > 100
    assert state_key(full_snapshot(restored)) == state_key(full_snapshot(e))
    # the streamed writer makes the very same bytes
    new = CheckpointStore(tmp_path / "new").save(state, POSITIONS, WRITTEN_AT)
    assert new.read_bytes() == old


def _large_state() -> dict[str, Any]:
    """Arrays (bucket tables) and long lists of ids (pending predictions, waiting labels,
    joined ids, labels kept whole with their bytes), ~100 MB written."""
    ids = [f"{i:0256d}" for i in range(100_000)]
    return {"engine": {"tables": np.arange(5_000_000, dtype=np.int64),
                       "scores": np.ones((1000, 500)),
                       "ids": ids,
                       "labels": [[f"L{i:0255d}", 1, 1.7e9 + i, None, None, "", 1.8e9]
                                  for i in range(50_000)],
                       "whole": [[i, 2, 1.7e9, "m", b"r" * 500, "labels/0/1"]
                                 for i in range(20_000)]}}


def test_a_checkpoint_write_holds_at_most_one_copy_of_the_state(tmp_path: Path) -> None:
    state = _large_state()
    store = CheckpointStore(tmp_path)
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        path = store.save(state, {("p", 0): 5}, 1.0)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    size = path.stat().st_size
    assert size > 80 * 2**20
    # the state itself is the one copy allowed; the write adds far less than one more
    # (the writer before streamed writes held three: payload, header + payload, meta)
    assert peak - before < size
    ckpt = store.load()
    assert ckpt is not None
    assert np.array_equal(ckpt.state["engine"]["tables"], state["engine"]["tables"])
    assert ckpt.state["engine"]["ids"] == state["engine"]["ids"]
    assert ckpt.state["engine"]["labels"] == state["engine"]["labels"]
    assert ckpt.state["engine"]["whole"] == state["engine"]["whole"]
