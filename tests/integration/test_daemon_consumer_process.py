"""The Kafka consumer runs in a child process: if it dies (here: SIGKILL in the middle
of the stream), the daemon starts another from the offsets it has processed, and
the counts stay exact; and when the daemon is killed, the child goes with it."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.daemon_helpers import (
    COUNTER_KEYS,
    CalmonDaemon,
    Producer,
    assert_gauges_match_replay,
    end_positions,
    interleave,
    make_dataset,
    replay_json,
    wait_until,
    write_config,
    write_jsonl,
)

pytestmark = pytest.mark.integration

N = 1000


def children(pid: int) -> list[int]:
    """Live consumer processes started by ``pid`` (multiprocessing's spawn children;
    its resource tracker is a child too, and is left out), from /proc."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z" and b"spawn_main" in cmdline:
            out.append(int(entry))
    return out


def test_a_killed_consumer_process_is_replaced_and_counts_stay_exact(
    kafka_bootstrap: str, kafka_topics: Callable[..., list[str]], tmp_path: Path
) -> None:
    preds_topic, labels_topic = kafka_topics(count=2, partitions=4)
    cfg = write_config(tmp_path / "calmon.yaml", kafka_bootstrap, preds_topic, labels_topic)
    preds, labels = make_dataset(N, seed=71)
    records = interleave(preds, labels, preds_topic, labels_topic, seed=72)
    half = len(records) // 2
    daemon = CalmonDaemon(cfg)
    with daemon.start(), Producer(kafka_bootstrap) as producer:
        first = producer.send(records[:half])
        daemon.wait_positions(end_positions(first))
        (consumer,) = wait_until(lambda: children(daemon.pid), 60, "the consumer process")
        os.kill(consumer, signal.SIGKILL)
        wait_until(lambda: children(daemon.pid) and children(daemon.pid) != [consumer], 30,
                   "a new consumer process", detail=daemon.log_tail)
        rest = producer.send(records[half:])
        daemon.wait_positions(end_positions(first + rest))
        daemon.wait_ready()
        st = daemon.status()
        sc = daemon.scrape()
        assert daemon.starts == 1  # the daemon itself never restarted
        want = {"predictions": N, "labels": N, "joined": N, "invalid": 0, "expired": 0,
                "duplicates": 0}
        assert {k: st["counters"][k] for k in COUNTER_KEYS} == want
        replay = replay_json(cfg, write_jsonl(tmp_path / "p.jsonl", preds),
                             write_jsonl(tmp_path / "l.jsonl", labels))
        assert_gauges_match_replay(sc, replay, tol=0.0)

        # kill -9 of the daemon takes its consumer process with it
        (consumer,) = children(daemon.pid)
        daemon.kill()

        def gone() -> bool:
            try:
                with open(f"/proc/{consumer}/stat") as f:
                    return f.read().rsplit(")", 1)[1].split()[0] == "Z"
            except OSError:
                return True

        wait_until(gone, 60, "the consumer process to die with the daemon")
