"""Exactly-once state across ``kill -9``: the daemon is SIGKILLed at random moments
while it consumes, restarted on the same state dir, and its final window gauges
and /status counters must equal an uninterrupted run over the same records
(``calmon replay --json``) exactly. Checkpoint files torn or corrupted by a crash
fall back to the previous good one; all corrupt fails clearly or, with
``state.on_corrupt: reset``, starts empty.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from calmon.errors import StateError
from calmon.io.checkpoint import CheckpointStore
from tests.daemon_helpers import (
    COUNTER_KEYS,
    CalmonDaemon,
    Producer,
    assert_gauges_match_replay,
    end_positions,
    interleave,
    make_dataset,
    replay_json,
    run_calmon,
    wait_until,
    write_config,
    write_jsonl,
)

pytestmark = pytest.mark.integration

N = 1500


def consumed(daemon: CalmonDaemon) -> int:
    c = daemon.counters()
    return c["predictions"] + c["labels"]


def test_kill_9_at_random_moments_equals_an_uninterrupted_run(
    kafka_bootstrap: str, kafka_topics: Callable[..., list[str]], tmp_path: Path
) -> None:
    """Three rounds of: produce a part and wait until a checkpoint covers it; then
    produce more in small chunks from a thread and SIGKILL the daemon once a random
    number of those has been counted (so it dies mid-stream, with counted records
    that no checkpoint holds yet); restart on the same state dir."""
    preds_topic, labels_topic = kafka_topics(count=2, partitions=4)
    cfg = write_config(tmp_path / "calmon.yaml", kafka_bootstrap, preds_topic, labels_topic)
    preds, labels = make_dataset(N, seed=21)
    records = interleave(preds, labels, preds_topic, labels_topic, seed=22)
    rng = np.random.default_rng(23)
    cuts = np.sort(rng.choice(np.arange(100, len(records) - 100), 6, replace=False)).tolist()
    parts = np.split(np.arange(len(records)), cuts)  # 7 parts: (settled, streamed) x 3 + rest

    sent: list[Any] = []
    failure: list[BaseException] = []

    def produce(idx: np.ndarray, chunk: int) -> None:
        try:
            with Producer(kafka_bootstrap) as producer:
                for i in range(0, len(idx), chunk):
                    sent.extend(producer.send([records[j] for j in idx[i:i + chunk]]))
        except BaseException as exc:  # reported by the main thread
            failure.append(exc)

    daemon = CalmonDaemon(cfg)
    killed_at = []
    with daemon.start():
        for k in range(3):
            settled, streamed = parts[2 * k], parts[2 * k + 1]
            produce(settled, 500)
            assert not failure, failure
            daemon.wait_counters({"predictions": 0})  # alive
            target = len(sent)
            wait_until(lambda t=target: consumed(daemon) >= t, 60,
                       f"{target} records counted", detail=daemon.log_tail)
            daemon.wait_checkpoint_of(end_positions(sent), "a checkpoint covering them")
            # now stream the next part and kill at a random point inside it
            threshold = target + int(rng.integers(1, len(streamed)))
            thread = threading.Thread(target=produce, args=(streamed, 25), daemon=True)
            thread.start()
            wait_until(lambda t=threshold: consumed(daemon) >= t, 60,
                       f"{threshold} records counted", detail=daemon.log_tail)
            assert daemon.kill() == -signal.SIGKILL
            killed_at.append(threshold)
            thread.join(60)
            assert not thread.is_alive() and not failure, failure
            daemon.start()  # same config, same state dir; waits for /readyz
        produce(parts[6], 500)
        assert not failure, failure
        assert len(sent) == len(records)
        daemon.wait_positions(end_positions(sent))
        sc = daemon.scrape()
        st = daemon.status()
    assert daemon.starts == 4
    # every restart resumed from a checkpoint (written after the settled part)
    assert daemon.log.read_text().count("restored checkpoint") == 3

    replay = replay_json(cfg, write_jsonl(tmp_path / "p.jsonl", preds),
                         write_jsonl(tmp_path / "l.jsonl", labels))
    want = {"predictions": N, "labels": N, "joined": N, "invalid": 0, "expired": 0,
            "duplicates": 0}
    assert replay["counters"] == want
    assert {k: st["counters"][k] for k in COUNTER_KEYS} == want, killed_at
    assert st["pending"] == 0 and st["pending_labels"] == 0
    # "exactly": the same numbers, not just close ones
    assert_gauges_match_replay(sc, replay, tol=0.0)


def test_corrupt_newest_checkpoint_falls_back_and_rereads_exactly(
    kafka_bootstrap: str, kafka_topics: Callable[..., list[str]], tmp_path: Path
) -> None:
    """A newest checkpoint lost to corruption falls back to the previous one, and
    the records after that one's offsets are read again: here the previous
    checkpoint predates every record, while the group's committed offsets (written
    with the lost checkpoint) point past them all."""
    preds_topic, labels_topic = kafka_topics(count=2, partitions=4)
    # only the shutdown checkpoints count here
    cfg = write_config(tmp_path / "calmon.yaml", kafka_bootstrap, preds_topic, labels_topic,
                       state={"checkpoint_interval": "1h"})
    state_dir = tmp_path / "calmon-state"
    store = CheckpointStore(state_dir)
    preds, labels = make_dataset(300, seed=31)
    records = interleave(preds, labels, preds_topic, labels_topic, seed=32)

    daemon = CalmonDaemon(cfg)
    with daemon.start():
        assert daemon.terminate() == 0  # checkpoint 1: empty state, no offsets
    first = store.load()
    assert first is not None and first.positions == {}

    with Producer(kafka_bootstrap) as producer:
        sent = producer.send(records)
    with daemon.start():
        daemon.wait_positions(end_positions(sent))
        assert daemon.terminate() == 0  # checkpoint 2: everything, offsets committed
    newest = store.load()
    assert newest is not None and newest.seq == first.seq + 1
    assert newest.state["engine"]["counters"]["joined"] == 300

    path = state_dir / f"ckpt-{newest.seq:012d}.calmon"
    blob = bytearray(path.read_bytes())
    blob[len(blob) // 2] ^= 0xFF
    path.write_bytes(bytes(blob))
    with daemon.start():
        st = daemon.wait_positions(end_positions(sent))
        st = daemon.status()
        assert {k: st["counters"][k] for k in ("predictions", "labels", "joined")} == {
            "predictions": 300, "labels": 300, "joined": 300}
    assert "checksum mismatch" in daemon.log.read_text()


# ---------------------------------------------------------------- the checkpoint files


def _state(n: int) -> dict[str, Any]:
    return {"engine": {"n": n, "arr": np.arange(n, dtype=np.int64), "raw": b"\x00\xff"}}


def _save(store: CheckpointStore, n: int) -> Path:
    return store.save(_state(n), {("preds", 0): n, ("labels", 3): 2 * n}, 1000.0 + n)


def test_torn_and_corrupt_newest_checkpoint_falls_back(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "state")
    assert store.load() is None  # nothing at all: start empty
    _save(store, 1)
    good = _save(store, 2)
    newest = _save(store, 3)  # only the two newest are kept
    assert sorted(p.name for p in store.dir.iterdir()) == [good.name, newest.name]

    # a kill during the write of checkpoint 4: its temp file never reached the rename
    tmp = store.dir / ".ckpt-000000000004.calmon.tmp"
    tmp.write_bytes(newest.read_bytes()[:100])
    # and the newest file torn (e.g. a disk that lied about fsync)
    newest.write_bytes(newest.read_bytes()[:-7])
    ckpt = store.load()
    assert ckpt is not None and ckpt.seq == 2
    assert ckpt.positions == {("preds", 0): 2, ("labels", 3): 4}
    assert ckpt.written_at == 1002.0
    assert ckpt.state["engine"]["n"] == 2 and ckpt.state["engine"]["raw"] == b"\x00\xff"
    assert ckpt.state["engine"]["arr"].tolist() == [0, 1]
    assert not tmp.exists()  # the leftover temp file is cleaned up

    # the torn file is kept aside, and no longer counts among the newest two: the
    # next checkpoint must not prune the good one the state came from
    assert (store.dir / (newest.name + ".corrupt")).exists()
    newest = _save(store, 5)
    assert sorted(p.name for p in store.dir.glob("ckpt-*.calmon")) == [good.name, newest.name]

    # a flipped byte in the newest file: the checksum catches it
    blob = bytearray(newest.read_bytes())
    blob[-1] ^= 0x01
    newest.write_bytes(bytes(blob))
    ckpt = store.load()
    assert ckpt is not None and ckpt.state["engine"]["n"] == 2


def test_all_checkpoints_corrupt(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "state")
    for n in (1, 2):
        path = _save(store, n)
        blob = bytearray(path.read_bytes())
        blob[0] ^= 0xFF  # bad magic
        path.write_bytes(bytes(blob))
    with pytest.raises(StateError, match="no usable checkpoint"):
        store.load()
    with pytest.raises(StateError):
        store.load("fail")
    assert store.load("reset") is None
    # reset keeps the unreadable files aside, and the next checkpoint is the newest
    assert len(list(store.dir.glob("*.corrupt"))) == 2
    _save(store, 7)
    ckpt = store.load()
    assert ckpt is not None and ckpt.state["engine"]["n"] == 7


def test_calmon_run_with_only_corrupt_checkpoints(
    kafka_bootstrap: str, kafka_topics: Callable[..., list[str]], tmp_path: Path
) -> None:
    """``calmon run`` exits 2 with a clear message; with ``state.on_corrupt: reset``
    it starts from empty state."""
    preds_topic, labels_topic = kafka_topics(count=2, partitions=4)
    cfg = write_config(tmp_path / "calmon.yaml", kafka_bootstrap, preds_topic, labels_topic)
    state_dir = tmp_path / "calmon-state"
    store = CheckpointStore(state_dir)
    for n in (1, 2):
        path = _save(store, n)
        path.write_bytes(path.read_bytes()[:40])

    proc = run_calmon("run", "-c", str(cfg), timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "no usable checkpoint" in proc.stderr
    assert str(state_dir) in proc.stderr
    assert "on_corrupt" in proc.stderr  # says how to get going again
    assert "Traceback" not in proc.stderr

    reset = write_config(tmp_path / "reset.yaml", kafka_bootstrap, preds_topic, labels_topic,
                         state={"dir": str(state_dir), "on_corrupt": "reset"})
    with CalmonDaemon(reset) as daemon:
        st = daemon.status()
        assert {k: st["counters"][k] for k in COUNTER_KEYS} == dict.fromkeys(COUNTER_KEYS, 0)
        assert st["pending"] == 0
        # and it checkpoints a fresh, loadable state over the corrupt files
        daemon.wait_checkpoint(None, "a new checkpoint")
    ckpt = store.load()
    assert ckpt is not None and ckpt.state["engine"]["counters"]["predictions"] == 0
