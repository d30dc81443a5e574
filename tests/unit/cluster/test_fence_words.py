"""A fence kafka-python reports as a bare KafkaError is a lost ownership, whether its
transaction manager still holds the error or its background sender already moved on."""

from __future__ import annotations

from types import SimpleNamespace

from kafka.errors import KafkaError, ProducerFencedError

from calmon.cluster.kafka import _fenced

BARE = KafkaError("Cannot execute transactional method because we are in an error state: "
                  "[Error 90] ProducerFencedError")


def producer(last: object) -> SimpleNamespace:
    return SimpleNamespace(_transaction_manager=SimpleNamespace(last_error=lambda: last))


def test_the_broker_error_itself_is_a_fence() -> None:
    assert _fenced(producer(None), ProducerFencedError())


def test_a_bare_error_is_a_fence_with_or_without_the_managers_record() -> None:
    assert _fenced(producer(ProducerFencedError()), BARE)
    assert _fenced(producer(None), BARE)  # the manager's error already reset


def test_other_errors_stay_failures() -> None:
    other = KafkaError("Cannot execute transactional method because we are in an error "
                       "state: [Error 7] RequestTimedOutError")
    assert not _fenced(producer(None), other)
    assert not _fenced(producer(None), RuntimeError("ProducerFencedError"))
