"""One process per state directory: an exclusive ``flock`` on ``state.dir/calmon.lock``.

Two daemons on one state directory would each read every partition (every sample
counted twice) and interleave their checkpoints. The lock is the kernel's: it is
released when the holder exits, however it exits (``kill -9`` included), so a
stale lock file never blocks a restart. The file holds the holder's pid, for the
message the second process exits with; it is never deleted (deleting it would let
a third process lock a new file while the second still holds the old one).

The file is opened with ``O_NOFOLLOW`` and must be a regular file with one link: a
``calmon.lock`` that is a symbolic link (or a hard link, a FIFO, a device) is
refused, and what it points at is never opened for writing, truncated or written,
since whoever can write the state directory could otherwise make calmon overwrite
any file the daemon may write with its pid.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
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
        fd = self._open()
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

    def _open(self) -> int:
        """The lock file, created if need be; never through a link (module docstring)."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # O_NOFOLLOW: a symbolic link fails (ELOOP) instead of being followed;
            # O_NONBLOCK: a FIFO put there cannot hang the open (unset below)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK
                         | os.O_CLOEXEC, 0o644)  # O_CLOEXEC: not inherited by children
        except OSError as e:
            if os.path.islink(self.path):
                raise StateError(self._not_a_file("a symbolic link to "
                                                  f"{os.readlink(self.path)}")) from None
            raise StateError(f"state.dir: cannot create the lock file {self.path}: "
                             f"{e.strerror}") from None
        st = os.fstat(fd)
        what = (None if stat.S_ISREG(st.st_mode) and st.st_nlink == 1 else
                f"a file with {st.st_nlink} hard links" if stat.S_ISREG(st.st_mode) else
                "not a regular file")
        if what is not None:
            os.close(fd)
            raise StateError(self._not_a_file(what))
        os.set_blocking(fd, True)
        return fd

    def _not_a_file(self, what: str) -> str:
        return (f"state.dir: the lock file {self.path} is {what}; calmon writes its pid "
                "there and never through a link: remove it (calmon creates it again)")

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
