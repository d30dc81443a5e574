"""Child processes calmon starts (the demo's broker, the Kafka consumer)."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path


def die_with_parent() -> None:
    """In the child: ask Linux to SIGKILL it when its parent dies (PR_SET_PDEATHSIG), so
    even a hard exit of calmon leaves nothing behind. Elsewhere a no-op: the normal stop
    paths still apply. The signal follows the parent *thread* that started the child."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)
    except OSError:
        pass


def stop(proc: subprocess.Popen[bytes] | None, grace: float, reap: float = 10.0) -> None:
    """SIGTERM (a controlled shutdown), SIGKILL past ``grace`` seconds; then wait up to
    ``reap`` seconds for the exit. A process already gone (or None) is left as it is."""
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        kill(proc, reap)


def kill(proc: subprocess.Popen[bytes] | None, reap: float = 10.0) -> None:
    """SIGKILL (a crash), and wait up to ``reap`` seconds for the exit."""
    if proc is not None and proc.poll() is None:
        proc.kill()
        proc.wait(reap)


def log_tail(path: Path, lines: int) -> str:
    """The last ``lines`` lines of a child's log file, or ``(no log)``."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
