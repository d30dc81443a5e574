"""Compressed and undecodable record batches through both sources, on the real broker:
every codec reads exactly; a batch that cannot be decoded, or that inflates past the
bound, is skipped by offset with a reason and the partition goes on."""

from __future__ import annotations

import resource
import time
from collections.abc import Callable

import pytest
from kafka.errors import KafkaError

from calmon.io.consumer_process import make_source
from calmon.io.source import Skip
from tests.conftest import Broker
from tests.hostile_batches import MIB, gzip_bomb, gzip_payload, send_one_batch
from tests.integration.io.test_kafka_source import make_config

pytestmark = pytest.mark.integration

TAIL = b'{"tail": true}'


def read_until_tail(library: str, bootstrap: str, preds: str, labels: str,
                    timeout: float = 60.0) -> tuple[list[tuple[str, bytes | None]], list[Skip],
                                                   dict[tuple[str, int], int]]:
    source = make_source(make_config(bootstrap, preds, labels, library), metadata_timeout_s=10)
    source.assign()
    got: list[tuple[str, bytes | None]] = []
    skipped: list[Skip] = []
    positions: dict[tuple[str, int], int] = {}
    deadline = time.monotonic() + timeout
    try:
        while not any(v == TAIL for _, v in got):
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout}s waiting for the tail record: "
                                     f"{len(got)} read, {len(skipped)} skipped: {skipped}")
            batch = source.poll(timeout_ms=200, max_records=5000)
            got += [(r.source, r.value) for r in batch.records]
            skipped += batch.skipped
            positions.update(batch.positions)
    finally:
        source.close()
    return got, skipped, positions


@pytest.mark.parametrize("codec", ["gzip", "lz4", "zstd", "snappy"])
def test_every_codec_reads_exactly(library: str, codec: str, kafka_bootstrap: str,
                                   kafka_topics: Callable[..., list[str]]) -> None:
    preds, labels = kafka_topics(count=2, partitions=1)
    values = [b'{"id": "%s-%d", "pad": "%s"}' % (codec.encode(), i, b"ab" * (i % 50))
              for i in range(300)]
    offsets = send_one_batch(kafka_bootstrap, preds, 0, values, compression_type=codec)
    send_one_batch(kafka_bootstrap, preds, 0, [TAIL])
    got, skipped, positions = read_until_tail(library, kafka_bootstrap, preds, labels)
    assert skipped == []
    assert got == [(f"{preds}/0/{o}", v) for o, v in zip(offsets, values)] + [
        (f"{preds}/0/{offsets[-1] + 1}", TAIL)]
    assert positions == {(preds, 0): offsets[-1] + 2}


# a batch that cannot be decoded only reaches a consumer through a broker that stores
# it unchecked; Apache Kafka refuses it at produce (test_a_broker_that_validates_refuses_them)
@pytest.mark.brokers("tansu")
def test_garbage_batch_is_skipped_by_offset(library: str, kafka_bootstrap: str,
                                            kafka_topics: Callable[..., list[str]]) -> None:
    preds, labels = kafka_topics(count=2, partitions=1)
    before = send_one_batch(kafka_bootstrap, preds, 0, [b'{"n": 0}'])
    with gzip_payload(b"not gzip at all" * 4):
        bad = send_one_batch(kafka_bootstrap, preds, 0, [b"z" * 500] * 5,
                             compression_type="gzip")
    after = send_one_batch(kafka_bootstrap, preds, 0, [b'{"n": 1}', TAIL])
    got, skipped, positions = read_until_tail(library, kafka_bootstrap, preds, labels)
    assert [s for s, _ in got] == [f"{preds}/0/{o}" for o in before + after]
    counted = [s for s in skipped if s.reason]
    assert [(s.topic, s.partition, s.first, s.reason) for s in counted] == [
        (preds, 0, bad[0], "bad_batch")]  # once, however many fetches it took
    assert max(s.next_offset for s in skipped) == bad[-1] + 1
    assert positions == {(preds, 0): after[-1] + 1}


