"""Labels handed on no earlier than the predictions they answer, as far as the
consumer can tell: the source-side half of reading a backlog fast.

A consumer catching up on a backlog does not interleave a task's two partitions
by time. On Apache Kafka each fetch hands up to ``max.partition.fetch.bytes`` of
one partition, so librdkafka often delivers a run of labels long before the
predictions they belong to (measured: 38% of 200,000 labels ahead of their
prediction, against 6% on Tansu), and every early label takes the join's slow
path (it waits, one by one, and its prediction later meets it one by one).

Kafka Streams meets this by picking the next record of a task by timestamp
across its partitions (``PartitionGroup``). Here, per partition number: the
predictions are handed on at once and set the partition's *frontier* (the
largest record timestamp handed on); a label waits while its record timestamp
is past the frontier and the predictions partition still has records to fetch
(``lagging``), for at most ``hold_s`` seconds and ``hold_max`` records, so a
quiet or missing predictions stream never holds labels back for long. Within a
poll, predictions come first. Held records are not in any batch yet, so the
positions a checkpoint stores never pass them; a restart reads them again.

The join's results do not depend on the order records come in (within the
TTLs), so this changes its speed, not its counts. Where the two topics have
different partition counts an id's prediction and label are on different
partition numbers, so nothing is held (``pairs`` False); predictions still come
first within a poll.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from calmon.io.source import Chunk

HOLD_MAX = 50_000  # labels held per partition at most (bounded memory)
HOLD_S = 2.0  # the longest a label waits for its partition's predictions


class _Held:
    __slots__ = ("keys", "offsets", "since", "stamps", "values")

    def __init__(self, since: float) -> None:
        self.values: list[bytes | None] = []
        self.stamps: list[int | None] = []
        self.offsets: list[int] = []
        self.keys: list[bytes | None] = []
        self.since = since  # when the oldest held record came


class Pacer:
    """``pace(chunks)`` -> the chunks to hand on now; see the module docstring.

    ``lagging(partition)`` says whether the predictions partition of that number
    still has records the consumer has not fetched."""

    def __init__(self, predictions_topic: str, labels_topic: str,
                 lagging: Callable[[int], bool], *, hold_max: int = HOLD_MAX,
                 hold_s: float = HOLD_S, clock: Callable[[], float] = time.monotonic) -> None:
        self._preds, self._labels = predictions_topic, labels_topic
        self._lagging = lagging
        self._hold_max, self._hold_s, self._clock = hold_max, hold_s, clock
        self._frontier: dict[int, int] = {}
        self._held: dict[int, _Held] = {}
        self.pairs = True  # a label's prediction is on the partition of the same number

    @property
    def holding(self) -> int:
        """Labels held now."""
        return sum(len(h.offsets) for h in self._held.values())

    def clear(self) -> None:
        """Forget what is held (the consumer is re-assigned and seeks again)."""
        self._held.clear()
        self._frontier.clear()

    def pace(self, chunks: list[Chunk]) -> list[Chunk]:
        if not self.pairs:
            return ([c for c in chunks if c[0] != self._labels]
                    + [c for c in chunks if c[0] == self._labels])
        now = self._clock()
        out: list[Chunk] = []
        for chunk in chunks:
            topic, partition, _values, stamps, _offsets, _keys = chunk
            if topic == self._labels:
                held = self._held.get(partition)
                if held is None:
                    held = self._held[partition] = _Held(now)
                held.values += chunk[2]
                held.stamps += stamps
                held.offsets += chunk[4]
                held.keys += chunk[5]
                continue
            out.append(chunk)
            if topic == self._preds:
                top = max((s for s in stamps if s is not None), default=None)
                if top is not None and top > self._frontier.get(partition, -1):
                    self._frontier[partition] = top
        for partition in list(self._held):
            released = self._release(partition, now)
            if released is not None:
                out.append(released)
        return out

    def _release(self, partition: int, now: float) -> Chunk | None:
        held = self._held[partition]
        n = len(held.offsets)
        if (n > self._hold_max or now - held.since >= self._hold_s
                or not self._lagging(partition)):
            cut = n
        else:
            frontier = self._frontier.get(partition, -1)
            cut = 0
            for s in held.stamps:  # a prefix: offsets stay in order
                if s is not None and s > frontier:
                    break
                cut += 1
        if cut == 0:
            return None
        chunk: Chunk = (self._labels, partition, held.values[:cut], held.stamps[:cut],
                        held.offsets[:cut], held.keys[:cut])
        if cut == n:
            del self._held[partition]
        else:
            del held.values[:cut], held.stamps[:cut], held.offsets[:cut], held.keys[:cut]
            held.since = now  # the rest came later than what was just released
        return chunk
