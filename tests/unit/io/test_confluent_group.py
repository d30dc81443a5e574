"""Group mode with ``kafka.library: confluent`` (contract §8), without a broker: the
group settings of ``kafka.client`` in kafka-python spelling reach librdkafka under its
names and as the values it wants, on the member's consumer only; the transactional
producer's settings; the generation read from librdkafka's group metadata; and the
library picking the group source and changelog writer."""

from __future__ import annotations

import struct

import pytest

from calmon.config import from_dict
from calmon.io.confluent_settings import librdkafka_settings
from calmon.io.consumer_process import group_classes

confluent_kafka = pytest.importorskip("confluent_kafka")

from calmon.io.changelog import TRANSACTION_TIMEOUT_MS  # noqa: E402
from calmon.io.confluent_changelog import ConfluentChangelog, txn_settings  # noqa: E402
from calmon.io.confluent_group import ConfluentGroupSource, generation  # noqa: E402


def _cfg(client: dict, library: str = "confluent"):
    return from_dict({"kafka": {"bootstrap_servers": "127.0.0.1:1", "group_id": "fleet",
                                "instance": "group", "library": library,
                                "predictions_topic": "p", "labels_topic": "l",
                                "client": client},
                      "recalibration": {"enabled": False}}, env={})


# as ${VAR} expands them: strings, spaces around the digits (check-config accepts them)
FROM_ENV = {"session_timeout_ms": " 6000", "max_poll_interval_ms": "10000 ",
            "heartbeat_interval_ms": "1000", "group_instance_id": "calmon-0",
            "request_timeout_ms": 3000}


def test_group_keys_become_librdkafka_properties_with_numbers() -> None:
    got = librdkafka_settings(FROM_ENV, role="consumer")
    assert got == {"session.timeout.ms": 6000, "max.poll.interval.ms": 10000,
                   "heartbeat.interval.ms": 1000, "group.instance.id": "calmon-0",
                   "socket.timeout.ms": 3000}
    assert all(type(got[k]) is int for k in ("session.timeout.ms", "max.poll.interval.ms",
                                             "heartbeat.interval.ms"))
    # the native spelling wins, as for the security keys
    assert librdkafka_settings({**FROM_ENV, "group.instance.id": "pod-1"},
                               role="consumer")["group.instance.id"] == "pod-1"
    assert librdkafka_settings(FROM_ENV, role="producer") == {"socket.timeout.ms": 3000}


def test_only_the_member_consumer_takes_the_group_keys() -> None:
    source = ConfluentGroupSource(_cfg(FROM_ENV).kafka, hooks=None)  # type: ignore[arg-type]
    member, labels = source._settings(group=True), source._settings(group=False)
    assert (member["group.id"], member["group.instance.id"]) == ("fleet", "calmon-0")
    assert member["session.timeout.ms"] == 6000 and member["max.poll.interval.ms"] == 10000
    assert not {"session.timeout.ms", "max.poll.interval.ms", "heartbeat.interval.ms",
                "group.instance.id"} & labels.keys()
    assert labels["group.id"] != "fleet"  # it never joins the members' group
    # librdkafka takes them (an unknown property or a bad value raises here)
    for settings in (member, labels):
        confluent_kafka.Consumer(settings).close()


def test_librdkafka_refuses_a_poll_interval_below_the_session() -> None:
    # why check-config refuses it with kafka.library: confluent (kafka-python takes it)
    group = librdkafka_settings({"session_timeout_ms": 6000, "max_poll_interval_ms": 3000},
                                role="consumer")
    with pytest.raises(confluent_kafka.KafkaException, match=r"max\.poll\.interval\.ms"):
        confluent_kafka.Consumer({"bootstrap.servers": "127.0.0.1:1", "group.id": "g", **group})


def test_the_transactional_producer_settings_are_accepted() -> None:
    # a client that turns idempotence off or waits longer than a transaction may
    cfg = _cfg({**FROM_ENV, "enable_idempotence": False, "delivery_timeout_ms": 120_000,
                "acks": 1}).kafka
    settings = txn_settings(cfg, "fleet-state-calmon-0")
    assert settings["transactional.id"] == "fleet-state-calmon-0"
    assert settings["message.timeout.ms"] <= settings["transaction.timeout.ms"] \
        == TRANSACTION_TIMEOUT_MS
    assert (settings["enable.idempotence"], settings["acks"]) == (True, "all")
    confluent_kafka.Producer(settings).flush(0)  # raises on a refused combination


def test_the_member_name_is_the_transactional_id_in_either_spelling() -> None:
    assert ConfluentChangelog(_cfg(FROM_ENV).kafka).transactional_id == "fleet-state-calmon-0"
    native = _cfg({"group.instance.id": "pod-1"}).kafka
    assert ConfluentChangelog(native).transactional_id == "fleet-state-pod-1"


def test_the_generation_is_read_from_librdkafka_group_metadata() -> None:
    def meta(gen: int, member: bytes) -> bytes:  # librdkafka's CGMDv2 layout
        return (b"CGMDv2:" + struct.pack("=i", gen) + b"fleet\x00" + member + b"\x00\x00"
                + b"calmon-0\x00")

    assert generation(meta(7, b"calmon-0-abc")) == 7
    assert generation(meta(-1, b"")) == -1
    assert generation(b"something else") is None
    # what librdkafka itself writes before the member joins: no generation
    c = confluent_kafka.Consumer({"bootstrap.servers": "127.0.0.1:1", "group.id": "fleet"})
    try:
        assert generation(c.consumer_group_metadata()) == -1
    finally:
        c.close()


def test_the_library_picks_the_group_source_and_changelog() -> None:
    source, changelog = group_classes(_cfg({}, library="kafka-python").kafka)
    assert (source.__name__, changelog.__name__) == ("GroupSource", "Changelog")
    source, changelog = group_classes(_cfg({}).kafka)
    assert (source, changelog) == (ConfluentGroupSource, ConfluentChangelog)
