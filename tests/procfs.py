"""What the tests read of a process from /proc (Linux): one place for the format."""

from __future__ import annotations

import os
from pathlib import Path

KIB = 1024


def status(pid: int | str, key: str) -> int:
    """A number of /proc/<pid>/status (``VmHWM``, ``VmRSS``: kB as written;
    ``Threads``: a count). ``pid`` may be ``"self"``."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {key} in /proc/{pid}/status")


def children(pid: int) -> list[int]:
    """The direct children of ``pid`` (every thread's)."""
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        out += [int(c) for c in (task / "children").read_text().split()]
    return out


def start_time(pid: int | str) -> float:
    """When ``pid`` started, in Unix seconds: the boot time of /proc/stat plus field 22
    of /proc/<pid>/stat (clock ticks since boot), as the Prometheus client reads it."""
    btime = next(float(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                 if line.startswith("btime "))
    # the command name (field 2) may hold spaces and parentheses: count after its last ')'
    rest = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return btime + int(rest[19]) / os.sysconf("SC_CLK_TCK")
