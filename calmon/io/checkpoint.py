"""Checkpoint store: engine state and consumer positions, written together, atomically.

File format (``ckpt-<seq>.calmon``)::

    MAGIC (8 bytes) | format version (u32) | payload length (u64) | sha256 (32 bytes) | payload

The payload is a JSON header (the state with every numpy array replaced by a
reference and bytes in base64) followed by an ``.npz`` of the arrays; no
pickle, so a state file never executes code. Each save writes a temp file,
fsyncs it, renames it into place and fsyncs the directory; the two newest good
checkpoints are kept, so a torn or corrupt newest file falls back to the one
before it.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import logging
import os
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from calmon.errors import StateError
from calmon.files import atomic_write

log = logging.getLogger(__name__)

MAGIC = b"CALMONCK"
FORMAT_VERSION = 1
_HEADER = struct.Struct(">8sIQ32s")
_NAME = re.compile(r"^ckpt-(\d{12})\.calmon$")
KEEP = 2


@dataclass(frozen=True)
class Checkpoint:
    seq: int
    state: dict[str, Any]
    positions: dict[tuple[str, int], int]  # (topic, partition) -> next offset
    written_at: float


def encode(obj: dict[str, Any]) -> bytes:
    arrays: list[np.ndarray] = []

    def walk(x: Any) -> Any:
        if isinstance(x, np.ndarray):
            arrays.append(x)
            return {"__nd__": len(arrays) - 1}
        if isinstance(x, bytes | bytearray):
            return {"__b64__": base64.b64encode(bytes(x)).decode("ascii")}
        if isinstance(x, dict):
            return {"__map__": [[walk(k), walk(v)] for k, v in x.items()]}
        if isinstance(x, list | tuple):
            return [walk(v) for v in x]
        if isinstance(x, np.generic):
            return x.item()
        return x

    header = json.dumps(walk(obj), separators=(",", ":")).encode("utf-8")
    buf = io.BytesIO()
    np.savez(buf, *arrays)
    return struct.pack(">Q", len(header)) + header + buf.getvalue()


def decode(payload: bytes) -> dict[str, Any]:
    (n,) = struct.unpack_from(">Q", payload)
    header = json.loads(payload[8:8 + n])
    with np.load(io.BytesIO(payload[8 + n:]), allow_pickle=False) as npz:
        arrays = [npz[f"arr_{i}"] for i in range(len(npz.files))]

    def walk(x: Any) -> Any:
        if isinstance(x, dict):
            if "__nd__" in x:
                return arrays[x["__nd__"]]
            if "__b64__" in x:
                return base64.b64decode(x["__b64__"])
            return {walk(k): walk(v) for k, v in x["__map__"]}
        if isinstance(x, list):
            return [walk(v) for v in x]
        return x

    state: dict[str, Any] = walk(header)
    return state


class CheckpointStore:
    def __init__(self, directory: str | Path) -> None:
        self.dir = Path(directory)
        self.discarded = False  # load() found checkpoints but reset past all of them

    def _files(self) -> list[tuple[int, Path]]:
        if not self.dir.is_dir():
            return []
        out = []
        for p in self.dir.iterdir():
            m = _NAME.match(p.name)
            if m:
                out.append((int(m.group(1)), p))
        return sorted(out)

    def save(self, state: dict[str, Any], positions: dict[tuple[str, int], int],
             written_at: float) -> Path:
        """Write one checkpoint atomically and prune to the newest ``KEEP``.
        Raises OSError when the disk refuses (the caller keeps running and retries)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        files = self._files()
        seq = files[-1][0] + 1 if files else 1
        doc = {"state": state, "written_at": written_at,
               "positions": [[t, p, o] for (t, p), o in sorted(positions.items())]}
        payload = encode(doc)
        blob = _HEADER.pack(MAGIC, FORMAT_VERSION, len(payload),
                            hashlib.sha256(payload).digest()) + payload
        final = self.dir / f"ckpt-{seq:012d}.calmon"
        atomic_write(final, blob)
        for _, old in files[: max(0, len(files) + 1 - KEEP)]:
            old.unlink(missing_ok=True)
        return final

    def load(self, on_corrupt: str = "fail") -> Checkpoint | None:
        """The newest good checkpoint, or None when there is none at all.

        Raises StateError when checkpoints exist but none is readable and
        ``on_corrupt`` is ``fail``; with ``reset`` it logs and returns None.
        """
        for tmp in self.dir.glob(".ckpt-*.tmp") if self.dir.is_dir() else ():
            tmp.unlink(missing_ok=True)  # a write that never reached its rename
        files = self._files()
        problems = []
        bad: list[Path] = []
        for seq, path in reversed(files):
            try:
                ckpt = self._read(seq, path)
            except (OSError, ValueError, KeyError, struct.error) as e:
                problems.append(f"{path.name}: {e}")
                bad.append(path)
                log.error("checkpoint %s is unreadable (%s); trying an older one", path, e)
                continue
            self._set_aside(bad)
            return ckpt
        if not files:
            return None
        msg = (f"no usable checkpoint in {self.dir}: " + "; ".join(problems)
               + " (set state.on_corrupt: reset to start from empty state)")
        if on_corrupt == "reset":
            log.error("%s; starting from empty state as state.on_corrupt is reset", msg)
            self._set_aside(bad)
            self.discarded = True
            return None
        raise StateError(msg)

    @staticmethod
    def _set_aside(paths: list[Path]) -> None:
        """Rename unreadable checkpoints to ``*.corrupt`` (kept for inspection), so
        that the next saves neither count them among the ``KEEP`` newest nor prune
        the good checkpoint the state was restored from in their favour."""
        for path in paths:
            aside = path.with_name(path.name + ".corrupt")
            try:
                os.replace(path, aside)
                log.warning("moved unreadable checkpoint %s to %s", path, aside.name)
            except OSError as e:
                log.error("cannot move unreadable checkpoint %s aside: %s", path, e)

    @staticmethod
    def _read(seq: int, path: Path) -> Checkpoint:
        blob = path.read_bytes()
        if len(blob) < _HEADER.size:
            raise ValueError("truncated header")
        magic, version, length, digest = _HEADER.unpack_from(blob)
        if magic != MAGIC:
            raise ValueError("not a calmon checkpoint")
        if version != FORMAT_VERSION:
            raise ValueError(f"format version {version}, this calmon reads {FORMAT_VERSION}")
        payload = blob[_HEADER.size:]
        if len(payload) != length:
            raise ValueError(f"truncated: {len(payload)} of {length} bytes")
        if hashlib.sha256(payload).digest() != digest:
            raise ValueError("checksum mismatch")
        doc = decode(payload)
        positions = {(t, int(p)): int(o) for t, p, o in doc["positions"]}
        return Checkpoint(seq, doc["state"], positions, float(doc["written_at"]))
