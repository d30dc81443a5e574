"""Checksum-valid but hostile checkpoint payloads are a ValueError from ``decode``
(never another exception, never a large allocation), and a checkpoint that decodes but
cannot be restored is corrupt like an unreadable one (``CheckpointStore.load(use=)``)."""

from __future__ import annotations

import hashlib
import io
import json
import struct
import zipfile
from pathlib import Path

import numpy as np
import pytest

from calmon.errors import StateError
from calmon.io.checkpoint import _HEADER, FORMAT_VERSION, MAGIC, Checkpoint, CheckpointStore, decode


def v2(meta: object, data: bytes = b"") -> bytes:
    raw = json.dumps(meta).encode()
    raw += b" " * (-(8 + len(raw)) % 8)
    return struct.pack(">Q", len(raw)) + raw + data


def v1(header: object, members: dict[str, bytes], compress: int = zipfile.ZIP_STORED) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compress) as z:
        for name, data in members.items():
            z.writestr(name, data)
    raw = json.dumps(header).encode()
    return struct.pack(">Q", len(raw)) + raw + buf.getvalue()


def npy(shape: tuple[int, ...], data: bytes, descr: str = "<f8") -> bytes:
    f = io.BytesIO()
    np.lib.format.write_array_header_1_0(f, {"descr": descr, "fortran_order": False,
                                             "shape": shape})
    return f.getvalue() + data


ONE = np.arange(2, dtype="<f8").tobytes()


@pytest.mark.parametrize("doc", [
    [{"__nd__": 0}, {"__nd__": 0}],  # one array twice: restore would copy it as often
    {"__nd__": -1},  # a negative index
    {"__nd__": "0"},
    {"__b64__": 5},
])
def test_array_references_are_checked(doc: object) -> None:
    with pytest.raises(ValueError):
        decode(v2({"arrays": [["<f8", [2], 0]], "doc": doc}, ONE))


def test_a_document_nested_past_the_limit_is_refused() -> None:
    doc: object = {"__nd__": 0}
    for _ in range(80):
        doc = [doc, {"__b64__": ""}]
    with pytest.raises(ValueError, match="nested deeper"):
        decode(v2({"arrays": [["<f8", [2], 0]], "doc": doc}, ONE))


def test_format_1_reads_stored_members_and_refuses_the_rest() -> None:
    header = {"__nd__": 0}
    assert decode(v1(header, {"arr_0.npy": npy((2,), ONE)}), 1).tolist() == [0.0, 1.0]
    bad = {
        "compressed (a deflate bomb)": v1(header, {"arr_0.npy": npy((2,), ONE)},
                                          zipfile.ZIP_DEFLATED),
        "a header claiming a terabyte": v1(header, {"arr_0.npy": npy((2**37,), ONE)}),
        "object dtype": v1(header, {"arr_0.npy": npy((2,), ONE, "|O")}),
        "a member missing": v1({"__nd__": 1}, {"arr_1.npy": npy((2,), ONE)}),
        "not a zip": struct.pack(">Q", 2) + b"{}" + b"PK\x03\x04garbage",
    }
    for what, payload in bad.items():
        with pytest.raises(ValueError):
            decode(payload, 1)
            pytest.fail(what)


def _save(tmp_path: Path, seq: int, state: dict) -> Path:
    from calmon.io.checkpoint import encode

    payload = encode({"state": state, "written_at": float(seq), "positions": [["p", 0, seq]]})
    path = tmp_path / f"ckpt-{seq:012d}.calmon"
    path.write_bytes(_HEADER.pack(MAGIC, FORMAT_VERSION, len(payload),
                                  hashlib.sha256(payload).digest()) + payload)
    return path


def test_a_checkpoint_that_cannot_be_restored_is_corrupt(tmp_path: Path) -> None:
    _save(tmp_path, 1, {"good": True})
    newest = _save(tmp_path, 2, {"good": False})
    used: list[int] = []

    def use(ckpt: Checkpoint) -> None:
        used.append(ckpt.seq)
        if not ckpt.state["good"]:
            raise IndexError("a hostile state")  # whatever restore raises

    # the older one is used, the newest set aside
    ckpt = CheckpointStore(tmp_path).load("fail", use=use)
    assert ckpt is not None and ckpt.seq == 1 and used == [2, 1]
    assert (tmp_path / (newest.name + ".corrupt")).exists()

    # none usable: fail refuses (the files stay), reset starts empty (set aside)
    only = tmp_path / "only"
    only.mkdir()
    bad = _save(only, 1, {"good": False})
    with pytest.raises(StateError, match="IndexError: a hostile state"):
        CheckpointStore(only).load("fail", use=use)
    assert bad.exists()
    assert CheckpointStore(only).load("reset", use=use) is None
    assert (only / (bad.name + ".corrupt")).exists()

    # a StateError from use is about the config, not the file: it propagates
    def refuse(_ckpt: Checkpoint) -> None:
        raise StateError("another instance shape")

    _save(only, 2, {"good": True})
    with pytest.raises(StateError, match="another instance shape"):
        CheckpointStore(only).load("reset", use=refuse)
