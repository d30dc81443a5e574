"""Error text shown to users names the error once."""

from __future__ import annotations

from kafka.errors import KafkaTimeoutError

from calmon.errors import describe


def test_a_kafka_error_is_named_once() -> None:
    """Was "KafkaTimeoutError: KafkaTimeoutError: Unable to bootstrap from [...]"."""
    e = KafkaTimeoutError("Unable to bootstrap from ['127.0.0.1:9']")
    assert describe(e) == "KafkaTimeoutError: Unable to bootstrap from ['127.0.0.1:9']"
    assert describe(KafkaTimeoutError()) == "KafkaTimeoutError"
    assert describe(OSError(98, "Address in use")) == "OSError: [Errno 98] Address in use"
    assert describe(ValueError("")) == "ValueError"
