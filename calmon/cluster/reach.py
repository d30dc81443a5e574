"""How far the input partitions reach: the bound on a joined batch's source offsets.

A sender's source range ends at its consumer's position, never past the end of the
input partition it read; an owner that remembered a larger offset would take every
later batch of the model for a copy. The owner asks the broker for the end only when a
batch claims more than it last heard, at most once per poll of the joined topic (a
batch read in that poll was sent before the answer, so the answer bounds it), and reads
the last record batch too: some brokers (Tansu) answer the base offset of the last
batch plus one. When the broker cannot say, the bound is unknown (None), not zero.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from kafka import KafkaConsumer, TopicPartition

log = logging.getLogger(__name__)

READ_LAST_S = 5.0


class InputEnds:
    def __init__(self, settings: dict[str, Any]) -> None:
        self.settings = settings
        self._consumer: KafkaConsumer | None = None
        self._ends: dict[tuple[str, int], int] = {}
        self._asked: dict[tuple[str, int], float] = {}  # monotonic time of the answer
        self.round = 0.0  # monotonic start of the owner's current poll

    def end(self, topic: str, partition: int, claimed: int) -> int | None:
        """The end of ``topic/partition`` as far as it bounds ``claimed``; None when
        the broker cannot say."""
        key = (topic, partition)
        known = self._ends.get(key)
        if known is not None and (claimed <= known or self._asked[key] >= self.round):
            return known  # asked after this poll began: what it says bounds the batch
        try:
            self._ends[key] = self._ask(TopicPartition(topic, partition), claimed)
        except Exception as e:  # a broker hiccup: no bound rather than a wrong one
            log.debug("end offset of %s/%d: %s", topic, partition, e)
            return None
        self._asked[key] = time.monotonic()
        return self._ends[key]

    def _ask(self, tp: TopicPartition, claimed: int) -> int:
        if self._consumer is None:
            self._consumer = KafkaConsumer(enable_auto_commit=False, **self.settings)
        c = self._consumer
        parts = c.partitions_for_topic(tp.topic)
        if parts is None:  # not known (yet) to this client: no bound
            raise LookupError(f"no metadata for {tp.topic}")
        if tp.partition not in parts:
            return 0  # no such partition: nothing was read from it
        end = int(c.end_offsets([tp])[tp])
        if claimed <= end or end <= int(c.beginning_offsets([tp])[tp]):
            return end  # the broker's answer bounds it (the usual case: no read)
        c.assign([tp])
        c.seek(tp, end - 1)
        deadline, got = time.monotonic() + READ_LAST_S, False
        while time.monotonic() < deadline:
            if c.poll(timeout_ms=200, max_records=100_000):
                got = True
            elif got:
                break
        return max(end, int(c.position(tp)))

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None
