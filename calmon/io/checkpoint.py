"""Checkpoint store: engine state and consumer positions, written together, atomically.

File format (``ckpt-<seq>.calmon``)::

    MAGIC (8 bytes) | format version (u32) | payload length (u64) | sha256 (32 bytes) | payload

That header is fixed; what changes between versions is the payload. Format 2 (written
now)::

    meta length (u64) | meta: UTF-8 JSON | array data (each array at a multiple of 8)
    meta = {"arrays": [[dtype, shape, offset], ...], "doc": document}
    document = {"state": {"engine": ..., "recal": ..., "instance": {"index", "count"}},
                "written_at": float, "positions": [[topic, partition, offset], ...]}

In the document every numpy array is ``{"__nd__": i}`` (entry i of ``arrays``), bytes
are ``{"__b64__": ...}`` and a dict is ``{"__map__": [[key, value], ...]}`` (keys need
not be strings). Each section of ``state`` belongs to its owner (the engine's bucket
tables are sparse: see ``windows.BucketTables.pack``), so the file grows with the data
held, not with the series allowed. Every array's dtype (plain numbers only), shape and
place are checked against the file before anything is allocated (``_array_specs``),
then the decoded document is checked section by section (``check_document``); no
pickle, so a state file never executes code. Format 1 (JSON header then an ``.npz``,
dense bucket vectors) is still read.

Each save writes a temp file, streamed (the meta JSON a slice of a long list at a time,
each array from its own buffer, the header filled in last from the file read back), so
a write holds no second copy of the state; it fsyncs the file, renames it into place
and fsyncs the directory; the two newest good checkpoints are kept, so a torn or corrupt newest file
falls back to the one before it.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import logging
import math
import os
import re
import struct
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from calmon.errors import StateError
from calmon.files import fsync_dir
from calmon.io.shape import of_checkpoint

log = logging.getLogger(__name__)

MAGIC = b"CALMONCK"
FORMAT_VERSION = 2
READABLE = (1, 2)  # format versions this calmon restores
_HEADER = struct.Struct(">8sIQ32s")
_NAME = re.compile(r"^ckpt-(\d{12})\.calmon$")
KEEP = 2
_ALIGN = 8
# plain numbers only: never object arrays (pickle), never a byte order to guess
_DTYPES = frozenset(np.dtype(t).str for t in (
    "<i8", "<i4", "<i2", "i1", "<u8", "<u4", "<u2", "u1", "<f8", "<f4", "?"))
_MAX_NDIM = 4
_MAX_DEPTH = 64  # nesting of the document; the engine's is under 10
_SLICE = 4096  # list items per json.dumps when the meta is written
_SMALL = 2048  # a part of the meta with fewer items (at any depth) is one json.dumps
_READ = 2**20  # bytes read back at a time for the digest


@dataclass(frozen=True)
class Checkpoint:
    seq: int
    state: dict[str, Any]
    positions: dict[tuple[str, int], int]  # (topic, partition) -> next offset
    written_at: float


def _walk_out(x: Any, arrays: list[np.ndarray]) -> Any:
    """The document to write: arrays replaced by references, dicts by lists of pairs.
    Bytes stay: ``_b64`` turns them into text as the JSON is written, a slice at a time."""
    if isinstance(x, np.ndarray):
        arrays.append(x)
        return {"__nd__": len(arrays) - 1}
    if isinstance(x, dict):
        return {"__map__": [[_walk_out(k, arrays), _walk_out(v, arrays)]
                            for k, v in x.items()]}
    if isinstance(x, list | tuple):
        if all(type(v) in _LEAF for v in x):  # ids, pairs: nothing to replace
            return x
        return [_walk_out(v, arrays) for v in x]
    if isinstance(x, np.generic):
        return x.item()
    return x


_PLAIN = frozenset((str, int, float, bool, type(None)))
_LEAF = _PLAIN | {bytes, bytearray}


def _b64(x: Any) -> Any:
    """``json.dumps``' default: bytes as ``{"__b64__": ...}``."""
    if isinstance(x, bytes | bytearray):
        return {"__b64__": base64.b64encode(bytes(x)).decode("ascii")}
    raise TypeError(f"a checkpoint holds no {type(x).__name__}")


