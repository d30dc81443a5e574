"""The state directory's lock (one process at a time), the instance shape a
checkpoint records, and the topic settings that only warn."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from calmon.config import Instance
from calmon.errors import StateError
from calmon.io.shape import mismatch, of_checkpoint, of_config
from calmon.io.statelock import LOCK_NAME, StateLock
from calmon.io.topic_checks import warnings_for
from tests.daemon_helpers import subprocess_env

HOLD = """
import sys, time
from calmon.io.statelock import StateLock
with StateLock(sys.argv[1]):
    print("held", flush=True)
    sys.stdin.read()
"""


def test_a_second_process_is_refused_with_the_holders_pid(tmp_path: Path) -> None:
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path / "state")],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        with pytest.raises(StateError, match=f"in use by calmon pid {holder.pid}"):
            StateLock(tmp_path / "state").acquire()
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(10)
    # released with its holder: the next process takes it and writes its own pid
    with StateLock(tmp_path / "state"):
        assert (tmp_path / "state" / LOCK_NAME).read_text() == f"{os.getpid()}\n"


def test_a_killed_holder_leaves_nothing_to_clean(tmp_path: Path) -> None:
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdout.readline() == "held\n"
    holder.kill()
    holder.wait(10)
    with StateLock(tmp_path):
        pass


def test_a_symlinked_lock_file_is_refused_and_its_target_untouched(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    precious = tmp_path / "precious.txt"
    precious.write_bytes(b"not calmon's\n")
    before = precious.stat()
    (state / LOCK_NAME).symlink_to(precious)
    with pytest.raises(StateError, match=r"^state\.dir: the lock file .*calmon\.lock is a "
                       r"symbolic link to .*precious\.txt"):
        StateLock(state).acquire()
    dangling = tmp_path / "other"
    dangling.mkdir()
    (dangling / LOCK_NAME).symlink_to(tmp_path / "absent.txt")  # nothing is created there
    with pytest.raises(StateError, match="is a symbolic link"):
        StateLock(dangling).acquire()
    # the daemon exits 2 with the message before it reads or serves anything
    cfg = tmp_path / "calmon.yml"
    cfg.write_text(f"kafka: {{bootstrap_servers: '127.0.0.1:9'}}\nstate: {{dir: '{state}'}}\n"
                   "server: {port: 0}\n")
    run = subprocess.run([sys.executable, "-m", "calmon", "run", "-c", str(cfg)],
                         capture_output=True, text=True, timeout=120, env=subprocess_env())
    assert run.returncode == 2, run.stderr
    assert "state.dir: the lock file" in run.stderr and "symbolic link" in run.stderr
    assert precious.read_bytes() == b"not calmon's\n"
    assert precious.stat().st_mtime_ns == before.st_mtime_ns
    assert not (tmp_path / "absent.txt").exists()


def test_a_hard_linked_lock_file_is_refused(tmp_path: Path) -> None:
    precious = tmp_path / "precious.txt"
    precious.write_bytes(b"keep\n")
    (tmp_path / "state").mkdir()
    os.link(precious, tmp_path / "state" / LOCK_NAME)
    with pytest.raises(StateError, match="2 hard links"):
        StateLock(tmp_path / "state").acquire()
    assert precious.read_bytes() == b"keep\n"


def test_the_shape_of_a_checkpoint() -> None:
    assert of_checkpoint({"engine": {}}) == {"index": 0, "count": 1}  # before it was kept
    assert of_checkpoint({"instance": {"index": 2, "count": 3}}) == {"index": 2, "count": 3}
    for bad in ({"index": 3, "count": 3}, {"index": 0}, {"index": "0", "count": 1},
                {"index": 0, "count": 0}, [0, 1], {"index": True, "count": 2}):
        with pytest.raises(ValueError):
            of_checkpoint({"instance": bad})
    assert of_config(None) == of_config(Instance(index=0, count=1)) == {"index": 0, "count": 1}
    assert mismatch({"index": 0, "count": 1}, of_config(None), "d") is None
    text = mismatch({"index": 1, "count": 2}, {"index": 1, "count": 3}, "/s")
    assert text is not None and "{index: 1, count: 2}" in text and "count: 3}" in text
    assert "calmon run --rescale" in text


def test_topic_settings_that_warn() -> None:
    week = 7 * 86400.0
    assert warnings_for("labels_topic", "l", {"cleanup.policy": "delete",
                                              "retention.ms": "604800000"}, week) == []
    assert warnings_for("labels_topic", "l", {"retention.ms": "-1"}, week) == []  # forever
    assert warnings_for("labels_topic", "l", {}, week) == []  # the broker said nothing
    [compact] = warnings_for("labels_topic", "l", {"cleanup.policy": "compact, delete"}, week)
    assert compact.startswith("kafka.labels_topic: topic 'l' has cleanup.policy compact")
    [short] = warnings_for("predictions_topic", "p", {"retention.ms": "86400000"}, week)
    assert "keeps records for 24 h" in short and "largest window (168 h)" in short