# a batch that cannot be decoded only reaches a consumer through a broker that stores
# it unchecked; Apache Kafka refuses it at produce (test_a_broker_that_validates_refuses_them)
@pytest.mark.brokers("tansu")
def test_gzip_bomb_is_skipped_in_bounded_memory(kafka_bootstrap: str,
                                                kafka_topics: Callable[..., list[str]]) -> None:
    """580 KB that inflate to 600 MB: kafka-python's own decoder would hold all of it."""
    preds, labels = kafka_topics(count=2, partitions=1)
    bomb = gzip_bomb(600 * MIB)
    assert len(bomb) < 700 * 1024
    with gzip_payload(bomb):
        [at] = send_one_batch(kafka_bootstrap, preds, 0, [b"x" * (len(bomb) + 1024)],
                              compression_type="gzip")
    after = send_one_batch(kafka_bootstrap, preds, 0, [b'{"n": 1}', TAIL],
                           compression_type="gzip")
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    got, skipped, positions = read_until_tail("kafka-python", kafka_bootstrap, preds, labels)
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - rss_before
    assert [s for s, _ in got] == [f"{preds}/0/{o}" for o in after]
    assert [(s.first, s.next_offset, s.reason) for s in skipped] == [
        (at, at + 1, "batch_oversize")]
    assert skipped[0].value is not None and bomb in skipped[0].value  # the batch, to dead-letter
    assert positions == {(preds, 0): after[-1] + 1}
    assert grown < 400 * MIB, grown  # the bound is 64 MiB of inflated bytes a batch


# a batch that cannot be decoded only reaches a consumer through a broker that stores
# it unchecked; Apache Kafka refuses it at produce (test_a_broker_that_validates_refuses_them)
@pytest.mark.brokers("tansu")
def test_confluent_held_by_a_bomb_says_it_is_stuck(kafka_bootstrap: str,
                                                   kafka_topics: Callable[..., list[str]],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """librdkafka inflates batches itself and chews on a 600 MB bomb without an error:
    the source cannot skip what it never sees, but says the partition is stuck."""
    pytest.importorskip("confluent_kafka")
    from calmon.io import source as shared

    monkeypatch.setattr(shared, "STUCK_AFTER_S", 3.0)
    preds, labels = kafka_topics(count=2, partitions=1)
    [first] = send_one_batch(kafka_bootstrap, preds, 0, [b'{"n": 0}'])
    bomb = gzip_bomb(600 * MIB)
    with gzip_payload(bomb):
        [at] = send_one_batch(kafka_bootstrap, preds, 0, [b"x" * (len(bomb) + 1024)],
                              compression_type="gzip")
    send_one_batch(kafka_bootstrap, preds, 0, [TAIL])
    source = make_source(make_config(kafka_bootstrap, preds, labels, "confluent"),
                         metadata_timeout_s=10)
    source.assign()
    stuck = None
    got: list[str] = []
    deadline = time.monotonic() + 90
    try:
        while stuck is None and time.monotonic() < deadline:
            got += [r.source for r in source.poll(timeout_ms=500, max_records=100).records]
            stuck = source.stuck()
    finally:
        source.close()
    assert got == [f"{preds}/0/{first}"]
    assert stuck is not None and f"{preds}/0 has stayed at offset {at}" in stuck


@pytest.mark.brokers("kafka")
def test_a_broker_that_validates_refuses_them(broker: Broker,
                                              kafka_topics: Callable[..., list[str]]) -> None:
    """Apache Kafka decodes every batch it is sent: garbage under gzip and a batch that
    inflates past its limits are refused at produce, so the consumer reads on exactly."""
    assert not broker.accepts_corrupt_batches
    preds, labels = kafka_topics(count=2, partitions=1)
    before = send_one_batch(broker.bootstrap, preds, 0, [b'{"n": 0}'])
    with gzip_payload(b"not gzip at all" * 4), pytest.raises(KafkaError):
        send_one_batch(broker.bootstrap, preds, 0, [b"z" * 500] * 5, compression_type="gzip")
    bomb = gzip_bomb(600 * MIB)
    with gzip_payload(bomb), pytest.raises(KafkaError):
        send_one_batch(broker.bootstrap, preds, 0, [b"x" * (len(bomb) + 1024)],
                       compression_type="gzip")
    after = send_one_batch(broker.bootstrap, preds, 0, [b'{"n": 1}', TAIL])
    for library in ("kafka-python", "confluent"):
        got, skipped, positions = read_until_tail(library, broker.bootstrap, preds, labels)
        assert [s for s, _ in got] == [f"{preds}/0/{o}" for o in before + after]
        assert skipped == [] and positions == {(preds, 0): after[-1] + 1}
