"""Broker outage: the daemon's own broker is stopped mid-stream and restarted
(Apache Kafka: killed with SIGKILL, restarted on its log dir; Tansu: stopped).

While the broker is down /readyz answers 503, /metrics, /healthz and /status keep
serving the numbers already computed, and what was consumed is checkpointed. After the restart
/readyz is 200 again without restarting the daemon, and it ends with exactly the
counts and gauges of an uninterrupted run.

Apache Kafka keeps the log across the crash, so the daemon's positions stay valid
and it must read on exactly after them. Tansu keeps its data in memory; to give the daemon
the same situation, the test rebuilds the log after the restart: it re-creates
the topics and produces the records of before the outage again, to the same
partitions in the same order, and checks that they get the same offsets; the rest
of the stream follows. (Tansu answers a fetch past the end of a log with nothing,
not OFFSET_OUT_OF_RANGE, so the daemon keeps its positions while the log is
rebuilt and then reads exactly the new records.) A daemon that lost or reset its
positions would count the rebuilt records twice, which the exact counters catch.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Broker, create_topics, unique_topic
from tests.daemon_helpers import (
    COUNTER_KEYS,
    CalmonDaemon,
    Producer,
    assert_gauges_match_replay,
    end_positions,
    http_get,
    interleave,
    make_dataset,
    replay_json,
    wait_until,
    window_gauges,
    write_config,
    write_jsonl,
)

pytestmark = pytest.mark.integration

N = 900


def test_broker_outage_and_recovery(private_broker: Broker, tmp_path: Path) -> None:
    broker = private_broker
    bootstrap = broker.bootstrap
    preds_topic, labels_topic = unique_topic(), unique_topic()
    make_topics: Callable[[], None] = lambda: create_topics(  # noqa: E731
        bootstrap, [preds_topic, labels_topic], partitions=4)
    make_topics()
    cfg = write_config(tmp_path / "calmon.yaml", bootstrap, preds_topic, labels_topic)
    preds, labels = make_dataset(N, seed=81)
    records = interleave(preds, labels, preds_topic, labels_topic, seed=82)
    half = len(records) // 2

    daemon = CalmonDaemon(cfg)
    with daemon.start():
        pid = daemon.pid
        with Producer(bootstrap) as producer:
            before: list[Any] = producer.send(records[:half])
        daemon.wait_positions(end_positions(before))
        counted = daemon.status()["counters"]
        gauges = window_gauges(daemon.scrape())
        assert counted["predictions"] + counted["labels"] == half
        assert gauges

        # ---- the outage
        if broker.keeps_data_on_restart:
            broker.kill()  # a crash: nothing flushed on purpose, nothing closed cleanly
        else:
            broker.stop()
        wait_until(lambda: http_get(daemon.port, "/readyz")[0] == 503, 20, "/readyz 503",
                   detail=daemon.log_tail)
        assert http_get(daemon.port, "/healthz")[0] == 200
        st = daemon.status()
        assert st["ready"] is False
        assert st["counters"] == counted
        assert window_gauges(daemon.scrape()) == gauges  # still served, unchanged
        # the state consumed before the outage still gets checkpointed without a broker
        # (the offset commit fails softly); idle intervals write nothing new
        daemon.wait_checkpoint_of(end_positions(before), "a checkpoint of the pre-outage state")
        assert http_get(daemon.port, "/readyz")[0] == 503

        # ---- the broker is back (Tansu: with its log rebuilt as a persistent one keeps it)
        broker.start()
        with Producer(bootstrap) as producer:
            if broker.keeps_data_on_restart:
                again = before
            else:
                make_topics()
                by_offset = sorted(zip(before, records[:half]),
                                   key=lambda mr: (mr[0].topic, mr[0].partition, mr[0].offset))
                again = producer.send([(*r, md.partition) for md, r in by_offset])
                assert [(m.topic, m.partition, m.offset) for m in again] == [
                    (m.topic, m.partition, m.offset) for m, _ in by_offset]
            after = producer.send(records[half:])
        daemon.wait_ready()
        assert daemon.pid == pid and daemon.starts == 1  # recovered by itself
        daemon.wait_positions(end_positions(again + after))
        st = daemon.status()
        sc = daemon.scrape()
        assert st["ready"] is True

        # ---- down again, then SIGTERM: still a clean exit within 10 s
        broker.kill()
        wait_until(lambda: http_get(daemon.port, "/readyz")[0] == 503, 20, "/readyz 503")
        started = time.monotonic()
        assert daemon.terminate(timeout=10.0) == 0
        assert time.monotonic() - started < 10.0

    want = {"predictions": N, "labels": N, "joined": N, "invalid": 0, "expired": 0,
            "duplicates": 0}
    assert {k: st["counters"][k] for k in COUNTER_KEYS} == want
    replay = replay_json(cfg, write_jsonl(tmp_path / "p.jsonl", preds),
                         write_jsonl(tmp_path / "l.jsonl", labels))
    assert replay["counters"] == want
    assert_gauges_match_replay(sc, replay, tol=0.0)
