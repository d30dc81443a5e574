"""`calmon --version`, and `logging.format: json`: every line one JSON object, secrets masked."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

from tests.daemon_helpers import wait_until

REPO = Path(__file__).resolve().parents[2]
SECRET = "hunter2-very-secret"
KEYS = {"ts", "level", "logger", "message"}


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CALMON_")}
    env["PYTHONPATH"] = str(REPO)
    env.update(extra)
    return env


def _json_lines(text: str) -> list[dict]:
    lines = [line for line in text.splitlines() if line.strip()]
    out = []
    for line in lines:
        obj = json.loads(line)  # raises on any line that is not one JSON object
        assert isinstance(obj, dict) and obj.keys() >= KEYS, line
        out.append(obj)
    return out


def test_version_prints_the_package_version() -> None:
    proc = subprocess.run([sys.executable, "-m", "calmon", "--version"], capture_output=True,
                          text=True, env=_env(), timeout=60, cwd=REPO)
    assert proc.returncode == 0
    assert proc.stdout.strip() == f"calmon {version('calmon')}"


def test_json_logs_cover_warnings_children_and_crashes(tmp_path: Path) -> None:
    code = f"""
import logging, multiprocessing as mp, warnings
from calmon import logs, secrets
from calmon.config import LoggingConfig

def child():
    logs.setup_child(logging.INFO)
    logging.getLogger("calmon.child").info("from the child")

if __name__ == "__main__":
    logs.setup(LoggingConfig(level="info", format="json"))
    secrets.register({SECRET!r})
    logging.getLogger("calmon.x").warning("line one\\nforged line with %s", {SECRET!r})
    logging.getLogger("calmon.x").debug("below the level")
    warnings.warn("a library warning")
    p = mp.get_context("spawn").Process(target=child); p.start(); p.join()
    raise RuntimeError("boom " + {SECRET!r})
"""
    script = tmp_path / "logme.py"  # a file: a spawned child imports its target from it
    script.write_text(code, encoding="utf-8")
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          env=_env(), timeout=60, cwd=REPO)
    assert proc.returncode == 1 and proc.stdout == ""
    lines = _json_lines(proc.stderr)
    assert SECRET not in proc.stderr
    messages = [x["message"] for x in lines]
    assert any(m.startswith("line one\nforged line") for m in messages)  # one record, one line
    assert not any("below the level" in m for m in messages)
    assert any("a library warning" in m for m in messages)
    assert any(x["logger"] == "calmon.child" and x["message"] == "from the child" for x in lines)
    crash = [x for x in lines if x["level"] == "critical"]
    assert crash and "RuntimeError: boom ***" in crash[0]["exc"]


def test_calmon_log_level_overrides_the_config() -> None:
    code = """
import logging
from calmon import logs
from calmon.config import LoggingConfig
logs.setup(LoggingConfig(level="info", format="json"))
logging.getLogger("calmon.x").debug("debug shows")
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=_env(CALMON_LOG_LEVEL="debug"), timeout=60, cwd=REPO)
    assert [x["message"] for x in _json_lines(proc.stderr)] == ["debug shows"]


def test_the_daemon_logs_json_only(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"""
kafka: {{bootstrap_servers: "127.0.0.1:1", client: {{sasl_plain_password: "{SECRET}"}}}}
logging: {{format: json}}
state: {{dir: {tmp_path / 'state'}}}
recalibration: {{output_dir: {tmp_path / 'cal'}}}
server: {{host: 127.0.0.1, port: 0}}
""", encoding="utf-8")
    err = tmp_path / "err.txt"
    with err.open("w") as f:
        proc = subprocess.Popen([sys.executable, "-m", "calmon", "run", "-c", str(cfg)],
                                stdout=subprocess.PIPE, stderr=f, text=True, env=_env(),
                                cwd=tmp_path)
        try:
            wait_until(lambda: "cannot assign partitions" in err.read_text()
                       or proc.poll() is not None, 120, "the daemon's retry line",
                       interval=0.2, detail=err.read_text)
            proc.send_signal(signal.SIGTERM)
            out, _ = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
    assert proc.returncode == 0 and out == ""
    lines = _json_lines(err.read_text())
    assert SECRET not in err.read_text()
    assert {x["logger"] for x in lines} >= {"calmon.daemon"}
    assert lines[-1]["message"] == "stopped cleanly"
