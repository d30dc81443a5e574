"""Invalid records forwarded unchanged to ``kafka.dead_letter_topic``, and the one
producer calmon owns (also used to publish calibrators).

Nothing here raises on broker trouble: a dead letter is a courtesy copy, and
the monitor must keep monitoring when it cannot be delivered. Failures are
counted and logged at most once per ``log_interval_s``.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from kafka import KafkaProducer
from kafka.errors import KafkaError, KafkaTimeoutError

from calmon.config import KafkaConfig
from calmon.io.topics import MIB, client_settings, fetch_bytes

log = logging.getLogger(__name__)

REASON_HEADER = "calmon-reason"
SOURCE_HEADER = "calmon-source"


class DeadLetters:
    """A lazily created KafkaProducer for dead letters and calibrator documents.

    The producer is built on first use, so a deployment without
    ``dead_letter_topic`` and ``calibrators_topic`` never opens a connection.
    Thread-safe: kafka-python producers are, and the counters take a lock
    (delivery callbacks run on kafka-python's I/O thread).
    """

    def __init__(
        self,
        config: KafkaConfig,
        *,
        retry_interval_s: float = 30.0,
        log_interval_s: float = 60.0,
    ) -> None:
        self._config = config
        self._retry_interval_s = retry_interval_s
        self._log_interval_s = log_interval_s
        self._producer: KafkaProducer | None = None
        self._lock = threading.Lock()
        self._paused_until = -float("inf")  # after a blocking failure, skip the producer
        self._last_warning = -float("inf")
        self._closed = False
        self.delivered = 0  # records acknowledged by the broker
        self.failed = 0  # records that will never be delivered

    @property
    def topic(self) -> str | None:
        return self._config.dead_letter_topic

    def send(self, value: bytes | None, reason: str, source: str) -> None:
        """Forward one invalid record's original bytes with its reason and
        ``topic/partition/offset``. A no-op when no dead-letter topic is set."""
        topic = self._config.dead_letter_topic
        if topic is None:
            return
        headers = [(REASON_HEADER, reason.encode()), (SOURCE_HEADER, source.encode())]
        # Kafka needs a key or a value: a null record goes out keyed by its source.
        key = source.encode() if value is None else None
        self._send(topic, key, value, headers)

    def publish(self, topic: str, key: str | bytes | None, value: bytes) -> bool:
        """Queue ``value`` on ``topic`` (e.g. a calibrator keyed ``model/segment``).

        Returns whether it was queued; call ``flush()`` to wait for delivery.
        """
        k = key.encode() if isinstance(key, str) else key
        return self._send(topic, k, value, None)

    def flush(self, timeout: float | None = 10.0) -> bool:
        """Wait up to ``timeout`` seconds for queued records; False if some are
        still pending (they stay queued and may still be delivered)."""
        producer = self._producer
        if producer is None:
            return True
        try:
            producer.flush(timeout=timeout)
        except KafkaError as exc:
            self._warn(f"flush did not finish within {timeout}s: {exc!r}")
            return False
        return True

    def close(self, timeout: float = 5.0) -> None:
        """Flush what can be flushed within ``timeout`` seconds and close."""
        with self._lock:
            self._closed = True
            producer, self._producer = self._producer, None
        if producer is None:
            return
        try:
            producer.close(timeout=timeout)
        except Exception:  # best effort; the process may be exiting
            log.debug("error closing Kafka producer", exc_info=True)

    # ------------------------------------------------------------------ internals

    def _settings(self) -> dict[str, Any]:
        cfg = self._config
        defaults: dict[str, Any] = {
            "client_id": "calmon-producer",
            # Dead letters include oversize records, so allow well past max_record_bytes.
            "max_request_size": max(fetch_bytes(cfg.max_record_bytes), 8 * MIB),
            # JSON compresses well, which also keeps big dead letters under a broker's
            # message.max.bytes (1 MB by default on Apache Kafka).
            "compression_type": "gzip",
            # send() blocks this long when metadata is missing; the poll loop must
            # not stall for kafka-python's default 60 s.
            "max_block_ms": 5000,
            "bootstrap_timeout_ms": 10000,
        }
        accepted = KafkaProducer.DEFAULT_CONFIG
        settings = {k: v for k, v in defaults.items() if k in accepted}
        settings.update(client_settings(cfg.client, accepted, role="producer"))
        settings.update(
            bootstrap_servers=list(cfg.bootstrap_servers),
            key_serializer=None,
            value_serializer=None,
        )
        return settings

    def _new_producer(self) -> Any:
        """The producer of ``kafka.library`` (confluent: kafka-python's calls, librdkafka)."""
        if self._config.library == "confluent":
            from calmon.io.confluent_producer import ConfluentProducer  # extra calmon[fast]

            return ConfluentProducer(self._config)
        return KafkaProducer(**self._settings())

    def _get_producer(self) -> KafkaProducer | None:
        """The producer, built on first use; None while it cannot be built."""
        if self._producer is not None:
            return self._producer
        with self._lock:
            if self._producer is None and not self._closed:
                try:
                    self._producer = self._new_producer()
                except Exception as exc:  # bootstrap timeout, or a bad kafka.client value
                    # Building blocks for bootstrap_timeout_ms; do not retry per record.
                    self._paused_until = time.monotonic() + self._retry_interval_s
                    log.warning(
                        "cannot create Kafka producer for %s: %r; retrying in %.0fs",
                        ",".join(self._config.bootstrap_servers),
                        exc,
                        self._retry_interval_s,
                    )
            return self._producer

    def _send(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        headers: list[tuple[str, bytes]] | None,
    ) -> bool:
        if self._closed or time.monotonic() < self._paused_until:
            self._count_failure(f"record for {topic} dropped: producer unavailable")
            return False
        producer = self._get_producer()
        if producer is None:
            self._count_failure(f"record for {topic} dropped: no producer")
            return False
        try:
            future = producer.send(topic, value=value, key=key, headers=headers)
        except KafkaTimeoutError as exc:
            # Broker unreachable or topic unknown: every send would block again
            # for max_block_ms, so drop records for a while instead.
            self._paused_until = time.monotonic() + self._retry_interval_s
            self._count_failure(
                f"cannot send to {topic}: {exc!r}; dropping for {self._retry_interval_s:.0f}s"
            )
            return False
        except (KafkaError, ValueError, TypeError) as exc:  # e.g. too large: this record only
            self._count_failure(f"cannot send to {topic}: {exc!r}")
            return False
        future.add_callback(self._on_delivered)
        future.add_errback(self._on_error, topic)
        return True

    def _on_delivered(self, _metadata: Any) -> None:
        with self._lock:
            self.delivered += 1

    def _on_error(self, topic: str, exc: Exception) -> None:  # partial(f, topic)(exc)
        self._count_failure(f"delivery to {topic} failed: {exc!r}")

    def _count_failure(self, what: str) -> None:
        with self._lock:
            self.failed += 1
        self._warn(what)

    def _warn(self, what: str) -> None:
        now = time.monotonic()
        if now - self._last_warning >= self._log_interval_s:
            self._last_warning = now
            log.warning("Kafka producer: %s (%d failed so far)", what, self.failed)
