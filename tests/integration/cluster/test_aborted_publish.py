"""An aborted calibrator publish is never served (contract §7), on a broker that keeps
``read_committed`` (Apache Kafka; Tansu returns aborted records even then): one
transaction the owner aborts itself, one left open by an owner killed with SIGKILL
(aborted by the broker when the next owner takes the transactional id over). Neither
is read back into any instance's ``output_dir``, nor served by a topic watcher with
``read_committed``; a watcher switched to ``read_uncommitted`` does serve it, which is
what the guarantee keeps out."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from kafka import TopicPartition
from scipy.special import expit

from calmon import config as config_mod
from calmon.calibrators import CalibratorWatcher
from calmon.cluster.kafka import Publisher, materialise, read_back
from calmon.recal.registry import Registry
from tests.conftest import FAST_CLIENT, Broker
from tests.daemon_helpers import REPO, subprocess_env, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.brokers("kafka")]

KEY = "ctr/__all__"
Z = np.array([-3.0, -0.5, 0.0, 0.7, 4.0])

# a former owner in its own process: opens a transaction with v3, sends it (acked,
# so it lies in the log), says so, and waits to be killed
KILLED_OWNER = """
import json, signal, sys
from calmon import config as config_mod
from calmon.cluster.kafka import Publisher
bootstrap, topic, group, doc = sys.argv[1:5]
kafka = config_mod.from_dict({"kafka": {"bootstrap_servers": bootstrap}}).kafka
publisher = Publisher(kafka, topic, group)
producer = publisher.take(0)
producer.begin_transaction()
producer.send(topic, key=b"ctr/__all__", value=doc.encode(), partition=0).get(30)
producer.flush(30)
print("open", flush=True)
signal.pause()  # until the test kills it
"""


def doc(version: int, temperature: float) -> bytes:
    return (json.dumps({"model": "ctr", "segment": "__all__", "version": version,
                        "method": "temperature", "input": "logit",
                        "params": {"temperature": temperature}}) + "\n").encode()


def served_temperature(w: CalibratorWatcher) -> float | None:
    """The temperature the watcher applies to ctr, read off its output (scipy)."""
    if w.version("ctr") is None:
        return None
    out = w.apply("ctr", Z)
    for t in (2.0, 5.0, 9.0, 1.5):
        if np.allclose(out, np.clip(expit(Z / t), 1e-7, 1 - 1e-7), rtol=1e-12, atol=0):
            return t
    return float("nan")


def read_to(w: CalibratorWatcher, topic: str, offset: int) -> None:
    """Refresh the watcher until its consumer is past ``offset`` of partition 0."""
    tp = TopicPartition(topic, 0)

    def past() -> bool:
        w.refresh(force=True)
        return bool(w._consumer.position(tp) > offset)  # its own consumer, read_committed

    wait_until(past, 60, f"the watcher past offset {offset}")


def test_aborted_publishes_are_never_served_nor_materialised(
        broker: Broker, kafka_topics: Callable[..., list[str]], tmp_path: Path) -> None:
    assert not broker.serves_aborted
    (topic,) = kafka_topics(count=1, partitions=1)
    kafka = config_mod.from_dict({"kafka": {"bootstrap_servers": broker.bootstrap,
                                            "client": dict(FAST_CLIENT)}}).kafka
    group = f"calmon-test-{uuid.uuid4().hex[:8]}"
    owner = Publisher(kafka, topic, group)
    killed: subprocess.Popen[str] | None = None
    successor = Publisher(kafka, topic, group)
    try:
        producer = owner.take(0)
        assert owner.send(0, KEY, doc(1, 2.0))  # v1, committed
        # v2: the owner aborts its own transaction (its refit failed the gate mid-send)
        producer.begin_transaction()
        producer.send(topic, key=KEY.encode(), value=doc(2, 5.0), partition=0).get(30)
        producer.abort_transaction()
        # v3: another owner takes the partition over and is killed mid-transaction
        killed = subprocess.Popen(
            [sys.executable, "-c", KILLED_OWNER, broker.bootstrap, topic, group,
             doc(3, 9.0).decode()], cwd=str(REPO), env=subprocess_env(),
            stdout=subprocess.PIPE, text=True)
        assert killed.stdout is not None and killed.stdout.readline().strip() == "open"
        killed.kill()
        killed.wait(10)
        # the next owner's InitProducerId aborts the open transaction; its read-back
        # (to its own marker) sees v1 only, and so does every output_dir it writes
        successor.take(0)
        docs = read_back(successor, 0)
        assert [(d["version"], d["params"]["temperature"]) for d, _ in docs] == [(1, 2.0)]
        for i in range(2):
            reg = Registry(tmp_path / f"calibrators{i}")
            assert materialise(reg, docs) == 1
            assert reg.versions("ctr", "__all__") == [1]
            files = sorted(p.name for p in reg.dir_of("ctr", "__all__").iterdir())
            assert files == ["latest.json", "v1.json"]
            assert json.loads((reg.dir_of("ctr", "__all__") / "latest.json").read_text())[
                "params"] == {"temperature": 2.0}

        # watchers of the topic: everything above is in the log (markers included)
        end = _end_offset(broker.bootstrap, topic)
        committed = CalibratorWatcher(topic=topic, bootstrap_servers=broker.bootstrap,
                                      consumer_settings=dict(FAST_CLIENT), background=False)
        uncommitted = CalibratorWatcher(
            topic=topic, bootstrap_servers=broker.bootstrap, background=False,
            consumer_settings={**FAST_CLIENT, "isolation_level": "read_uncommitted"})
        try:
            read_to(committed, topic, end - 1)
            read_to(uncommitted, topic, end - 1)
            assert committed.version("ctr") == 1 and served_temperature(committed) == 2.0
            # without read_committed the aborted v3 (the newest version) is served
            assert uncommitted.version("ctr") == 3 and served_temperature(uncommitted) == 9.0
        finally:
            committed.close()
            uncommitted.close()
    finally:
        if killed is not None and killed.poll() is None:
            killed.kill()
            killed.wait(10)
        owner.close()
        successor.close()


def _end_offset(bootstrap: str, topic: str) -> int:
    from kafka import KafkaConsumer

    c = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    try:
        tp = TopicPartition(topic, 0)
        return int(c.end_offsets([tp])[tp])
    finally:
        c.close()