def _walk_in(x: Any, arrays: list[np.ndarray], used: set[int] | None = None,
             depth: int = 0) -> Any:
    """The document with its arrays and bytes put back. Each array is used once: a
    document naming one array a million times would make restore copy it as often."""
    if depth > _MAX_DEPTH:
        raise ValueError(f"document nested deeper than {_MAX_DEPTH}")
    used = set() if used is None else used
    if isinstance(x, dict):
        if "__nd__" in x:
            i = x["__nd__"]
            if type(i) is not int or not 0 <= i < len(arrays) or i in used:
                raise ValueError(f"array reference {i!r}: unknown or used twice")
            used.add(i)
            return arrays[i]
        if "__b64__" in x:
            if not isinstance(x["__b64__"], str):
                raise ValueError("bytes: not base64 text")
            return base64.b64decode(x["__b64__"], validate=True)
        return {_key(_walk_in(k, arrays, used, depth + 1)): _walk_in(v, arrays, used, depth + 1)
                for k, v in x["__map__"]}
    if isinstance(x, list):
        if all(type(v) in _PLAIN for v in x):
            return x
        return [_walk_in(v, arrays, used, depth + 1) for v in x]
    return x


def _key(k: Any) -> Any:
    """A dict key back as written: a tuple comes back from JSON as a list."""
    return tuple(_key(v) for v in k) if isinstance(k, list) else k


def encode(obj: dict[str, Any]) -> bytes:
    """A payload of the current format (``FORMAT_VERSION``)."""
    buf = io.BytesIO()
    _write_payload(buf, obj)
    return buf.getvalue()


def _write_payload(f: BinaryIO, obj: dict[str, Any]) -> None:
    """Write ``obj``'s payload at ``f``'s position, streamed: the meta JSON in pieces and
    each array from its own buffer, so the write holds no second copy of the state. The
    meta's length, first in the payload, is filled in once the meta is written."""
    arrays: list[np.ndarray] = []
    doc = _walk_out(obj, arrays)
    specs = []
    offset = 0
    for a in arrays:
        specs.append([_dtype(a).str, list(a.shape), offset])
        offset += a.nbytes + -a.nbytes % _ALIGN
    start = f.tell()
    f.write(b"\0" * 8)
    n = 0
    for piece in _json_pieces({"arrays": specs, "doc": doc}):
        n += f.write(piece.encode("ascii"))  # json escapes all but ASCII
    n += f.write(b" " * (-(8 + n) % _ALIGN))  # the data starts aligned
    for a in arrays:
        a = np.ascontiguousarray(a, _dtype(a))  # a copy only where it is not plain already
        if a.size:
            f.write(a.reshape(-1).data.cast("B"))
        f.write(b"\0" * (-a.nbytes % _ALIGN))
    end = f.tell()
    f.seek(start)
    f.write(struct.pack(">Q", n))
    f.seek(end)


def _dtype(a: np.ndarray) -> np.dtype[Any]:
    """The dtype ``a`` is written as: its own, little-endian, a plain one."""
    dtype = a.dtype if a.dtype.str in _DTYPES else a.dtype.newbyteorder("<")
    if dtype.str not in _DTYPES:
        raise TypeError(f"a checkpoint holds plain numeric arrays, not {a.dtype}")
    return dtype


def _small(x: Any, budget: int = _SMALL) -> int:
    """What is left of ``budget`` after counting ``x``'s items (below 0: too many to
    write as one string)."""
    if isinstance(x, dict):
        budget -= len(x)
        for v in x.values():
            if budget < 0:
                break
            budget = _small(v, budget)
    elif isinstance(x, list | tuple):
        budget -= len(x)
        for v in x:
            if budget < 0:
                break
            if isinstance(v, dict | list | tuple):
                budget = _small(v, budget)
    elif isinstance(x, bytes | bytearray):
        budget -= len(x) // 64
    return budget


def _json_pieces(x: Any) -> Iterator[str]:
    """``json.dumps(x)`` (compact, ASCII) in pieces: long lists (ids, waiting labels) a
    slice at a time, so the meta is never one string; a small part at once (a piece per
    item costs more than the item)."""
    if isinstance(x, dict | list) and _small(x) >= 0:
        yield _dumps(x)
    elif isinstance(x, dict):
        yield "{"
        for i, (k, v) in enumerate(x.items()):
            yield ("," if i else "") + json.dumps(k) + ":"
            yield from _json_pieces(v)
        yield "}"
    elif isinstance(x, list) and len(x) > _SLICE:
        yield "["
        for i in range(0, len(x), _SLICE):
            yield ("," if i else "") + _dumps(x[i:i + _SLICE])[1:-1]
        yield "]"
    elif isinstance(x, list) and not all(type(v) in _LEAF for v in x):
        yield "["
        for i, v in enumerate(x):
            if i:
                yield ","
            yield from _json_pieces(v)
        yield "]"
    else:
        yield _dumps(x)


