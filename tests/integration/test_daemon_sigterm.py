"""SIGTERM during traffic: ``calmon run`` checkpoints and exits 0 within 10 s, and
a restart on the same state dir counts nothing twice."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

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
    series,
    wait_until,
    write_config,
    write_jsonl,
)

pytestmark = pytest.mark.integration

N = 1200


def test_sigterm_during_traffic_then_restart_counts_nothing_twice(
    kafka_bootstrap: str, kafka_topics: Callable[..., list[str]], tmp_path: Path
) -> None:
    preds_topic, labels_topic = kafka_topics(count=2, partitions=4)
    # a long interval: the only checkpoint of the first run is the one SIGTERM writes
    cfg = write_config(tmp_path / "calmon.yaml", kafka_bootstrap, preds_topic, labels_topic,
                       state={"checkpoint_interval": "1h"})
    preds, labels = make_dataset(N, seed=41)
    records = interleave(preds, labels, preds_topic, labels_topic, seed=42)
    rng = np.random.default_rng(43)
    threshold = int(rng.integers(len(records) // 5, len(records) // 2))
    sent: list[Any] = []
    failure: list[BaseException] = []
    signalled = threading.Event()

    def stream() -> None:
        # small chunks; past 60% of the records the stream holds back until the
        # SIGTERM was sent, so the traffic is certainly still flowing at that moment
        try:
            with Producer(kafka_bootstrap) as producer:
                for i in range(0, len(records), 10):
                    if i >= 0.6 * len(records) and not signalled.wait(60):
                        raise TimeoutError("no SIGTERM within 60 s")
                    sent.extend(producer.send(records[i:i + 10]))
        except BaseException as exc:  # reported by the main thread
            failure.append(exc)

    daemon = CalmonDaemon(cfg)
    with daemon.start():
        thread = threading.Thread(target=stream, daemon=True)
        thread.start()

        def counted() -> int:
            c = daemon.counters()
            return c["predictions"] + c["labels"]

        wait_until(lambda: counted() >= threshold, 60, f"{threshold} records counted",
                   detail=daemon.log_tail)
        assert thread.is_alive(), "the traffic should still be flowing at SIGTERM"
        started = time.monotonic()
        assert daemon.proc is not None
        daemon.proc.send_signal(signal.SIGTERM)
        signalled.set()  # the rest of the stream goes on while calmon stops
        code = daemon.proc.wait(10.0)  # raises if still running after 10 s
        elapsed = time.monotonic() - started
        assert code == 0, daemon.log_tail()
        assert elapsed < 10.0
        print(f"SIGTERM to exit: {elapsed:.2f}s")
    assert "stopped cleanly" in daemon.log.read_text()

    # the shutdown checkpoint holds what the first run counted, with its offsets
    ckpt = CheckpointStore(tmp_path / "calmon-state").load()
    assert ckpt is not None
    first = ckpt.state["engine"]["counters"]
    assert threshold <= first["predictions"] + first["labels"] < len(records)

    thread.join(60)
    assert not thread.is_alive() and not failure, failure
    with daemon.start():
        st = daemon.wait_positions(end_positions(sent))
        sc = daemon.scrape()
        st = daemon.status()
    want = {"predictions": N, "labels": N, "joined": N, "invalid": 0, "expired": 0,
            "duplicates": 0}
    assert {k: st["counters"][k] for k in COUNTER_KEYS} == want
    # the second process itself counted exactly the records after the checkpoint
    assert sum(series(sc, "calmon_predictions_total", "model").values()) == N - first[
        "predictions"]
    assert sum(series(sc, "calmon_labels_total", "model").values()) == N - first["labels"]
    assert sum(series(sc, "calmon_duplicates_total", "topic").values()) == 0

    replay = replay_json(cfg, write_jsonl(tmp_path / "p.jsonl", preds),
                         write_jsonl(tmp_path / "l.jsonl", labels))
    assert replay["counters"] == want
    assert_gauges_match_replay(sc, replay, tol=0.0)
