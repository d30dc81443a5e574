"""Group mode's checkpoint transaction with ``kafka.library: confluent``: librdkafka's
transactional producer behind the kafka-python calls ``Changelog.commit`` makes, so the
records (keys, headers, chunks), the offsets named by their checkpoints and the
handling of a failed transaction (abort, else a new producer: ``Changelog._drop``) are
the same code for both libraries. A restore reads with kafka-python either way.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from confluent_kafka import KafkaException, Producer, TopicPartition
from kafka.errors import KafkaError, KafkaTimeoutError

from calmon.config import KafkaConfig
from calmon.io.changelog import TRANSACTION_TIMEOUT_MS, Changelog, ChangelogError
from calmon.io.confluent_producer import producer_settings

CALL_TIMEOUT_S = 15.0  # init, offsets, commit, abort: librdkafka waits forever by default


def txn_settings(cfg: KafkaConfig, transactional_id: str) -> dict[str, Any]:
    """calmon's producer settings (``kafka.client`` translated), transactional: the
    properties a transaction needs win over the client's."""
    settings = producer_settings(cfg)
    settings.update({"client.id": "calmon-changelog", "transactional.id": transactional_id,
                     "transaction.timeout.ms": TRANSACTION_TIMEOUT_MS,
                     # librdkafka refuses a message timeout past the transaction's
                     "message.timeout.ms": TRANSACTION_TIMEOUT_MS,
                     "enable.idempotence": True, "acks": "all"})
    return settings


class TxnProducer:
    """A librdkafka transactional ``Producer`` with the ``KafkaProducer`` calls of
    ``Changelog``; its errors are kafka-python's ``KafkaError``."""

    def __init__(self, cfg: KafkaConfig, transactional_id: str) -> None:
        try:
            self._p = Producer(txn_settings(cfg, transactional_id))
            self._p.init_transactions(CALL_TIMEOUT_S)
        except (KafkaException, ValueError, TypeError) as e:
            raise ChangelogError(f"cannot start the changelog producer: {e}") from e

    def begin_transaction(self) -> None:
        self._call(self._p.begin_transaction)

    def send(self, topic: str, *, key: bytes | None = None, value: bytes | None = None,
             partition: int | None = None, headers: list[tuple[str, bytes]] | None = None
             ) -> Delivery:
        delivery = Delivery(self._p)
        kwargs: dict[str, Any] = {"key": key, "value": value, "headers": headers,
                                  "on_delivery": delivery}
        if partition is not None:
            kwargs["partition"] = partition
        deadline = time.monotonic() + TRANSACTION_TIMEOUT_MS / 1000
        while True:
            try:
                self._p.produce(topic, **kwargs)
                break
            except BufferError:  # the local queue is full: let some be delivered first
                if time.monotonic() > deadline:
                    raise KafkaTimeoutError("librdkafka queue full") from None
                self._p.poll(0.1)
            except KafkaException as e:
                raise KafkaError(str(e)) from None
        self._p.poll(0)  # serve delivery reports
        return delivery

    def send_offsets_to_transaction(self, offsets: Mapping[Any, Any],
                                    group_metadata: Any) -> None:
        """kafka-python's {TopicPartition: OffsetAndMetadata}, with their metadata."""
        tps = [TopicPartition(tp.topic, tp.partition, om.offset, metadata=om.metadata)
               for tp, om in offsets.items()]
        self._call(self._p.send_offsets_to_transaction, tps, group_metadata, CALL_TIMEOUT_S)

    def commit_transaction(self) -> None:
        self._call(self._p.commit_transaction, CALL_TIMEOUT_S)

    def abort_transaction(self) -> None:
        self._call(self._p.abort_transaction, CALL_TIMEOUT_S)

    def close(self, timeout: float | None = None) -> None:
        # librdkafka has no close: what is queued is flushed, the handle freed with it
        self._p.flush(0 if timeout is None else timeout)

    @staticmethod
    def _call(fn: Any, *args: Any) -> None:
        try:
            fn(*args)
        except KafkaException as e:  # fenced, generation moved, broker trouble, timeout
            raise KafkaError(str(e)) from None


class Delivery:
    """A record's delivery, as kafka-python's future answers it (``get().offset``):
    the changelog's local cache starts reading after the last record a commit wrote."""

    def __init__(self, producer: Any) -> None:
        self._p = producer
        self.offset: int | None = None
        self.error: Any = None

    def __call__(self, err: Any, msg: Any) -> None:
        if err is not None:
            self.error = err
        else:
            self.offset = int(msg.offset())

    def get(self, timeout: float = 1.0) -> Delivery:
        deadline = time.monotonic() + timeout
        while self.offset is None and self.error is None and time.monotonic() < deadline:
            self._p.poll(0.05)  # serves delivery reports (a committed transaction has them)
        if self.offset is None:
            raise KafkaError(f"record not delivered: {self.error}")
        return self


class ConfluentChangelog(Changelog):
    """``Changelog`` whose transactions go through librdkafka."""

    def _new_producer(self) -> Any:
        return TxnProducer(self.cfg, self.transactional_id)
