"""``kafka.library``: the config check, and ``kafka.client`` for librdkafka (kafka-python
spellings translated, native dotted keys passed through)."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest

from calmon.config import KafkaConfig
from calmon.io.confluent_settings import librdkafka_settings
from calmon.io.consumer_process import make_source
from tests.cli_helpers import check_config


def check(tmp_path: Path, text: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    rc, _, err = check_config(capsys, tmp_path, text)
    return rc, err


def test_confluent_is_accepted_when_importable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("confluent_kafka")
    rc, err = check(tmp_path, "kafka:\n  library: confluent\n", capsys)
    assert rc == 0, err


def test_confluent_without_the_package_is_a_config_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "confluent_kafka", None)  # makes the import fail
    rc, err = check(tmp_path, "kafka:\n  library: confluent\n", capsys)
    assert rc == 2
    (line,) = err.strip().splitlines()
    assert line.startswith("kafka.library: ")
    assert "calmon[fast]" in line
    # kafka-python needs nothing more
    rc, err = check(tmp_path, "kafka:\n  library: kafka-python\n", capsys)
    assert rc == 0, err


def test_unknown_library_names_its_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, err = check(tmp_path, "kafka:\n  library: librdkafka\n", capsys)
    assert rc == 2
    assert err.strip().splitlines()[0].startswith("kafka.library: ")


SECURITY = {
    "security_protocol": "SASL_SSL",
    "sasl_mechanism": "SCRAM-SHA-512",
    "sasl_plain_username": "calmon",
    "sasl_plain_password": "s3cret",
    "ssl_cafile": "/etc/ssl/ca.pem",
    "ssl_certfile": "/etc/ssl/client.pem",
    "ssl_keyfile": "/etc/ssl/client.key",
    "ssl_password": "keypass",
    "ssl_check_hostname": False,
}


def test_kafka_python_security_settings_are_translated() -> None:
    # the librdkafka names, from its CONFIGURATION.md, written out here
    want = {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "calmon",
        "sasl.password": "s3cret",
        "ssl.ca.location": "/etc/ssl/ca.pem",
        "ssl.certificate.location": "/etc/ssl/client.pem",
        "ssl.key.location": "/etc/ssl/client.key",
        "ssl.key.password": "keypass",
        "ssl.endpoint.identification.algorithm": "none",
    }
    assert librdkafka_settings(SECURITY, role="consumer") == want
    assert librdkafka_settings(SECURITY, role="producer") == want


def test_roles_native_keys_and_unknown_keys(caplog: pytest.LogCaptureFixture) -> None:
    client = {
        "fetch_max_wait_ms": 100,  # consumer only
        "max_request_size": 10_000,  # producer only
        "request_timeout_ms": 3000,  # both
        "security_protocol": "SSL",
        "security.protocol": "SASL_SSL",  # the native spelling wins
        "queued.max.messages.kbytes": 1024,  # native, unchanged
        "api_version_auto_timeout_ms": 1,  # kafka-python only: logged, ignored
    }
    with caplog.at_level(logging.WARNING):
        consumer = librdkafka_settings(client, role="consumer")
        producer = librdkafka_settings(client, role="producer")
    common = {"socket.timeout.ms": 3000, "security.protocol": "SASL_SSL",
              "queued.max.messages.kbytes": 1024}
    assert consumer == {**common, "fetch.wait.max.ms": 100}
    assert producer == {**common, "message.max.bytes": 10_000}
    assert "kafka.client.api_version_auto_timeout_ms" in caplog.text


def test_librdkafka_accepts_the_translated_names() -> None:
    confluent_kafka = pytest.importorskip("confluent_kafka")
    client = {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "PLAIN",
              "sasl_plain_username": "u", "sasl_plain_password": "p",
              "request_timeout_ms": 3000, "reconnect_backoff_ms": 50,
              "reconnect_backoff_max_ms": 500, "retry_backoff_ms": 50,
              "fetch_max_wait_ms": 100, "max_partition_fetch_bytes": 1 << 20,
              "ssl_check_hostname": True}
    base = {"bootstrap.servers": "127.0.0.1:1"}
    # an unknown property would raise KafkaException("No such configuration property")
    confluent_kafka.Consumer({**base, "group.id": "g",
                              **librdkafka_settings(client, role="consumer")}).close()
    producer = confluent_kafka.Producer({**base, **librdkafka_settings(client, role="producer")})
    assert producer.flush(0) == 0


def test_the_library_picks_the_source() -> None:
    pytest.importorskip("confluent_kafka")
    kw = {"predictions_topic": "p", "labels_topic": "l"}
    assert type(make_source(KafkaConfig(**kw))).__name__ == "KafkaSource"  # type: ignore[arg-type]
    confluent = KafkaConfig(library="confluent", **kw)  # type: ignore[arg-type]
    assert type(make_source(confluent)).__name__ == "ConfluentSource"
