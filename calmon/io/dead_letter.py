"""Invalid records forwarded unchanged to ``kafka.dead_letter_topic``, with headers
``calmon-reason`` and ``calmon-source`` (topic/partition/offset), through the
daemon's one producer (``io/outbox.py``)."""

from __future__ import annotations

from calmon.config import KafkaConfig
from calmon.io.outbox import Outbox

REASON_HEADER = "calmon-reason"
SOURCE_HEADER = "calmon-source"


class DeadLetters:
    """Dead letters over an ``Outbox`` (one of its own when given a config)."""

    def __init__(self, outbox: Outbox | KafkaConfig, **settings: float) -> None:
        self.outbox = outbox if isinstance(outbox, Outbox) else Outbox(outbox, **settings)
        self.topic = self.outbox.config.dead_letter_topic

    def send(self, value: bytes | None, reason: str, source: str) -> None:
        """Forward one invalid record's original bytes with its reason and
        ``topic/partition/offset``. A no-op when no dead-letter topic is set."""
        if self.topic is None:
            return
        headers = [(REASON_HEADER, reason.encode()), (SOURCE_HEADER, source.encode())]
        # Kafka needs a key or a value: a null record goes out keyed by its source.
        key = source.encode() if value is None else None
        self.outbox.send(self.topic, key, value, headers, dead_letter=True)

    # what the daemon and the tests read, from the shared producer
    @property
    def delivered(self) -> int:
        return self.outbox.delivered

    @property
    def failed(self) -> int:
        return self.outbox.failed

    @property
    def dead_letters_failed(self) -> int:
        return self.outbox.dead_letters_failed

    @property
    def in_flight(self) -> int:
        return self.outbox.in_flight

    def flush(self, timeout: float | None = 10.0) -> bool:
        return self.outbox.flush(timeout)

    def close(self, timeout: float = 5.0) -> None:
        self.outbox.close(timeout)
