"""In-process stand-ins for the daemon's I/O edges (its ``Source`` and its dead-letter
producer), so daemon behaviour is tested in milliseconds; the broker tests stay a
thin layer over the real thing."""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass, field

from calmon.engine.records import Kind, Raw
from calmon.io.kafka_source import Batch

Position = tuple[str, int]
KINDS = {"predictions": Kind.PREDICTION, "labels": Kind.LABEL}


class ListSource:
    """A ``Source`` over in-memory partitions: ``{(topic, partition): [value, ...]}``.

    Polls return at most ``batch`` records, round-robin over partitions; ``assign``
    seeks to the given positions (0 where absent), as the Kafka source does."""

    def __init__(self, partitions: dict[Position, list[bytes | None]], batch: int = 4,
                 timestamp: float | None = None) -> None:
        self.partitions = partitions
        self.batch = batch
        self.timestamp = timestamp
        self.next: dict[Position, int] = {}
        self.assigns = 0
        self.commits: list[dict[Position, int]] = []
        self.lock = threading.Lock()

    def assign(self, positions: dict[Position, int] | None = None, *,
               from_checkpoint: bool = False) -> list[Position]:
        with self.lock:
            self.assigns += 1
            self.next = {p: (positions or {}).get(p, 0) for p in self.partitions}
            return list(self.partitions)

    def poll(self, timeout_ms: int = 0, max_records: int = 5000) -> Batch:
        out = Batch()
        with self.lock:
            for (topic, part), values in sorted(self.partitions.items()):
                start = self.next[(topic, part)]
                take = values[start:start + min(self.batch, max_records)]
                for i, value in enumerate(take):
                    out.records.append(Raw(KINDS[topic], value, self.timestamp,
                                           f"{topic}/{part}/{start + i}"))
                if take:
                    self.next[(topic, part)] = start + len(take)
                    out.positions[(topic, part)] = start + len(take)
        return out

    def commit(self, positions: dict[Position, int]) -> bool:
        self.commits.append(dict(positions))
        return True

    def connected(self) -> bool:
        return True

    def close(self) -> None:
        pass

    def total(self) -> int:
        return sum(len(v) for v in self.partitions.values())


@dataclass
class DeadLetterLog:
    """Records what the daemon dead-letters, as (value, reason, source)."""

    sent: list[tuple[bytes | None, str, str]] = field(default_factory=list)
    dead_letters_failed: int = 0  # nothing fails here

    def send(self, value: bytes | None, reason: str, source: str) -> None:
        self.sent.append((value, reason, source))

    def publish(self, topic: str, key: str | bytes | None, value: bytes) -> bool:
        return True

    def flush(self, timeout: float | None = 10.0) -> bool:
        return True

    def close(self, timeout: float = 5.0) -> None:
        pass

    def reasons(self) -> list[str]:
        return [r for _, r, _ in self.sent]


def partitions_of(predictions: Iterable[bytes], labels: Iterable[bytes]
                  ) -> dict[Position, list[bytes | None]]:
    return {("predictions", 0): list(predictions), ("labels", 0): list(labels)}
