"""What the sources do where only Apache Kafka keeps the guarantee (Tansu cannot add
partitions, and answers the last batch's base offset + 1 as a partition's end):
partitions added to both input topics while reading are taken and read from their
first record, and end offsets are those Apache Kafka defines (the offset after the
last record), with both client libraries."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

import pytest
from kafka.admin import KafkaAdminClient, NewPartitions

from calmon.io.source import ChunkSource
from tests.conftest import FAST_CLIENT, Broker, produce
from tests.daemon_helpers import wait_until
from tests.integration.io.test_kafka_source import make_config, open_source, read

pytestmark = [pytest.mark.integration, pytest.mark.brokers("kafka")]


def test_end_offsets_are_the_offset_after_the_last_record(
        library: str, broker: Broker, kafka_topics: Callable[..., list[str]]) -> None:
    assert broker.exact_end_offsets
    preds, labels = kafka_topics(count=2, partitions=2)
    # three separate batches on partition 0 (each produce call flushes), one on 1
    for values in ([b"a"] * 5, [b"b"] * 7, [b"c"] * 3):
        produce(broker.bootstrap, preds, values, partition=0)
    produce(broker.bootstrap, preds, [b"d"] * 4, partition=1)
    source = open_source(make_config(broker.bootstrap, preds, labels, library))
    try:
        ends: dict[tuple[str, int], int] = {}

        def answered() -> bool:
            ends.update(source.end_offsets())
            return len(ends) == 4

        wait_until(answered, 30, "end offsets of all four partitions")
        # Tansu would say 13 for partition 0: the last batch's base offset (12) + 1
        assert ends == {(preds, 0): 15, (preds, 1): 4, (labels, 0): 0, (labels, 1): 0}
    finally:
        source.close()


def test_partitions_added_while_reading_are_read_from_their_first_record(
        library: str, broker: Broker, kafka_topics: Callable[..., list[str]]) -> None:
    assert broker.can_add_partitions
    preds, labels = kafka_topics(count=2, partitions=2)
    cfg = make_config(broker.bootstrap, preds, labels, library)
    # metadata refreshed often, so the added partitions are seen within the test's wait
    cfg = dataclasses.replace(cfg, client={**FAST_CLIENT, "metadata_max_age_ms": 500})
    produce(broker.bootstrap, preds, [b"old-0"], partition=0)
    source: ChunkSource = open_source(cfg)
    try:
        got, _ = read(source, 1)
        assert [r.source for r in got] == [f"{preds}/0/0"]
        admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap, request_timeout_ms=10000)
        try:
            admin.create_partitions({t: NewPartitions(total_count=4) for t in (preds, labels)})
        finally:
            admin.close()
        # records on the new partitions, written before the source notices them
        produce(broker.bootstrap, preds, [b"new-2a", b"new-2b"], partition=2)
        produce(broker.bootstrap, labels, [b"new-3"], partition=3)
        deadline = time.monotonic() + 60
        while len(source.owned) < 8 and time.monotonic() < deadline:
            assert source.refresh() is None  # both topics still co-partition
            time.sleep(0.2)  # polling interval of a deadline-bounded wait
        assert source.owned == sorted((t, p) for t in (preds, labels) for p in range(4))
        got, positions = read(source, 3)
        assert sorted(r.source for r in got) == sorted(
            [f"{labels}/3/0", f"{preds}/2/0", f"{preds}/2/1"])
        assert positions == {(preds, 2): 2, (labels, 3): 1}
    finally:
        source.close()
