"""Durable file writes, one way for everything calmon keeps on disk (checkpoints,
calibrator documents): write a temporary file beside the target, fsync it, then
put it in place, so a reader never sees half a file, even after a crash."""

from __future__ import annotations

import os
from pathlib import Path


def _write_tmp(tmp: Path, data: bytes) -> None:
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def fsync_dir(path: Path) -> None:
    """Make a rename in ``path`` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data``, whole or not at all."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        _write_tmp(tmp, data)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    fsync_dir(path.parent)


def write_new(path: Path, data: bytes) -> bool:
    """Write ``path`` whole or not at all, and only if it does not exist yet (``link``
    refuses to replace), so two writers never share a name. False if it existed."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        _write_tmp(tmp, data)
        os.link(tmp, path)
    except FileExistsError:
        return False
    finally:
        tmp.unlink(missing_ok=True)
    fsync_dir(path.parent)
    return True