def _dumps(x: Any) -> str:
    return json.dumps(x, separators=(",", ":"), default=_b64)


def _array_specs(specs: Any, data_len: int) -> list[tuple[np.dtype[Any], tuple[int, ...], int]]:
    """Every array's (dtype, shape, offset), checked against the data block before any
    array is allocated: a known plain dtype, a small number of non-negative dimensions,
    and bytes that lie inside the file without overlapping the previous array's."""
    if not isinstance(specs, list):
        raise ValueError("arrays: not a list")
    out = []
    end = 0
    for i, spec in enumerate(specs):
        if not (isinstance(spec, list) and len(spec) == 3 and isinstance(spec[0], str)
                and isinstance(spec[1], list) and type(spec[2]) is int):
            raise ValueError(f"arrays[{i}]: not [dtype, shape, offset]")
        dtype_s, shape, offset = spec
        if dtype_s not in _DTYPES:
            raise ValueError(f"arrays[{i}]: dtype {dtype_s!r} is not allowed")
        if len(shape) > _MAX_NDIM or not all(type(d) is int and d >= 0 for d in shape):
            raise ValueError(f"arrays[{i}]: bad shape {shape!r}")
        dtype = np.dtype(dtype_s)
        nbytes = math.prod(shape) * dtype.itemsize  # Python ints: no overflow
        if offset < end or offset % _ALIGN or offset + nbytes > data_len:
            raise ValueError(f"arrays[{i}]: {nbytes} bytes at {offset} do not fit the file")
        end = offset + nbytes
        out.append((dtype, tuple(shape), offset))
    return out


def _decode_v2(payload: bytes) -> dict[str, Any]:
    (n,) = struct.unpack_from(">Q", payload)
    if 8 + n > len(payload):
        raise ValueError("meta runs past the payload")
    meta = json.loads(payload[8:8 + n])
    if not isinstance(meta, dict) or "doc" not in meta:
        raise ValueError("meta: not an object with a doc")
    data = memoryview(payload)[8 + n:]
    arrays = [np.frombuffer(data, dtype, math.prod(shape), offset).reshape(shape).copy()
              for dtype, shape, offset in _array_specs(meta.get("arrays"), len(data))]
    state: dict[str, Any] = _walk_in(meta["doc"], arrays)
    return state


def _decode_v1(payload: bytes) -> dict[str, Any]:
    """Format 1: a JSON header, then an ``.npz`` of the arrays (``np.savez``: members
    stored, not compressed). Read member by member with every size checked first, so
    a deflate bomb or an ``.npy`` header claiming a terabyte allocates nothing."""
    (n,) = struct.unpack_from(">Q", payload)
    if 8 + n > len(payload):
        raise ValueError("header runs past the payload")
    header = json.loads(payload[8:8 + n])
    blob = payload[8 + n:]
    try:
        with zipfile.ZipFile(io.BytesIO(blob)) as npz:
            infos = {i.filename: i for i in npz.infolist()}
            arrays = []
            for i in range(len(infos)):
                info = infos.get(f"arr_{i}.npy")
                if info is None:
                    raise ValueError(f"npz: no arr_{i}.npy")
                if info.compress_type != zipfile.ZIP_STORED or info.file_size > len(blob):
                    raise ValueError(f"npz: arr_{i}.npy is compressed or larger than the file")
                arrays.append(_npy(npz.read(info)))
    except zipfile.BadZipFile as e:
        raise ValueError(f"npz: {e}") from None
    state: dict[str, Any] = _walk_in(header, arrays)
    return state


def _npy(data: bytes) -> np.ndarray:
    """One ``.npy`` member: its header checked against its bytes before the array."""
    f = io.BytesIO(data)
    version = np.lib.format.read_magic(f)
    read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                   else np.lib.format.read_array_header_2_0)
    shape, fortran, dtype = read_header(f)
    if dtype.hasobject or dtype.itemsize == 0 or len(shape) > _MAX_NDIM:
        raise ValueError(f"npy: dtype {dtype} or shape {shape} is not allowed")
    count = math.prod(shape)
    if count * dtype.itemsize != len(data) - f.tell():
        raise ValueError(f"npy: shape {shape} does not match {len(data) - f.tell()} bytes")
    flat = np.frombuffer(data, dtype, count, f.tell())
    return flat.reshape(shape, order="F" if fortran else "C").copy()


