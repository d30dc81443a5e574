"""The one Kafka producer calmon owns, with delivery accounting: dead letters
(``io/dead_letter.py``) and calibrator documents (``io/calibrator_publisher.py``)
both go out through it, so calmon opens one producer connection.

Nothing here raises on broker trouble: a dead letter is a courtesy copy, and
the monitor must keep monitoring when it cannot be delivered. Failures are
counted (``dead_letters_failed``: ``calmon_dead_letters_failed_total``) and
logged at most once per ``log_interval_s``.

Every record handed over is *settled* once the broker acknowledged it or the
producer gave up on it (counted as failed). ``flush()`` is True only when
everything handed over so far is settled: the daemon checkpoints only then, so
a checkpoint never moves offsets past a dead letter still in flight.
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



class Outbox:
    """A lazily created producer (of ``kafka.library``) with delivery accounting.

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
        self.config = config
        self._retry_interval_s = retry_interval_s
        self._log_interval_s = log_interval_s
        self._producer: KafkaProducer | None = None
        self._lock = threading.Lock()
        self._settled = threading.Condition(self._lock)
        self._in_flight = 0  # queued in the producer, neither acknowledged nor failed
        self._paused_until = -float("inf")  # after a blocking failure, skip the producer
        self._last_warning = -float("inf")
        self._closed = False
        self.delivered = 0  # records acknowledged by the broker
        self.failed = 0  # records that will never be delivered
        self.dead_letters_failed = 0  # of those, dead letters (the rest: calibrators)

    @property
    def in_flight(self) -> int:
        """Records handed to the producer and not yet acknowledged or failed."""
        with self._lock:
            return self._in_flight

    def flush(self, timeout: float | None = 10.0) -> bool:
        """Wait up to ``timeout`` seconds until every record handed over is settled
        (acknowledged, or failed and counted); False if some are still in flight
        (they stay queued and may still be delivered)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        producer = self._producer
        if producer is not None:
            try:
                producer.flush(timeout=timeout)
            except KafkaError as exc:
                self._warn(f"flush did not finish within {timeout}s: {exc!r}")
                return False
        # callbacks run on the producer's I/O thread, maybe just after flush returned
        with self._settled:
            while self._in_flight > 0:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    self._warn(f"{self._in_flight} records still in flight after {timeout}s")
                    return False
                self._settled.wait(left)
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
        cfg = self.config
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
        if self.config.library == "confluent":
            from calmon.io.confluent_producer import ConfluentProducer  # extra calmon[fast]

            return ConfluentProducer(self.config)
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
                        ",".join(self.config.bootstrap_servers),
                        exc,
                        self._retry_interval_s,
                    )
            return self._producer

    def send(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        headers: list[tuple[str, bytes]] | None,
        *,
        dead_letter: bool = False,
    ) -> bool:
        """Queue one record; ``dead_letter`` says which failure counter it is in.
        Returns whether it was queued; ``flush()`` waits for delivery."""
        if self._closed or time.monotonic() < self._paused_until:
            self._count_failure(f"record for {topic} dropped: producer unavailable", dead_letter)
            return False
        producer = self._get_producer()
        if producer is None:
            self._count_failure(f"record for {topic} dropped: no producer", dead_letter)
            return False
        with self._lock:
            self._in_flight += 1  # before send(): the callback may run before it returns
        try:
            future = producer.send(topic, value=value, key=key, headers=headers)
        except KafkaTimeoutError as exc:
            # Broker unreachable or topic unknown: every send would block again
            # for max_block_ms, so drop records for a while instead.
            self._paused_until = time.monotonic() + self._retry_interval_s
            self._count_failure(
                f"cannot send to {topic}: {exc!r}; dropping for {self._retry_interval_s:.0f}s",
                dead_letter, settle=True)
            return False
        except (KafkaError, ValueError, TypeError) as exc:  # e.g. too large: this record only
            self._count_failure(f"cannot send to {topic}: {exc!r}", dead_letter, settle=True)
            return False
        except BaseException:
            self._settle()
            raise
        future.add_callback(self._on_delivered)
        future.add_errback(self._on_error, topic, dead_letter)
        return True

    def _settle(self) -> None:
        with self._settled:
            self._in_flight -= 1
            self._settled.notify_all()

    def _on_delivered(self, _metadata: Any) -> None:
        with self._settled:
            self.delivered += 1
            self._in_flight -= 1
            self._settled.notify_all()

    def _on_error(self, topic: str, dead_letter: bool, exc: Exception) -> None:
        self._count_failure(f"delivery to {topic} failed: {exc!r}", dead_letter, settle=True)

    def _count_failure(self, what: str, dead_letter: bool, *, settle: bool = False) -> None:
        with self._settled:
            self.failed += 1
            self.dead_letters_failed += dead_letter
            if settle:
                self._in_flight -= 1
                self._settled.notify_all()
        self._warn(what)

    def _warn(self, what: str) -> None:
        now = time.monotonic()
        if now - self._last_warning >= self._log_interval_s:
            self._last_warning = now
            log.warning("Kafka producer: %s (%d failed so far)", what, self.failed)
