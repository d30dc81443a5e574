"""A newcomer's first hour, scripted as the README tells it: the demo, then the sample
records on topics of their own, first with the mapping a newcomer writes (the labels'
id left to ``fields.id``), then with the fix the hints name.

``run`` drives real processes (the demo until its first publish, then Ctrl+C; the
embedded broker; ``calmon run``) through
the same commands the README shows and asserts what each must say; every command
and what it printed go into a transcript. ``tests/integration/test_newcomer.py`` runs
it on this checkout, and in a fresh virtualenv with calmon installed from a wheel.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tests.daemon_helpers import http_get, wait_until

DEMO_S = 150  # deadline for the demo's first publish (~20 s in on an idle machine)
INSTALL = ["python", "-m", "pip", "install", ".[demo]"]  # the README's install command
# the README's "Try it on your own topics" commands, as the script runs them
SAMPLES = ["python", "-m", "calmon.samples", "try"]
LOAD = ["--load", "ranker.predictions=try/predictions.jsonl@meta.request_id",
        "--load", "ranker.outcomes=try/labels.jsonl@request_id"]
BROKER = ["python", "-m", "calmon.demo.broker", *LOAD]
FILES = ["--predictions", "try/predictions.jsonl", "--labels", "try/labels.jsonl"]


class Transcript:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.lines: list[str] = []

    def add(self, cmd: Sequence[str], rc: int | None, out: str, keep: int = 40) -> None:
        shown = out.rstrip("\n").splitlines()
        if len(shown) > keep:  # the head and tail of a long output
            shown = [*shown[:keep // 2], f"... ({len(shown) - keep} lines)", *shown[-keep // 2:]]
        self.lines += [f"$ {' '.join(cmd)}", *shown, f"[exit {rc}]", ""]
        self.path.write_text("\n".join(self.lines), encoding="utf-8")


def _run(t: Transcript, cmd: list[str], shown: list[str], cwd: Path, env: dict[str, str],
         timeout: float = 300.0) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(cmd, cwd=str(cwd), env=env, capture_output=True, text=True,
                          timeout=timeout)
    t.add(shown, proc.returncode, proc.stdout + proc.stderr)
    return proc


class Background:
    """A long-running command whose output is read from a file."""

    def __init__(self, t: Transcript, cmd: list[str], shown: list[str], cwd: Path,
                 env: dict[str, str], log: Path) -> None:
        self.t, self.shown, self.log = t, shown, log
        with log.open("wb") as out:
            self.proc = subprocess.Popen(cmd, cwd=str(cwd), env=env, stdin=subprocess.DEVNULL,
                                         stdout=out, stderr=subprocess.STDOUT)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for(self, text: str, timeout: float) -> None:
        def seen() -> bool:
            assert self.proc.poll() is None, f"exited {self.proc.returncode}:\n{self.output()}"
            return text in self.output()

        wait_until(seen, timeout, f"{text!r} from {self.shown[0]}", detail=self.output)

    def stop(self, sig: int, timeout: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait(10)
        self.t.add([*self.shown, f"  (then {signal.Signals(sig).name})"], rc, self.output())
        return rc


def _mapping(sample: str, bootstrap: str, port: int, fixed: bool) -> str:
    """The sample config pointed at this broker and port; without ``fixed``, as the
    newcomer writes it first: the labels' own id path left out."""
    text = sample.replace("localhost:9092", bootstrap).replace("port: 9108", f"port: {port}")
    if not fixed:
        text = "\n".join(line for line in text.splitlines()
                         if not line.lstrip().startswith(("labels:", "id: request_id")))
    return text


