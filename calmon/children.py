"""Child processes calmon starts (the demo's broker, the Kafka consumer)."""

from __future__ import annotations

import signal


def die_with_parent() -> None:
    """In the child: ask Linux to SIGKILL it when its parent dies (PR_SET_PDEATHSIG), so
    even a hard exit of calmon leaves nothing behind. Elsewhere a no-op: the normal stop
    paths still apply. The signal follows the parent *thread* that started the child."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)
    except OSError:
        pass
