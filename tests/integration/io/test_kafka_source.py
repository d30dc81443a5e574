"""The Kafka sources of both ``kafka.library`` values (``KafkaSource``,
``ConfluentSource``) against a real Kafka-compatible broker (Tansu unless
$CALMON_TEST_BOOTSTRAP is set): the same tests, the same expectations."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from calmon.config import Instance, KafkaConfig
from calmon.engine.records import Kind, Raw
from calmon.io import kafka_source
from calmon.io import source as shared
from calmon.io.consumer_process import make_source
from calmon.io.source import ChunkSource, KafkaSourceError
from tests.conftest import FAST_CLIENT, Broker, create_topics, produce, unique_topic

pytestmark = pytest.mark.integration

Positions = dict[tuple[str, int], int]


def make_config(bootstrap: str, preds: str, labels: str, library: str,
                **kwargs: Any) -> KafkaConfig:
    kwargs.setdefault("group_id", unique_topic("calmon-group"))
    return KafkaConfig(
        bootstrap_servers=(bootstrap,),
        predictions_topic=preds,
        labels_topic=labels,
        client=FAST_CLIENT,  # kafka-python spellings: translated for librdkafka
        library=library,
        **kwargs,
    )


def open_source(config: KafkaConfig, positions: Positions | None = None) -> ChunkSource:
    source = make_source(config, metadata_timeout_s=10)
    source.assign(positions)
    return source


def read(
    source: ChunkSource,
    count: int,
    *,
    timeout: float = 15.0,
    max_records: int = 500,
    stop: Callable[[list[Raw]], bool] | None = None,
) -> tuple[list[Raw], Positions]:
    """Poll until ``count`` records (or ``stop``), merging positions; fails after
    ``timeout`` seconds saying how far it got."""
    records: list[Raw] = []
    positions: Positions = {}
    deadline = time.monotonic() + timeout
    while not (stop(records) if stop else len(records) >= count):
        if time.monotonic() > deadline:
            want = "the stop condition" if stop else f"{count} records"
            raise AssertionError(f"timed out after {timeout}s waiting for {want}: "
                                 f"{len(records)} read, positions {positions}")
        batch = source.poll(timeout_ms=200, max_records=max_records)
        records += batch.records
        positions.update(batch.positions)
    return records, positions


def assert_nothing_more(source: ChunkSource, wait_s: float = 0.5) -> None:
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        assert source.poll(timeout_ms=100).records == []


def parse(source: str) -> tuple[str, int, int]:
    topic, partition, offset = source.rsplit("/", 2)
    return topic, int(partition), int(offset)


@pytest.fixture
def topic_pair(kafka_topics: Callable[..., list[str]]) -> tuple[str, str]:
    preds, labels = kafka_topics(count=2, partitions=4)
    return preds, labels


def test_reads_everything_with_next_offsets(
    library: str, kafka_bootstrap: str, topic_pair: tuple[str, str]
) -> None:
    preds, labels = topic_pair
    keys = [f"req-{i}".encode() for i in range(200)]
    sent = produce(kafka_bootstrap, preds, [b"p" + k for k in keys], keys=keys)
    sent += produce(kafka_bootstrap, labels, [b"l" + k for k in keys[:80]], keys=keys[:80])
    source = open_source(make_config(kafka_bootstrap, preds, labels, library))
    try:
        assert source.owned == sorted((t, p) for t in (preds, labels) for p in range(4))
        records, positions = read(source, 280)
        assert_nothing_more(source)
        assert source.connected()
    finally:
        source.close()

    assert len(records) == 280
    assert Counter(r.value for r in records) == Counter(
        [b"p" + k for k in keys] + [b"l" + k for k in keys[:80]]
    )
    for r in records:
        topic, partition, offset = parse(r.source)
        assert r.kind is (Kind.PREDICTION if topic == preds else Kind.LABEL)
        assert r.timestamp is not None and abs(r.timestamp - time.time()) < 120  # seconds
    # Within a partition, poll order is offset order.
    by_partition: dict[tuple[str, int], list[int]] = {}
    for r in records:
        topic, partition, offset = parse(r.source)
        by_partition.setdefault((topic, partition), []).append(offset)
    assert all(offs == sorted(offs) for offs in by_partition.values())
    expected: Positions = {}
    for md in sent:
        tp = (md.topic, md.partition)
        expected[tp] = max(expected.get(tp, 0), md.offset + 1)
    assert positions == expected


def test_restart_from_stored_positions_reads_nothing_twice(
    library: str, kafka_bootstrap: str, topic_pair: tuple[str, str]
) -> None:
    preds, labels = topic_pair
    config = make_config(kafka_bootstrap, preds, labels, library)
    produce(
        kafka_bootstrap,
        preds,
        [b"a%d" % i for i in range(150)],
        keys=[b"%d" % i for i in range(150)],
    )
    first = open_source(config)
    try:
        # Stop part-way: kafka-python has fetched more than it returned, and
        # only what was returned may count.
        got1, pos1 = read(first, 60, max_records=7)
    finally:
        first.close()
    assert 60 <= len(got1) < 150

    produce(
        kafka_bootstrap,
        labels,
        [b"b%d" % i for i in range(50)],
        keys=[b"%d" % i for i in range(50)],
    )
    second = open_source(config, pos1)
    try:
        got2, _ = read(second, 200 - len(got1))
        assert_nothing_more(second)
    finally:
        second.close()
    sources = [r.source for r in got1 + got2]
    assert len(sources) == len(set(sources)) == 200


def test_committed_offsets_are_the_fallback(
    library: str, kafka_bootstrap: str, topic_pair: tuple[str, str]
) -> None:
    preds, labels = topic_pair
    config = make_config(kafka_bootstrap, preds, labels, library)
    produce(kafka_bootstrap, preds, [b"old%d" % i for i in range(40)])
    first = open_source(config)
    try:
        _, positions = read(first, 40)
        assert first.commit(positions)
    finally:
        first.close()

    produce(kafka_bootstrap, preds, [b"new%d" % i for i in range(10)])
    second = open_source(config)  # same group, no stored positions
    try:
        got, _ = read(second, 10)
        assert_nothing_more(second)
    finally:
        second.close()
    assert sorted(r.value for r in got) == sorted(b"new%d" % i for i in range(10))


def test_restored_state_ignores_committed_offsets(
    library: str, kafka_bootstrap: str, topic_pair: tuple[str, str]
) -> None:
    # With positions from a restored checkpoint, a partition missing from them was
    # never counted in that state: it starts at auto_offset_reset (earliest), not at
    # the group's committed offset, which may belong to a newer state.
    preds, labels = topic_pair
    config = make_config(kafka_bootstrap, preds, labels, library)
    produce(kafka_bootstrap, preds, [b"zero%d" % i for i in range(20)], partition=0)
    produce(kafka_bootstrap, preds, [b"one%d" % i for i in range(10)], partition=1)
    first = open_source(config)
    try:
        _, positions = read(first, 30)
        assert positions == {(preds, 0): 20, (preds, 1): 10}
        assert first.commit(positions)
    finally:
        first.close()

    second = make_source(config, metadata_timeout_s=10)
    try:
        second.assign({(preds, 0): 15}, from_checkpoint=True)
        got, _ = read(second, 15)
        assert_nothing_more(second)
    finally:
        second.close()
    assert sorted(parse(r.source)[1:] for r in got) == (
        [(0, o) for o in range(15, 20)] + [(1, o) for o in range(10)])


def test_two_instances_share_partitions_exactly_once(
    library: str, kafka_bootstrap: str, topic_pair: tuple[str, str]
) -> None:
    preds, labels = topic_pair
    keys = [b"id-%d" % i for i in range(120)]
    produce(kafka_bootstrap, preds, keys, keys=keys)
    produce(kafka_bootstrap, labels, keys, keys=keys)
    group = unique_topic("calmon-group")  # one group shared by both instances
    sources = [
        open_source(
            make_config(kafka_bootstrap, preds, labels, library, group_id=group,
                        instance=Instance(index=i, count=2))
        )
        for i in range(2)
    ]
    try:
        assert sources[0].owned == [(t, p) for t in sorted((preds, labels)) for p in (0, 2)]
        assert sources[1].owned == [(t, p) for t in sorted((preds, labels)) for p in (1, 3)]
        everything: list[str] = []
        deadline = time.monotonic() + 15
        while len(everything) < 240 and time.monotonic() < deadline:
            for index, source in enumerate(sources):
                for r in source.poll(timeout_ms=100).records:
                    assert parse(r.source)[1] % 2 == index
                    everything.append(r.source)
        for source in sources:
            assert_nothing_more(source, 0.3)
    finally:
        for source in sources:
            source.close()
    assert len(everything) == len(set(everything)) == 240


def test_large_and_oversize_records_are_consumed(
    library: str, kafka_bootstrap: str, kafka_topics: Callable[..., list[str]]
) -> None:
    # The topic config lets a real Kafka ($CALMON_TEST_BOOTSTRAP) accept 5 MB records.
    preds, labels = kafka_topics(
        count=2, partitions=1, configs={"max.message.bytes": str(16 * 1024 * 1024)}
    )
    values = [b"small", b"x" * 2_000_000, b"y" * 5_000_000, b"tail"]
    produce(kafka_bootstrap, preds, values, partition=0)
    # max_record_bytes is 1 MiB: the big ones are oversize but must still arrive.
    source = open_source(make_config(kafka_bootstrap, preds, labels, library))
    try:
        got, positions = read(source, 4)
    finally:
        source.close()
    assert [r.value for r in got] == values
    assert positions == {(preds, 0): 4}


def test_missing_topic_is_a_clear_error(
    library: str,
    kafka_bootstrap: str,
    kafka_topics: Callable[..., list[str]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(kafka_source, "_MISSING_TOPIC_GRACE_S", 0.5)
    monkeypatch.setattr(shared, "MISSING_TOPIC_GRACE_S", 0.5)
    (preds,) = kafka_topics(count=1)
    missing = unique_topic("no-such-topic")
    source = make_source(make_config(kafka_bootstrap, preds, missing, library),
                         metadata_timeout_s=10)
    try:
        with pytest.raises(KafkaSourceError, match=f"{missing}.*does not exist"):
            source.assign()
    finally:
        source.close()


def test_outage_poll_returns_empty_and_resumes(library: str, private_broker: Broker) -> None:
    bootstrap = private_broker.bootstrap
    preds, labels = unique_topic(), unique_topic()
    create_topics(bootstrap, [preds, labels], partitions=1)
    produce(bootstrap, preds, [b"before%d" % i for i in range(5)], partition=0)
    source = open_source(make_config(bootstrap, preds, labels, library))
    try:
        got, _ = read(source, 5)
        assert len(got) == 5

        private_broker.kill()
        started = time.monotonic()
        for _ in range(5):
            assert source.poll(timeout_ms=200).records == []  # no exception either
        assert time.monotonic() - started < 10
        assert not source.connected()
        assert source.commit({(preds, 0): 5}) is False  # fails softly too

        private_broker.start()
        if not private_broker.keeps_data_on_restart:  # Tansu: memory only, topics again
            create_topics(bootstrap, [preds, labels], partitions=1)
        after = [b"after%d" % i for i in range(10)]
        produce(bootstrap, preds, after, partition=0)
        got, _ = read(source, 0, stop=lambda rs: {b"after9"} <= {r.value for r in rs})
        if private_broker.keeps_data_on_restart:
            # the log survived the SIGKILL: the source reads on from offset 5, each once
            assert [r.value for r in got] == after
            assert [r.source for r in got] == [f"{preds}/0/{5 + i}" for i in range(10)]
        else:
            # The consumer's position (5) may still be valid on the new log, or it may
            # have been reset to the beginning if it fetched while the log was empty.
            assert got and {r.value for r in got} <= set(after)
            assert b"after9" in {r.value for r in got}
        assert source.connected()
    finally:
        source.close()
