"""One process per state directory: an exclusive ``flock`` on ``state.dir/calmon.lock``.

Two daemons on one state directory would each read every partition (every sample
counted twice) and interleave their checkpoints. The lock is the kernel's: it is
released when the holder exits, however it exits (``kill -9`` included), so a
stale lock file never blocks a restart. The file holds the holder's pid, for the
message the second process exits with; it is never deleted (deleting it would let
a third process lock a new file while the second still holds the old one).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path
from types import TracebackType

from calmon.errors import StateError

LOCK_NAME = "calmon.lock"


class StateLock:
    """``with StateLock(dir):`` holds ``dir`` for this process or raises StateError."""

    def __init__(self, directory: str | Path) -> None:
        self.path = Path(directory) / LOCK_NAME
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock at once, never wait. Raises StateError naming the holder's pid
        when another process holds it, or when the directory cannot be used."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)  # not inherited by children
        except OSError as e:
            raise StateError(f"state.dir: cannot create the lock file {self.path}: "
                             f"{e.strerror}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = _read_pid(fd)
            os.close(fd)
            who = f"pid {holder}" if holder else "another process"
            raise StateError(
                f"state.dir: {self.path.parent} is in use by calmon {who} (lock {self.path}); "
                "one process per state directory: give each instance its own state.dir"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def __enter__(self) -> StateLock:
        self.acquire()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.release()


def _read_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
        return int(text) if text.isdigit() else None
    except OSError:
        return None
