"""Published calibrator documents onto ``kafka.calibrators_topic``, keyed
``<model>/<segment>``, so serving code can follow them; through the daemon's one
producer (``io/outbox.py``). The bytes are the registry's (``recal/registry.py``), signed
there with ``calibrators.signing_key`` when set: the file and the record are one document."""

from __future__ import annotations

from typing import Any

from calmon.io.outbox import Outbox


class CalibratorPublisher:
    """The registry's publish callback for one topic: each document keyed
    ``<model>/<segment>``."""

    def __init__(self, outbox: Outbox, topic: str) -> None:
        self.outbox = outbox
        self.topic = topic

    def __call__(self, model: str, segment: str, _doc: dict[str, Any], data: bytes) -> bool:
        """Queue the document's bytes; False when the producer could not take it
        (counted)."""
        return self.outbox.send(self.topic, f"{model}/{segment}".encode(), data, None)
