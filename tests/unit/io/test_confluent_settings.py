"""``ConfluentSource``'s librdkafka settings: ``fetch.queue.backoff.ms`` is small by
default (librdkafka's own default, 1000 ms, stalls a fast consumer for most of a
second each time its queue fills) and ``kafka.client`` may override it."""

from __future__ import annotations

from typing import Any

import pytest

from calmon.config import KafkaConfig, from_dict

pytest.importorskip("confluent_kafka")  # the optional extra calmon[fast]

from calmon.io.confluent_source import ConfluentSource

KEY = "fetch.queue.backoff.ms"


def settings_of(kafka: dict[str, Any]) -> dict[str, Any]:
    """The consumer settings of a source built from the ``kafka:`` section of a config,
    as a user writes it (nothing connects: the consumer is made by ``assign``)."""
    cfg: KafkaConfig = from_dict({"kafka": {"library": "confluent", **kafka}}).kafka
    return ConfluentSource(cfg)._settings()


def test_fetch_queue_backoff_is_small_by_default() -> None:
    settings = settings_of({})
    assert KEY in settings
    assert isinstance(settings[KEY], int)
    assert 0 <= settings[KEY] <= 50


def test_fetch_queue_backoff_stays_small_with_other_client_settings() -> None:
    """Translated kafka-python keys and other native keys leave the default alone."""
    settings = settings_of({"client": {"fetch_max_wait_ms": 100,
                                       "queued.min.messages": 1000}})
    assert 0 <= settings[KEY] <= 50
    assert settings["fetch.wait.max.ms"] == 100
    assert settings["queued.min.messages"] == 1000


@pytest.mark.parametrize("value", [0, 250, 1000])
def test_kafka_client_overrides_fetch_queue_backoff(value: int) -> None:
    assert settings_of({"client": {KEY: value}})[KEY] == value


def test_librdkafka_accepts_the_default_and_the_override() -> None:
    """An unknown or out-of-range property would make the Consumer raise
    KafkaException; this librdkafka must know the key at both values."""
    import confluent_kafka

    for kafka in ({}, {"client": {KEY: 500}}):
        settings = settings_of({"bootstrap_servers": "127.0.0.1:1", **kafka})
        consumer = confluent_kafka.Consumer(settings)
        consumer.close()
