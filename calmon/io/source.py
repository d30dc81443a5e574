"""What every Kafka source of calmon shares, whichever client library reads:
the poll result types, the error and the small interface (the library of
``kafka.library`` is picked where the consumer process starts its source:
``calmon.io.consumer_process.make_source``).

A source reads ``predictions_topic`` and ``labels_topic`` by static assignment
and returns each poll as per-partition columns (``Chunk``), which ``to_batch``
turns into ``Raw`` records whose ``source`` is ``topic/partition/offset``: the
same strings and next offsets whichever library read them, so checkpoints and
dead letters do not depend on the choice.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

from calmon.config import KafkaConfig
from calmon.engine.rawbatch import RawBatch
from calmon.engine.records import Kind, Raw
from calmon.errors import CalmonError
from calmon.io import start
from calmon.io.start import Start
from calmon.io.topics import copartition_problem, owned_partitions

log = logging.getLogger(__name__)

Position = tuple[str, int]  # (topic, partition)

# One partition's records of a poll: (topic, partition, values, timestamps in ms, offsets,
# keys)
Chunk = tuple[str, int, list[bytes | None], list[int | None], list[int], list[bytes | None]]

MISSING_TOPIC_GRACE_S = 5.0  # how long a topic the broker does not list may take to appear
START_PARTITIONS_SHOWN = 8  # per topic in the start log line; the rest summed
STUCK_AFTER_S = 30.0  # polls failing this long while connected: the source says it is stuck


class Skip(NamedTuple):
    """Offsets ``[first, next_offset)`` of a partition that gave no record to count:
    a batch that could not be decoded (``bad_batch``), one that inflates past the
    bound (``batch_oversize``), or a value too large to carry (``oversize``, one
    offset). The daemon counts each once under ``reason`` and dead-letters ``value``
    (the batch or record as fetched, when it was small enough to keep); an empty
    ``reason`` only moves the position (a skip counted before)."""

    topic: str
    partition: int
    first: int
    next_offset: int
    reason: str
    detail: str
    value: bytes | None


class KafkaSourceError(CalmonError):
    """Raised by ``assign`` when the broker cannot be reached in time or a
    configured topic does not exist."""


class KafkaAuthError(KafkaSourceError):
    """Raised by ``assign`` when the broker rejects calmon's credentials or calmon does
    not trust the broker's certificate: the message names the ``kafka.client``
    setting to fix (retrying cannot help)."""


class CoPartitionError(KafkaSourceError):
    """Raised by ``assign`` when ``kafka.instance.count > 1`` and the two input topics
    have different partition counts (the message says what to do)."""


@dataclass(slots=True)
class Batch:
    """What one poll returned, in poll order, and the next offset of every
    partition that appears in it: as ``Raw`` records, or (``raw``) as the columns
    the engine reads without building a record object each."""

    records: list[Raw] = field(default_factory=list)
    positions: dict[Position, int] = field(default_factory=dict)
    raw: RawBatch | None = None
    skipped: list[Skip] = field(default_factory=list)  # counted, not fed (see Skip)

    def __len__(self) -> int:
        return len(self.raw) if self.raw is not None else len(self.records)

    def add_skips(self, skips: list[Skip]) -> None:
        """Skipped offsets: counted by the daemon, and the positions move past them."""
        self.skipped.extend(skips)
        for s in skips:
            key = (s.topic, s.partition)
            if s.next_offset > s.first >= 0:
                self.positions[key] = max(self.positions.get(key, 0), s.next_offset)

    def columns(self) -> RawBatch:
        return self.raw if self.raw is not None else RawBatch.of(self.records)


def to_batch(chunks: list[Chunk], kinds: dict[str, Kind], columns: bool = False) -> Batch:
    """Chunks -> records in poll order (``Raw`` records, or with ``columns`` a
    ``RawBatch``), and the next offset of each partition."""
    batch = Batch()
    if columns:
        raw = batch.raw = RawBatch()
        for topic, partition, values, stamps, offsets, keys in chunks:
            raw.add_partition(kinds[topic], topic, partition, values, stamps, offsets, keys)
            batch.positions[(topic, partition)] = offsets[-1] + 1
        return batch
    records = batch.records
    new = tuple.__new__  # Raw's own __new__, minus a Python-level call per record
    for topic, partition, values, stamps, offsets, keys in chunks:
        kind = kinds[topic]
        prefix = f"{topic}/{partition}/"
        records.extend([
            new(Raw, (kind, value, ts / 1000.0 if ts is not None and ts >= 0 else None,
                      f"{prefix}{offset}", key))
            for value, ts, offset, key in zip(values, stamps, offsets, keys)])
        batch.positions[(topic, partition)] = offsets[-1] + 1
    return batch


class SourceBase:
    """What every library's source shares: which topic is which kind, the partitions
    the last ``assign`` took, and ``poll`` as ``poll_chunks`` made into records."""

    def __init__(self, config: KafkaConfig) -> None:
        self._kinds = {config.predictions_topic: Kind.PREDICTION,
                       config.labels_topic: Kind.LABEL}
        self._instance = config.static
        self._owned: list[Position] = []
        self._problem: str | None = None  # why the topics cannot be split, as last seen
        self._skips: list[Skip] = []
        self._down_since: float | None = None  # monotonic time trouble began
        self._last_failed = 0.0  # monotonic time of the latest trouble
        self._last_trouble = ""
        # where the last assign starts each owned partition (calmon.io.start), when known
        self.starts: dict[Position, Start] = {}

    def _say_starts(self, group: str | None, reset: str) -> None:
        """Log where this run starts reading (``starts``), per topic: the rule a user
        must be able to predict, and a warning when the topics hold records but the
        run will read none of them (a second run from a group's committed offsets)."""
        for topic, role in self._roles().items():
            mine = [(p, st) for (t, p), st in sorted(self.starts.items()) if t == topic]
            if not mine:
                continue
            shown = "; ".join(start.listed(topic, mine, group, reset, START_PARTITIONS_SHOWN))
            log.info("start of the %s topic: %s", role, shown)
            causes = start.none_ahead([st for _, st in mine], group)
            if causes is not None:
                log.warning("the %s topic %r holds %d records and this run reads none of "
                            "them: %s; a new kafka.group_id with auto_offset_reset earliest "
                            "(and an empty state.dir) reads them again", role, topic,
                            sum(st.held for _, st in mine), causes)

    def _roles(self) -> dict[str, str]:
        return {t: ("predictions" if k is Kind.PREDICTION else "labels")
                for t, k in self._kinds.items()}

    def _plan(self, parts: dict[str, set[int]]) -> list[Position]:
        """The partitions this instance owns of both topics, sorted. Raises
        CoPartitionError when several instances cannot split the topics."""
        pred, lab = self._kinds
        problem = copartition_problem((pred, len(parts[pred])), (lab, len(parts[lab])),
                                      self._instance)
        if problem is not None:
            raise CoPartitionError(problem)
        return sorted((t, p) for t in self._kinds
                      for p in owned_partitions(parts[t], self._instance))

    def _partition_sets(self) -> dict[str, set[int]] | None:
        """Both topics' partition ids as the client's metadata has them now, without
        waiting long; None when it cannot say."""
        raise NotImplementedError

    def _add(self, new: list[Position]) -> None:
        """Start reading partitions that appeared, from their beginning."""
        raise NotImplementedError

    def refresh(self) -> str | None:
        """At a metadata refresh: partitions added to the topics are taken (when both
        topics still co-partition) and read from their first record, which is newer
        than anything read so far. Returns the co-partitioning problem (the
        assignment is then left as it is), or None."""
        try:
            parts = self._partition_sets()
        except CalmonError as e:
            log.debug("cannot refresh partitions: %s", e)
            parts = None
        if parts is None:
            return self._problem  # no answer now: as last seen
        try:
            owned = self._plan(parts)
        except CoPartitionError as e:
            if self._problem != str(e):
                log.error("%s; reading on with the partitions assigned so far", e)
            self._problem = str(e)
            return self._problem
        if self._problem is not None:
            log.warning("the input topics co-partition again")
            self._problem = None
        new = sorted(set(owned) - set(self._owned))
        if new:
            self._add(new)
            self._owned = sorted(set(self._owned) | set(new))
            log.warning("partitions added to the input topics: now reading %s from their "
                        "beginning", new)
        return None

    def take_skips(self) -> list[Skip]:
        """What the polls since the last call skipped (see Skip), oldest first."""
        out, self._skips = self._skips, []
        return out

    def stuck(self) -> str | None:
        """Why no record has come for ``STUCK_AFTER_S`` while polls fail (a batch the
        library raises on at the same offset every poll, say), or None."""
        since, now = self._down_since, time.monotonic()
        if (since is None or now - since < STUCK_AFTER_S
                or now - self._last_failed > STUCK_AFTER_S):  # failing no more
            return None
        return f"no record read for {now - since:.0f}s: {self._last_trouble}"

    @property
    def owned(self) -> list[Position]:
        """The partitions taken by the last ``assign()`` (empty before)."""
        return list(self._owned)

    def poll_chunks(self, timeout_ms: int = 1000, max_records: int = 500) -> list[Chunk]:
        raise NotImplementedError

    def poll(self, timeout_ms: int = 1000, max_records: int = 500) -> Batch:
        """Up to ``max_records`` records, waiting at most about ``timeout_ms``. Never
        raises on broker trouble: it logs (rate-limited) and returns an empty batch."""
        batch = to_batch(self.poll_chunks(timeout_ms, max_records), self._kinds)
        batch.add_skips(self.take_skips())
        return batch


class ChunkSource(Protocol):
    """A static-assignment consumer of both input topics (one per client library).

    Not thread-safe: assign, poll_chunks, commit and close belong to one thread;
    ``connected()`` only reads a flag and may be called from another.
    """

    def assign(self, positions: dict[Position, int] | None = None, *,
               from_checkpoint: bool = False) -> list[Position]:
        """Take this instance's partitions and seek: a stored position first; else the
        group's committed offset, else ``auto_offset_reset`` (with ``from_checkpoint``:
        straight to ``auto_offset_reset``). Returns the owned partitions, sorted.
        Raises KafkaSourceError when the broker stays unreachable or a topic is missing."""
        ...

    @property
    def owned(self) -> list[Position]: ...

    def poll(self, timeout_ms: int = 1000, max_records: int = 500) -> Batch: ...

    def poll_chunks(self, timeout_ms: int = 1000, max_records: int = 500) -> list[Chunk]:
        """One poll as per-partition columns, offsets ascending within a partition.
        Never raises on broker trouble (logs, returns [])."""
        ...

    def commit(self, positions: dict[Position, int]) -> bool:
        """Commit next offsets of owned partitions to the group (lag monitoring, and the
        start of a run without a checkpoint: README "Where a run starts");
        False when it failed or cannot be done now. Never raises on broker trouble."""
        ...

    def end_offsets(self) -> dict[Position, int]:
        """End offsets (the offset of the next record) of the owned partitions, for the
        lag gauge; empty when the broker does not answer quickly."""
        ...

    def refresh(self) -> str | None:
        """Compare both topics' partitions with the assignment again (see
        ``SourceBase.refresh``); returns the co-partitioning problem or None."""
        ...

    def connected(self) -> bool: ...

    def take_skips(self) -> list[Skip]:
        """Offsets the polls since the last call passed without a record (see Skip)."""
        ...

    def stuck(self) -> str | None:
        """Why polls have failed for a while with the broker reachable, or None."""
        ...

    def close(self) -> None: ...
