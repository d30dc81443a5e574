"""DeadLetters against a real Kafka-compatible broker, and its failure modes, on
both ``kafka.library`` values (kafka-python spellings in ``kafka.client`` throughout)."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from calmon.config import KafkaConfig
from calmon.io.calibrator_publisher import CalibratorPublisher
from calmon.io.dead_letter import REASON_HEADER, SOURCE_HEADER, DeadLetters
from calmon.io.outbox import Outbox
from tests.conftest import FAST_CLIENT, _free_port, consume

pytestmark = pytest.mark.integration


def make_config(bootstrap: str, library: str, **kwargs: object) -> KafkaConfig:
    client = {**FAST_CLIENT, **kwargs.pop("client", {})}  # type: ignore[dict-item]
    return KafkaConfig(bootstrap_servers=(bootstrap,), client=client,  # type: ignore[arg-type]
                       library=library, **kwargs)  # type: ignore[arg-type]


def test_dead_letters_arrive_unchanged_with_headers(
    library: str, kafka_bootstrap: str, kafka_topics: Callable[..., list[str]]
) -> None:
    (dlq,) = kafka_topics(count=1, partitions=2)
    letters = DeadLetters(make_config(kafka_bootstrap, library, dead_letter_topic=dlq))
    sent = [
        (b"not json", "not_json", "predictions/3/17"),
        (b"{" + b"x" * 2_500_000 + b"}", "oversize", "predictions/0/4"),
        (None, "not_json", "labels/1/99"),  # a null record needs a key: its source
    ]
    try:
        for value, reason, source in sent:
            letters.send(value, reason, source)
        assert letters.flush(10)
        assert (letters.delivered, letters.failed) == (3, 0)
    finally:
        letters.close()

    got = consume(kafka_bootstrap, dlq, 3)
    seen = {}
    for r in got:
        headers = dict(r.headers)
        seen[headers[SOURCE_HEADER].decode()] = (r.value, headers[REASON_HEADER].decode())
    assert seen == {source: (value, reason) for value, reason, source in sent}


def test_publish_uses_the_same_producer(
    library: str, kafka_bootstrap: str, kafka_topics: Callable[..., list[str]]
) -> None:
    (topic,) = kafka_topics(count=1, partitions=1)
    outbox = Outbox(make_config(kafka_bootstrap, library, calibrators_topic=topic))
    letters, publish = DeadLetters(outbox), CalibratorPublisher(outbox, topic)
    try:
        letters.send(b"ignored", "not_json", "p/0/0")  # no dead-letter topic: no-op
        assert outbox._producer is None
        assert publish("ctr-v3", "__all__", {"version": 1}, b'{"version": 1}')
        assert letters.flush(10)
        assert (outbox.delivered, letters.dead_letters_failed) == (1, 0)
    finally:
        letters.close()
    (record,) = consume(kafka_bootstrap, topic, 1)
    assert (record.key, record.value) == (b"ctr-v3/__all__", b'{"version": 1}')
    assert letters.delivered == 1


def test_record_over_max_request_size_is_counted_not_raised(
    library: str, kafka_bootstrap: str, kafka_topics: Callable[..., list[str]]
) -> None:
    (dlq,) = kafka_topics(count=1, partitions=1)
    letters = DeadLetters(
        make_config(kafka_bootstrap, library, dead_letter_topic=dlq,
                    client={"max_request_size": 10_000})
    )
    try:
        letters.send(b"z" * 20_000, "oversize", "p/0/0")
        letters.send(b"fine", "not_json", "p/0/1")
        assert letters.flush(10)
    finally:
        letters.close()
    assert (letters.delivered, letters.failed) == (1, 1)


@pytest.mark.timeout(30)
def test_unreachable_broker_never_raises_nor_stalls(library: str) -> None:
    nobody = f"127.0.0.1:{_free_port()}"
    letters = DeadLetters(
        make_config(nobody, library, dead_letter_topic="dlq", client={"bootstrap_timeout_ms": 500}),
        retry_interval_s=60,
    )
    try:
        started = time.monotonic()
        for i in range(100):
            letters.send(b"bad", "not_json", f"p/0/{i}")
        # One bootstrap attempt, then records are dropped without waiting.
        assert time.monotonic() - started < 5
        assert letters.failed == 100 and letters.delivered == 0
        assert letters.flush(1)
    finally:
        letters.close()