def decode(payload: bytes, version: int = FORMAT_VERSION) -> dict[str, Any]:
    """The object ``encode`` wrote (in format ``version``). Raises ValueError for
    anything malformed."""
    if version not in READABLE:
        raise ValueError(f"format version {version}, this calmon reads {READABLE}")
    try:
        return _decode_v1(payload) if version == 1 else _decode_v2(payload)
    except ValueError:
        raise
    except (TypeError, KeyError, IndexError, AttributeError, RecursionError,
            struct.error, OSError, OverflowError, MemoryError, EOFError,
            zipfile.LargeZipFile) as e:  # malformed structure, whatever its depth
        raise ValueError(f"malformed payload: {type(e).__name__}: {e}") from e


def check_document(doc: Any) -> None:
    """The decoded document's own shape, before anything restores from it: the place
    where each section's schema and sizes are checked. Raises ValueError."""
    if not isinstance(doc, dict):
        raise ValueError("document: not a map")
    if not isinstance(doc.get("state"), dict):
        raise ValueError("state: not a map")
    written_at = doc.get("written_at")
    if type(written_at) not in (int, float):
        raise ValueError("written_at: not a number")
    positions = doc.get("positions")
    if not isinstance(positions, list) or not all(
            isinstance(p, list) and len(p) == 3 and isinstance(p[0], str)
            and type(p[1]) is int and type(p[2]) is int for p in positions):
        raise ValueError("positions: not a list of [topic, partition, offset]")
    of_checkpoint(doc["state"])  # the instance section, when there is one


def _write_file(path: Path, doc: dict[str, Any]) -> None:
    """``path`` whole or not at all (a temp file, fsynced, renamed; ``files.atomic_write``
    for a file written in pieces): the header first as a placeholder, the payload
    streamed, then the payload read back for its digest and the header filled in."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w+b") as f:
            f.write(b"\0" * _HEADER.size)
            _write_payload(f, doc)
            length = f.tell() - _HEADER.size
            f.seek(_HEADER.size)
            digest = hashlib.sha256()
            while chunk := f.read(_READ):
                digest.update(chunk)
            f.seek(0)
            f.write(_HEADER.pack(MAGIC, FORMAT_VERSION, length, digest.digest()))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    fsync_dir(path.parent)


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
        final = self.dir / f"ckpt-{seq:012d}.calmon"
        _write_file(final, doc)
        for _, old in files[: max(0, len(files) + 1 - KEEP)]:
            old.unlink(missing_ok=True)
        return final

    def load(self, on_corrupt: str = "fail",
             use: Callable[[Checkpoint], None] | None = None) -> Checkpoint | None:
        """The newest good checkpoint, or None when there is none at all.

        ``use`` (restoring the state from it) is part of "good": a checkpoint that
        reads but that ``use`` raises on (a checksum-valid file with hostile content)
        is corrupt like an unreadable one, and an older one is tried. ``use`` must
        leave nothing half-restored when it raises; a StateError from it is not about
        the file and propagates.

        Raises StateError when checkpoints exist but none is usable and
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
                if use is not None:
                    use(ckpt)
            except StateError:
                raise
            except Exception as e:  # OSError, ValueError, ... or a restore that raised
                what = f"{type(e).__name__}: {e}" if not isinstance(e, ValueError) else str(e)
                problems.append(f"{path.name}: {what}")
                bad.append(path)
                log.error("checkpoint %s is unusable (%s); trying an older one", path, what)
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

    def peek(self) -> Checkpoint | None:
        """The newest checkpoint that reads, touching nothing (no temp file removed,
        nothing set aside): what ``check-config --probe`` says a run would restore."""
        for seq, path in reversed(self._files()):
            try:
                return self._read(seq, path)
            except Exception:  # unusable: a run would try the older one too
                continue
        return None

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
        if version not in READABLE:
            raise ValueError(f"format version {version}, this calmon reads {READABLE}")
        payload = blob[_HEADER.size:]
        if len(payload) != length:
            raise ValueError(f"truncated: {len(payload)} of {length} bytes")
        if hashlib.sha256(payload).digest() != digest:
            raise ValueError("checksum mismatch")
        doc = decode(payload, version)
        check_document(doc)
        positions = {(t, int(p)): int(o) for t, p, o in doc["positions"]}
        return Checkpoint(seq, doc["state"], positions, float(doc["written_at"]))
