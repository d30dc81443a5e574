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
        self._read: dict[tuple[str, int], float] = {}  # monotonic time of the last read
        self.round = 0.0  # monotonic start of the owner's current poll

    def end(self, topic: str, partition: int, claimed: int) -> int | None:
        """The end of ``topic/partition`` as far as it bounds ``claimed``; None when
        the broker cannot say."""
        key = (topic, partition)
        known = self._ends.get(key)
        if known is not None and (claimed <= known or self._read.get(key, 0.0) >= self.round):
            return known  # read to its true end after this poll began: it bounds the batch
        try:
            end, read = self._ask(TopicPartition(topic, partition), claimed)
        except Exception as e:  # a broker hiccup: no bound rather than a wrong one
            log.debug("end offset of %s/%d: %s", topic, partition, e)
            return None
        self._ends[key] = end
        if read:
            self._read[key] = time.monotonic()
        return end

    def _ask(self, tp: TopicPartition, claimed: int) -> tuple[int, bool]:
        """The end, and whether it was read to the true end (not only the broker's
        answer, which may fall short)."""
        if self._consumer is None:
            self._consumer = KafkaConsumer(enable_auto_commit=False, **self.settings)
        c = self._consumer
        parts = c.partitions_for_topic(tp.topic)
        if parts is None:  # not known (yet) to this client: no bound
            raise LookupError(f"no metadata for {tp.topic}")
        if tp.partition not in parts:
            return 0, True  # no such partition: nothing was read from it
        end = int(c.end_offsets([tp])[tp])
        if claimed <= end:
            return end, False  # the broker's answer bounds it (the usual case: no read)
        if end <= int(c.beginning_offsets([tp])[tp]):
            return end, True  # empty
        c.assign([tp])
        c.seek(tp, end - 1)
        deadline, got = time.monotonic() + READ_LAST_S, False
        while time.monotonic() < deadline:
            if c.poll(timeout_ms=200, max_records=100_000):
                got = True
            elif got:
                break
        if not got:  # the last batch did not come: no bound rather than a short one
            raise TimeoutError(f"the last batch of {tp.topic}/{tp.partition} did not come")
        return max(end, int(c.position(tp))), True

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None