def run(calmon: list[str], python: str, cwd: Path, env: dict[str, str],
        ports: tuple[int, int, int], transcript: Path) -> Transcript:
    """``calmon``: how to invoke the CLI (a console script, or python -m calmon)."""
    t = Transcript(transcript)
    demo_port, broker_port, run_port = ports
    # -- 1. the demo, until its first calibrator is published, then Ctrl+C
    demo = Background(t, [*calmon, "demo", "--port", str(demo_port)], ["calmon", "demo"], cwd,
                      env, cwd / "demo.out")
    try:
        demo.wait_for(": refit published: v1", DEMO_S)
    finally:
        assert demo.stop(signal.SIGINT, timeout=60) == 0, demo.output()
    said = demo.output()
    assert "calmon demo: broker" in said and "calmon demo: stopped." in said, said
    assert "  ctr     joined" in said and "what became of each drift alarm" in said, said
    # -- 2. the sample records
    proc = _run(t, [python, *SAMPLES[1:]], SAMPLES, cwd, env)
    assert proc.returncode == 0 and (cwd / "try" / "labels.jsonl").is_file(), proc.stderr
    sample = (cwd / "try" / "config.yaml").read_text(encoding="utf-8")
    mine = cwd / "try" / "mine.yaml"
    bootstrap = f"127.0.0.1:{broker_port}"
    mine.write_text(_mapping(sample, bootstrap, run_port, fixed=False), encoding="utf-8")
    t.lines += ["# try/mine.yaml: the sample config without its fields.labels (the newcomer's "
                "first mapping)", ""]
    files = [*FILES, "-c", "try/mine.yaml"]
    proc = _run(t, [*calmon, "replay", *files], ["calmon", "replay", *files], cwd, env)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "labels: 313 invalid (missing_id)" in proc.stderr
    assert "set fields.labels.id" in proc.stderr, proc.stderr
    # -- 3. the embedded broker with the sample topics
    broker = Background(t, [python, *BROKER[1:3], "--port", str(broker_port), *LOAD],
                        BROKER, cwd, env, cwd / "broker.out")
    try:
        broker.wait_for("calmon broker: ready", 60)
        probe = ["check-config", "-c", "try/mine.yaml", "--probe"]
        proc = _run(t, [*calmon, *probe], ["calmon", *probe], cwd, env)
        assert proc.returncode == 1, proc.stdout
        assert "# FAIL labels topic 'ranker.outcomes': 0 of 100 sampled records" in proc.stdout
        assert "set fields.labels.id" in proc.stdout and "as the daemon reads" in proc.stdout
        assert "(kafka.auto_offset_reset: earliest)" in proc.stdout, proc.stdout
        ahead = re.findall(r"(ranker\.\w+)/\d+: offset 0 \(kafka.auto_offset_reset: earliest\), "
                           r"(\d+) of (\d+) records ahead", proc.stdout)
        totals = {t: sum(int(n) for topic, n, _ in ahead if topic == t) for t, _, _ in ahead}
        assert totals == {"ranker.predictions": 2400, "ranker.outcomes": 313}, ahead
        # -- 4. the fix the hint named
        mine.write_text(_mapping(sample, bootstrap, run_port, fixed=True), encoding="utf-8")
        t.lines += ["# try/mine.yaml: fields.labels.id: request_id added, as the hint says", ""]
        proc = _run(t, [*calmon, *probe], ["calmon", *probe], cwd, env)
        assert proc.returncode == 0, proc.stdout
        assert "labels topic 'ranker.outcomes': 100 of 100 sampled records parse" in proc.stdout
        proc = _run(t, [*calmon, "replay", *files, "--recalibrate"],
                    ["calmon", "replay", *files, "--recalibrate"], cwd, env)
        assert proc.returncode == 0 and " published " in proc.stdout, proc.stdout + proc.stderr
        daemon = Background(t, [*calmon, "run", "-c", "try/mine.yaml"],
                            ["calmon", "run", "-c", "try/mine.yaml"], cwd, env, cwd / "run.out")
        try:
            def joined() -> dict[str, Any] | None:
                assert daemon.proc.poll() is None, daemon.output()
                code, body = http_get(run_port, "/status", timeout=2.0)
                if code != 200:
                    return None
                st = json.loads(body)
                return st if st["counters"].get("predictions") == 2400 else None

            st = wait_until(joined, 120, "calmon run read the sample topics",
                            detail=daemon.output)
            t.lines += ["$ curl -s localhost:PORT/status   # counters",
                        json.dumps(st["counters"]), ""]
            assert st["counters"]["invalid"] == 0 and st["counters"]["labels"] == 313, st
        finally:
            assert daemon.stop(signal.SIGTERM) == 0, daemon.output()
    finally:
        assert broker.stop(signal.SIGINT) == 0, broker.output()
    return t
