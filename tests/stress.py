"""Run a command while other processes keep every core busy, to shake out flaky waits.

    python -m tests.stress [--burners N] [--repeat R] -- COMMAND [ARGS...]

Starts N busy-looping processes (default: one per core), runs COMMAND R times
in a row (default 1; stops at the first failure), then stops the burners and
exits with COMMAND's exit code. The acceptance check of issue 8 is

    python -m tests.stress --repeat 3 -- python -m pytest -q -p no:cacheprovider

Burners are plain ``python -c`` loops that also end on their own when this
process goes away (they watch their parent), so a Ctrl+C or a kill -9 of the
helper never leaves a core spinning.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

# Spins, checking every ~50 ms of work that its parent is still there.
BURNER = """
import os, sys
parent = int(sys.argv[1])
while os.getppid() == parent:
    for _ in range(200_000):
        pass
"""


def start_burners(n: int) -> list[subprocess.Popen[bytes]]:
    return [subprocess.Popen([sys.executable, "-c", BURNER, str(os.getpid())],
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL) for _ in range(n)]


def stop_burners(burners: list[subprocess.Popen[bytes]]) -> None:
    for p in burners:  # by pid, only the processes started here
        if p.poll() is None:
            p.kill()
    for p in burners:
        p.wait(10)


def run(command: list[str], burners: int, repeat: int) -> int:
    procs = start_burners(burners)
    code = 0
    try:
        for i in range(1, repeat + 1):
            started = time.monotonic()
            print(f"[stress] run {i}/{repeat} with {burners} busy processes: "
                  f"{' '.join(command)}", file=sys.stderr, flush=True)
            code = subprocess.call(command)
            print(f"[stress] run {i}/{repeat} exited {code} after "
                  f"{time.monotonic() - started:.0f}s", file=sys.stderr, flush=True)
            if code != 0:
                break
    finally:
        stop_burners(procs)
    return code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.stress", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--burners", type=int, default=os.cpu_count() or 2,
                        help="busy processes to run beside the command (default: one per core)")
    parser.add_argument("--repeat", type=int, default=1,
                        help="run the command this many times in a row (default 1)")
    parser.add_argument("command", nargs=argparse.REMAINDER,
                        help="the command, after --")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given (put it after --)")
    return run(command, max(0, args.burners), max(1, args.repeat))


if __name__ == "__main__":
    sys.exit(main())
