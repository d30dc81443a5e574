"""tests/stress.py: busy processes beside a command, repeated, then gone."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.daemon_helpers import REPO, subprocess_env, wait_until

# The command: print the helper's other children (the burners) and whether they spin.
PROBE = """
import os, time
from pathlib import Path
helper = os.getppid()
kids = set()
for task in os.listdir(f"/proc/{helper}/task"):
    kids |= set(Path(f"/proc/{helper}/task/{task}/children").read_text().split())
kids.discard(str(os.getpid()))
def cpu(pid):
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime, in clock ticks
before = {k: cpu(k) for k in kids}
deadline = time.monotonic() + 30
while time.monotonic() < deadline and not all(cpu(k) > before[k] for k in kids):
    time.sleep(0.05)  # polling interval of a deadline-bounded wait
print(" ".join(sorted(kids)), all(cpu(k) > before[k] for k in kids))
"""


def stress(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tests.stress", *args], cwd=str(REPO),
                          env=subprocess_env(), capture_output=True, text=True, timeout=120)


def test_burners_spin_during_each_run_and_are_gone_after() -> None:
    proc = stress("--burners", "2", "--repeat", "2", "--", sys.executable, "-c", PROBE)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.split("\n")[:2]
    assert len(lines) == 2 and "run 2/2 exited 0" in proc.stderr
    for line in lines:
        *pids, spinning = line.split()
        assert len(pids) == 2 and spinning == "True", line
    pids = lines[0].split()[:2]
    wait_until(lambda: not any(alive(p) for p in pids), 30, "the burners to be gone")


def alive(pid: str) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_stops_at_the_first_failure_with_its_exit_code() -> None:
    proc = stress("--burners", "1", "--repeat", "3", "--", sys.executable, "-c",
                  "raise SystemExit(3)")
    assert proc.returncode == 3
    assert "run 1/3 exited 3" in proc.stderr and "run 2/3" not in proc.stderr
