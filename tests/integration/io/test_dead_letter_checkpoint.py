"""A checkpoint never moves offsets past dead letters still in flight, and dead
letters that failed for good are counted in ``calmon_dead_letters_failed_total``."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client.exposition import generate_latest

from calmon import config as config_mod
from calmon.daemon import Daemon
from calmon.engine.rawbatch import RawBatch
from calmon.engine.records import Kind, Raw
from tests.conftest import Broker, create_topics, unique_topic
from tests.daemon_helpers import parse_metrics, wait_until, write_config

pytestmark = pytest.mark.integration

DELIVERY_TIMEOUT_MS = 12_000  # past the 5 s a checkpoint waits for a flush


def failed_total(daemon: Daemon) -> float:
    sc = parse_metrics(generate_latest(daemon.registry).decode())
    return sc["calmon_dead_letters_failed_total"][frozenset()]


def test_checkpoint_waits_for_dead_letters_in_flight(private_broker: Broker,
                                                     tmp_path: Path) -> None:
    dlq, preds, labels = (unique_topic("dlq"), unique_topic("p"), unique_topic("l"))
    create_topics(private_broker.bootstrap, [dlq, preds, labels], partitions=1)
    path = write_config(tmp_path / "calmon.yaml", private_broker.bootstrap, preds, labels,
                        kafka={"dead_letter_topic": dlq,
                               "client": {"request_timeout_ms": 1000,
                                          "delivery_timeout_ms": DELIVERY_TIMEOUT_MS,
                                          "retry_backoff_ms": 50,
                                          "reconnect_backoff_ms": 50,
                                          "reconnect_backoff_max_ms": 200}})
    cfg = config_mod.load(str(path))
    daemon = Daemon(cfg, install_signals=False)
    try:
        # broker up: the dead letter is delivered, the checkpoint covers its offset
        daemon.process(RawBatch.of([Raw(Kind.PREDICTION, b"not json", None, f"{preds}/0/0")]))
        daemon.positions[(preds, 0)] = 1
        daemon.checkpoint()
        first = daemon.store.load("fail")
        assert first is not None and first.positions == {(preds, 0): 1}
        assert daemon.dead_letters.delivered == 1 and failed_total(daemon) == 0

        # broker gone: the next dead letter stays in flight, so no checkpoint moves past it
        private_broker.stop()
        daemon.process(RawBatch.of([Raw(Kind.PREDICTION, b"{broken", None, f"{preds}/0/1")]))
        daemon.positions[(preds, 0)] = 2
        assert daemon.dead_letters.in_flight == 1
        written_at = daemon.last_checkpoint
        daemon.checkpoint()
        held = daemon.store.load("fail")
        assert held is not None and held.positions == {(preds, 0): 1}
        assert held.seq == first.seq and daemon.last_checkpoint == written_at

        # the producer gives up after delivery_timeout_ms: counted, then checkpointed
        wait_until(lambda: daemon.dead_letters.in_flight == 0, DELIVERY_TIMEOUT_MS / 1000 + 30,
                   "the producer to give up on the dead letter")
        assert failed_total(daemon) == 1
        daemon.checkpoint()
        after = daemon.store.load("fail")
        assert after is not None and after.positions == {(preds, 0): 2}
        assert after.seq > first.seq
        assert daemon.status()["counters"]["invalid"] == 2
    finally:
        daemon.dead_letters.close(timeout=1)
        daemon.source.close()
