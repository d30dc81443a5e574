"""The checkpoint format: a checkpoint of format 1 restores with the same numbers, the
current format round-trips every kind of value, and a malformed payload is refused
before anything is allocated from it."""

from __future__ import annotations

import hashlib
import json
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest

from calmon.engine.engine import Engine
from calmon.engine.snapshot import full_snapshot
from calmon.io.checkpoint import (
    _HEADER,
    FORMAT_VERSION,
    MAGIC,
    CheckpointStore,
    decode,
    encode,
)
from tests.unit.engine.test_windows import state_key
from tests.unit.io.checkpoint_fixture import FIXTURE, POSITIONS, WRITTEN_AT, batches, config


def _fed(parts: int) -> Engine:
    e = Engine(config())
    for part in range(parts):
        for raws in batches(part):
            e.feed(raws)
    return e


def test_a_format_1_checkpoint_restores_with_the_same_numbers(tmp_path: Path) -> None:
    shutil.copyfile(FIXTURE, tmp_path / "ckpt-000000000007.calmon")
    ckpt = CheckpointStore(tmp_path).load()
    assert ckpt is not None and ckpt.seq == 7
    assert ckpt.positions == POSITIONS and ckpt.written_at == WRITTEN_AT
    restored = Engine(config())
    restored.restore(ckpt.state["engine"])
    fresh = _fed(1)  # the same input through this calmon
    want = full_snapshot(fresh)
    assert want.counters["joined"] > 200 and want.pending > 0
    # format 1 kept one "now" for all models: each model's (v3) is recovered from the
    # latest predictions the state holds
    assert restored.join.nows == fresh.join.nows
    assert state_key(full_snapshot(restored)) == state_key(want)
    # and both go on identically, through a checkpoint of the current format
    store = CheckpointStore(tmp_path / "new")
    store.save({"engine": restored.snapshot()}, POSITIONS, WRITTEN_AT)
    again = store.load()
    assert again is not None
    second = Engine(config())
    second.restore(again.state["engine"])
    for raws in batches(1):
        second.feed(raws)
        fresh.feed(raws)
    assert state_key(full_snapshot(second)) == state_key(full_snapshot(fresh))


def test_the_current_format_round_trips_every_kind_of_value() -> None:
    obj = {"ints": np.arange(5, dtype=np.int64), "u2": np.array([1, 65535], np.uint16),
           "i1": np.array([-1, 2], np.int8), "f": np.array([[0.5, -np.inf]]),
           "b": np.array([True, False]), "empty": np.zeros((0, 3), np.int64),
           "be": np.array([1, 2], ">i4"), (3, "k"): [b"\x00raw", None, 1.5, "s"],
           7: {"nested": np.float64(2.5)}}
    out = decode(encode(obj))
    assert set(out) == {"ints", "u2", "i1", "f", "b", "empty", "be", (3, "k"), 7}
    for k in ("ints", "u2", "i1", "f", "b", "empty", "be"):
        assert out[k].dtype.kind == obj[k].dtype.kind and out[k].shape == obj[k].shape
        assert np.array_equal(out[k], obj[k]) and out[k].flags.writeable
    assert out[(3, "k")] == [b"\x00raw", None, 1.5, "s"] and out[7] == {"nested": 2.5}


def _payload(meta: dict, data: bytes = b"") -> bytes:
    raw = json.dumps(meta).encode()
    raw += b" " * (-(8 + len(raw)) % 8)
    return struct.pack(">Q", len(raw)) + raw + data


@pytest.mark.parametrize("specs", [
    [["|O", [2], 0]],  # object arrays: pickle
    [["<i8", [1 << 40], 0]],  # far more than the file holds
    [["<i8", [2, -1], 0]],  # a negative dimension
    [["<i8", [1], 4]],  # misaligned
    [["<i8", [1], 0], ["<i8", [1], 0]],  # overlapping
    [["<i8", [1, 1, 1, 1, 1], 0]],  # too many dimensions
    "not a list",
])
def test_bad_array_specs_are_refused_before_allocating(specs: object) -> None:
    with pytest.raises(ValueError):
        decode(_payload({"arrays": specs, "doc": {"__nd__": 0}}, b"\0" * 16))


def test_a_malformed_document_is_a_value_error(tmp_path: Path) -> None:
    deep = "[" * 100_000 + "]" * 100_000
    for payload in (_payload({"arrays": [], "doc": {"__map__": [[1]]}}),
                    struct.pack(">Q", 10**9) + b"{}",
                    struct.pack(">Q", len(deep)) + deep.encode()):
        with pytest.raises(ValueError):
            decode(payload)
    # through the store: refused, and with on_corrupt reset, set aside
    payload = encode({"state": {}, "written_at": "yesterday", "positions": []})
    blob = _HEADER.pack(MAGIC, FORMAT_VERSION, len(payload),
                        hashlib.sha256(payload).digest()) + payload
    (tmp_path / "ckpt-000000000001.calmon").write_bytes(blob)
    assert CheckpointStore(tmp_path).load("reset") is None
    assert (tmp_path / "ckpt-000000000001.calmon.corrupt").exists()
