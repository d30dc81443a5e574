"""``kafka.client`` for librdkafka (``kafka.library: confluent``).

``kafka.client`` accepts both spellings, so switching the library does not mean
rewriting the security settings of a deployment:

- a key with a dot (``security.protocol``, ``ssl.ca.location``) is a native
  librdkafka property and is passed unchanged (to the consumer and the producer;
  librdkafka ignores, with a warning, a property of the other role);
- a kafka-python key (``security_protocol``, ``ssl_cafile``) that has a
  librdkafka counterpart is translated by ``KAFKA_PYTHON_TO_LIBRDKAFKA`` (the
  native key wins when both are given);
- any other kafka-python key is logged and ignored.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

log = logging.getLogger(__name__)


def _same(v: Any) -> Any:
    return v


def _hostname_check(v: Any) -> str:
    # kafka-python ssl_check_hostname: bool; librdkafka: the identification algorithm
    return "https" if v else "none"


def _ms(v: Any) -> Any:
    # a number of milliseconds, as check-config reads it: ``${VAR}`` expands to a
    # string, maybe with spaces around the digits (kafka-python's reading strips them)
    text = v.strip() if isinstance(v, str) else v
    return int(text) if isinstance(text, str) and text.isdigit() else v


# kafka-python key -> (librdkafka key, roles it applies to, value translation)
BOTH, CONSUMER, PRODUCER = frozenset({"consumer", "producer"}), frozenset({"consumer"}), frozenset(
    {"producer"})
KAFKA_PYTHON_TO_LIBRDKAFKA: dict[str, tuple[str, frozenset[str], Callable[[Any], Any]]] = {
    # security
    "security_protocol": ("security.protocol", BOTH, _same),
    "sasl_mechanism": ("sasl.mechanism", BOTH, _same),
    "sasl_plain_username": ("sasl.username", BOTH, _same),
    "sasl_plain_password": ("sasl.password", BOTH, _same),
    "sasl_kerberos_service_name": ("sasl.kerberos.service.name", BOTH, _same),
    "ssl_cafile": ("ssl.ca.location", BOTH, _same),
    "ssl_certfile": ("ssl.certificate.location", BOTH, _same),
    "ssl_keyfile": ("ssl.key.location", BOTH, _same),
    "ssl_password": ("ssl.key.password", BOTH, _same),
    "ssl_crlfile": ("ssl.crl.location", BOTH, _same),
    "ssl_ciphers": ("ssl.cipher.suites", BOTH, _same),
    "ssl_check_hostname": ("ssl.endpoint.identification.algorithm", BOTH, _hostname_check),
    # connection and timeouts
    "client_id": ("client.id", BOTH, _same),
    "request_timeout_ms": ("socket.timeout.ms", BOTH, _same),
    "retry_backoff_ms": ("retry.backoff.ms", BOTH, _same),
    "reconnect_backoff_ms": ("reconnect.backoff.ms", BOTH, _same),
    "reconnect_backoff_max_ms": ("reconnect.backoff.max.ms", BOTH, _same),
    "connections_max_idle_ms": ("connections.max.idle.ms", BOTH, _same),
    "metadata_max_age_ms": ("metadata.max.age.ms", BOTH, _same),
    "receive_buffer_bytes": ("socket.receive.buffer.bytes", BOTH, _same),
    "send_buffer_bytes": ("socket.send.buffer.bytes", BOTH, _same),
    # consumer
    "fetch_max_wait_ms": ("fetch.wait.max.ms", CONSUMER, _same),
    "fetch_min_bytes": ("fetch.min.bytes", CONSUMER, _same),
    "fetch_max_bytes": ("fetch.max.bytes", CONSUMER, _same),
    "max_partition_fetch_bytes": ("max.partition.fetch.bytes", CONSUMER, _same),
    "isolation_level": ("isolation.level", CONSUMER, _same),
    "check_crcs": ("check.crcs", CONSUMER, _same),
    # v4: the consumer group (kafka.instance: group)
    "session_timeout_ms": ("session.timeout.ms", CONSUMER, _ms),
    "max_poll_interval_ms": ("max.poll.interval.ms", CONSUMER, _ms),
    "heartbeat_interval_ms": ("heartbeat.interval.ms", CONSUMER, _ms),
    "group_instance_id": ("group.instance.id", CONSUMER, str),
    # producer
    "acks": ("acks", PRODUCER, _same),
    "retries": ("retries", PRODUCER, _same),
    "linger_ms": ("linger.ms", PRODUCER, _same),
    "batch_size": ("batch.size", PRODUCER, _same),
    "compression_type": ("compression.type", PRODUCER, lambda v: "none" if v is None else v),
    "max_request_size": ("message.max.bytes", PRODUCER, _same),
    "delivery_timeout_ms": ("message.timeout.ms", PRODUCER, _same),
    "enable_idempotence": ("enable.idempotence", PRODUCER, _same),
}

# the group's properties: only the member of kafka.instance: group takes them (not its
# labels consumer, which has no group)
GROUP_PROPERTIES = frozenset({"session.timeout.ms", "max.poll.interval.ms",
                              "heartbeat.interval.ms", "group.instance.id"})

# librdkafka properties only a consumer takes (an admin client is given the rest)
CONSUMER_ONLY = frozenset(name for name, roles, _ in KAFKA_PYTHON_TO_LIBRDKAFKA.values()
                          if roles == CONSUMER)

# kafka-python keys calmon itself reads when the library is confluent (not librdkafka's)
CALMON_KEYS = frozenset({"bootstrap_timeout_ms"})


def librdkafka_settings(client: Mapping[str, Any], *, role: str) -> dict[str, Any]:
    """The part of ``kafka.client`` for a librdkafka ``role`` ("consumer" or "producer")."""
    translated: dict[str, Any] = {}
    native: dict[str, Any] = {}
    for key, value in client.items():
        if "." in key:
            native[key] = value
        elif key in KAFKA_PYTHON_TO_LIBRDKAFKA:
            name, roles, convert = KAFKA_PYTHON_TO_LIBRDKAFKA[key]
            if role in roles:
                translated[name] = convert(value)
        elif key not in CALMON_KEYS:
            log.warning("kafka.client.%s: no librdkafka counterpart; ignored by the %s "
                        "(give the native librdkafka property, with dots)", key, role)
    return {**translated, **native}


class LibrdkafkaLog:
    """librdkafka's ``logger``: its lines into Python logging (``confluent_kafka``), each
    facility of each client at most once per ``interval_s``.

    librdkafka logs every failed reconnect (tens a second with short backoffs while
    a broker is down); one line a minute, with a count of the rest, says as much.
    """

    def __init__(self, interval_s: float = 60.0) -> None:
        self._log = logging.getLogger("confluent_kafka")
        self._interval_s = interval_s
        self._last: dict[tuple[Any, ...], tuple[float, int]] = {}  # key -> (time, suppressed)

    def log(self, level: int, fmt: str, *args: Any) -> None:  # as logging.Logger.log
        if not self._log.isEnabledFor(level):
            return
        key = (level, *args[:2])  # (level, facility, client name)
        now = time.monotonic()
        last, suppressed = self._last.get(key, (-float("inf"), 0))
        if now - last < self._interval_s:
            self._last[key] = (last, suppressed + 1)
            return
        self._last[key] = (now, 0)
        if suppressed:
            fmt += f" ({suppressed} similar lines suppressed in the last {self._interval_s:.0f}s)"
        self._log.log(level, fmt, *args)
