"""The producer of ``kafka.library: confluent`` behind the few kafka-python
``KafkaProducer`` calls that ``DeadLetters`` makes (send with callbacks, flush,
close), raising kafka-python's errors, so dead letters and calibrator documents
behave the same whichever library is chosen.

librdkafka never blocks in ``produce()`` and connects lazily, so two
kafka-python behaviours are rebuilt here: the constructor waits up to
``bootstrap_timeout_ms`` (a calmon key of ``kafka.client``) for the broker's
metadata and raises when it does not come, and a full local queue raises
``KafkaTimeoutError`` like a ``send()`` that ran out of ``max_block_ms``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaException, Producer
from kafka.errors import KafkaError, KafkaTimeoutError

from calmon.config import KafkaConfig
from calmon.io.confluent_settings import LibrdkafkaLog, librdkafka_settings
from calmon.io.topics import MIB, fetch_bytes

log = logging.getLogger(__name__)


class Delivery:
    """The outcome of one produce: kafka-python's ``add_callback`` / ``add_errback``.

    Delivery reports come on whichever thread serves librdkafka's queue (a later
    send, or flush), possibly before the callbacks are added: the outcome is
    kept and late callbacks run at once.
    """

    __slots__ = ("_done", "_errbacks", "_error", "_lock", "_oks", "_value")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._done = False
        self._error: Exception | None = None
        self._value: Any = None
        self._oks: list[Callable[[Any], Any]] = []
        self._errbacks: list[Callable[[Exception], Any]] = []

    def add_callback(self, fn: Callable[..., Any], *args: Any) -> None:
        self._add(lambda v: fn(*args, v), ok=True)

    def add_errback(self, fn: Callable[..., Any], *args: Any) -> None:
        self._add(lambda e: fn(*args, e), ok=False)

    def _add(self, fn: Callable[[Any], Any], *, ok: bool) -> None:
        with self._lock:
            if not self._done:
                (self._oks if ok else self._errbacks).append(fn)
                return
        error = self._error
        if ok and error is None:
            fn(self._value)
        elif not ok and error is not None:
            fn(error)

    def report(self, err: Any, msg: Any) -> None:  # librdkafka's on_delivery(err, msg)
        with self._lock:
            self._done = True
            if err is not None:
                self._error = KafkaError(str(err))
            else:
                self._value = msg
            fns = self._errbacks if err is not None else self._oks
            self._oks, self._errbacks = [], []
        outcome: Any = self._error if err is not None else msg
        for fn in fns:
            fn(outcome)


def producer_settings(config: KafkaConfig) -> dict[str, Any]:
    """librdkafka settings of calmon's producer (defaults as ``DeadLetters._settings``)."""
    settings: dict[str, Any] = {
        "client.id": "calmon-producer",
        # dead letters include oversize records, so allow well past max_record_bytes
        "message.max.bytes": max(fetch_bytes(config.max_record_bytes), 8 * MIB),
        "compression.type": "gzip",
        "message.timeout.ms": 120_000,  # kafka-python's delivery_timeout_ms default
        "logger": LibrdkafkaLog(),
    }
    settings.update(librdkafka_settings(config.client, role="producer"))
    settings["bootstrap.servers"] = ",".join(config.bootstrap_servers)
    return settings


class ConfluentProducer:
    """A librdkafka ``Producer`` with the ``KafkaProducer`` calls ``DeadLetters`` uses."""

    def __init__(self, config: KafkaConfig) -> None:
        bootstrap_s = float(config.client.get("bootstrap_timeout_ms", 10_000)) / 1000.0
        try:
            self._producer = Producer(producer_settings(config))
            # kafka-python fails here when the broker is unreachable; do the same, so
            # that DeadLetters drops records for a while instead of queueing them
            self._producer.list_topics(timeout=bootstrap_s)
        except KafkaException as exc:
            raise KafkaError(f"librdkafka producer: {exc}") from None

    def send(self, topic: str, value: bytes | None = None, key: bytes | None = None,
             headers: list[tuple[str, str | bytes | None]] | None = None) -> Delivery:
        delivery = Delivery()
        try:
            self._producer.produce(topic, value=value, key=key,
                                   headers=list(headers) if headers else None,
                                   on_delivery=delivery.report)
        except BufferError as exc:  # the local queue is full: the broker is not taking them
            raise KafkaTimeoutError(f"librdkafka queue full: {exc}") from None
        except KafkaException as exc:  # e.g. larger than message.max.bytes: this record only
            raise KafkaError(str(exc)) from None
        self._producer.poll(0)  # serve delivery reports of earlier records
        return delivery

    def flush(self, timeout: float | None = None) -> None:
        left = self._producer.flush(-1 if timeout is None else timeout)
        if left:
            raise KafkaTimeoutError(f"{left} records still queued after {timeout}s")

    def close(self, timeout: float | None = None) -> None:
        # librdkafka has no close: flush what fits in timeout; the rest is dropped
        self._producer.flush(-1 if timeout is None else timeout)

