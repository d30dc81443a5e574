"""Group mode's source with ``kafka.library: confluent`` (contract §8): ``GroupSource``'s
interface and flow over two librdkafka consumers.

- the *predictions* consumer subscribes with the consumer-group protocol (static
  membership with ``group.instance.id``); librdkafka runs ``on_assign`` /
  ``on_revoke`` / ``on_lost`` inside ``consume`` on the calling thread, and they only
  note the event (confluent-kafka then assigns or unassigns the partitions itself),
  which ``GroupSource._handle_events`` hands to the hooks after the poll, as with
  kafka-python;
- the *labels* consumer has no group: a labels partition is assigned by hand, at its
  task's position, once the task is restored (so it needs no pausing meanwhile), and
  unassigned when the task goes.

librdkafka's positions count what it handed out, keepalive's held records included,
so the next offset the loop reads is kept here (``_next``).
"""

from __future__ import annotations

import logging
import sys
import time
import uuid
from typing import Any

from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_END,
    Consumer,
    KafkaException,
    Message,
    TopicPartition,
)

from calmon.config import KafkaConfig
from calmon.io.changelog import ChangelogError
from calmon.io.confluent_settings import GROUP_PROPERTIES, LibrdkafkaLog, librdkafka_settings
from calmon.io.confluent_source import _chunks, skip_past
from calmon.io.group_source import COMMITTED_TIMEOUT_MS, ENDS_EVERY_S, GroupSource, Hooks, Offsets
from calmon.io.source import Chunk, CoPartitionError, KafkaSourceError, Skip
from calmon.io.topics import copartition_problem, fetch_bytes

log = logging.getLogger(__name__)

KEEPALIVE_RECORDS = 500  # at most this many records held by each keepalive
ERROR_LOG_S = 60.0  # a consume error logged at most this often
_MAGIC = b"CGMDv2:"  # librdkafka's serialized group metadata: magic, int32 generation, ...


def generation(meta: bytes) -> int | None:
    """The generation in librdkafka's serialized group metadata (what
    ``consumer_group_metadata()`` returns: the magic, then the generation as a native
    int32, then the group and member ids), or None in a format not known here."""
    if not isinstance(meta, bytes) or not meta.startswith(_MAGIC) or len(meta) < 11:
        return None
    return int.from_bytes(meta[7:11], sys.byteorder, signed=True)


class ConfluentGroupSource(GroupSource):
    """``GroupSource`` with librdkafka consumers (its kafka-python ones stay None)."""

    def __init__(self, cfg: KafkaConfig, hooks: Hooks, *,
                 metadata_timeout_s: float = 30.0) -> None:
        super().__init__(cfg, hooks, metadata_timeout_s=metadata_timeout_s)
        self.cpreds: Consumer | None = None
        self.clabels: Consumer | None = None
        self._labels_on: set[int] = set()  # labels partitions assigned (tasks restored)
        self._next: dict[tuple[str, int], int] = {}  # the next offset the loop reads
        self._held: list[Message] = []  # read by keepalive, handed out by the next poll
        self._error_at = -float("inf")
        self._bad_batch: dict[tuple[str, int], tuple[int, int]] = {}  # see skip_past

    def _settings(self, *, group: bool) -> dict[str, Any]:
        cfg = self.cfg
        size = fetch_bytes(cfg.max_record_bytes)
        fetch_max = max(50 * 1024 * 1024, size)
        out: dict[str, Any] = {
            "client.id": "calmon-group" if group else "calmon-group-labels",
            "max.partition.fetch.bytes": size, "fetch.max.bytes": fetch_max,
            "receive.message.max.bytes": max(100_000_000, fetch_max + 512),
            "allow.auto.create.topics": False,
            "fetch.queue.backoff.ms": 10,  # as ConfluentSource: no 1 s stall per refill
            "logger": LibrdkafkaLog(),
        }
        out.update(librdkafka_settings(cfg.client, role="consumer"))
        if not group:
            for key in GROUP_PROPERTIES:
                out.pop(key, None)
        out.update({
            "bootstrap.servers": ",".join(cfg.bootstrap_servers),
            # the labels consumer never joins: a group of its own that commits nothing
            "group.id": cfg.group_id if group else f"calmon-nogroup-{uuid.uuid4().hex}",
            "enable.auto.commit": False, "enable.auto.offset.store": False,
            "auto.offset.reset": cfg.auto_offset_reset, "enable.partition.eof": False})
        return out

    def start(self) -> int:
        try:
            self.cpreds = Consumer(self._settings(group=True))
            self.clabels = Consumer(self._settings(group=False))
            counts = [self._partitions(self.cpreds, self.cfg.predictions_topic),
                      self._partitions(self.clabels, self.cfg.labels_topic)]
        except (KafkaException, ValueError, TypeError) as e:
            self.close()
            raise KafkaSourceError(f"librdkafka consumer on "
                                   f"{','.join(self.cfg.bootstrap_servers)}: {e}") from e
        except KafkaSourceError:
            self.close()
            raise
        problem = copartition_problem((self.cfg.predictions_topic, counts[0]),
                                      (self.cfg.labels_topic, counts[1]), "group")
        if problem is not None:
            self.close()
            raise CoPartitionError(problem)
        self.partitions = counts[0]
        self.cpreds.subscribe([self.cfg.predictions_topic], on_assign=self._on_assign,
                              on_revoke=self._on_revoke, on_lost=self._on_lost)
        return self.partitions

    def _partitions(self, consumer: Consumer, topic: str) -> int:
        deadline = time.monotonic() + self.metadata_timeout_s
        while time.monotonic() < deadline:
            try:
                meta = consumer.list_topics(topic, timeout=2.0).topics.get(topic)
            except KafkaException:
                meta = None
            if meta is not None and meta.error is None and meta.partitions:
                return len(meta.partitions)
            time.sleep(0.2)
        raise KafkaSourceError(f"topic {topic!r} does not exist (or is not visible) on "
                               f"{','.join(self.cfg.bootstrap_servers)}")

    # librdkafka runs these inside consume() on the loop thread; they only note the
    # event, and confluent-kafka (un)assigns the partitions once they return
    def _on_assign(self, _consumer: Consumer, parts: list[TopicPartition]) -> None:
        self.events.append(("assigned", sorted(tp.partition for tp in parts)))

    def _on_revoke(self, _consumer: Consumer, parts: list[TopicPartition]) -> None:
        self.events.append(("revoked", sorted(tp.partition for tp in parts)))

    def _on_lost(self, _consumer: Consumer, parts: list[TopicPartition]) -> None:
        self.events.append(("lost", sorted(tp.partition for tp in parts)))

    # ------------------------------------------------------------ the group moves

    def _assigned(self, parts: list[int]) -> None:
        """New partitions are not read (their predictions dropped, their labels not
        assigned) until their task is restored (``_restore``)."""
        log.info("partitions assigned: %s", parts)
        self.owned = sorted(set(self.owned) | set(parts))
        self.unrestored |= set(parts)
        self._forget(parts)

    def _forget(self, parts: list[int]) -> None:
        for p in parts:
            for topic in (self.cfg.predictions_topic, self.cfg.labels_topic):
                self._next.pop((topic, p), None)
                self._bad_batch.pop((topic, p), None)

    def _assign_labels(self) -> None:
        """The labels partitions of tasks gone (or waiting for a restore) unassigned."""
        assert self.clabels is not None
        gone = sorted(p for p in self._labels_on
                      if p not in self.owned or p in self.unrestored)
        if gone:
            self.clabels.incremental_unassign(
                [TopicPartition(self.cfg.labels_topic, p) for p in gone])
            self._labels_on -= set(gone)
        self._forget([p for p in gone if p not in self.owned])

    NOT_YET = (KafkaException,)

    def _started(self, p: int, start: Offsets) -> bool:
        """The task's positions sought; a seek that fails gives the task back (not read
        from the wrong place: restored again at the next poll)."""
        try:
            self.seek(p, start)
        except KafkaException as e:
            log.warning("partition %d: cannot move to its task's positions (%r); "
                        "restored again at the next poll", p, e)
            self.hooks.lost([p])
            return False
        return True

    def reload(self, p: int) -> None:
        self.unrestored.add(p)
        self._assign_labels()

    def committed(self, p: int) -> tuple[int | None, str | None]:
        """As ``GroupSource.committed``; KafkaException while the broker cannot say (a
        stable offset is asked for: librdkafka retries while a transaction holds it)."""
        assert self.cpreds is not None
        [tp] = self.cpreds.committed([TopicPartition(self.cfg.predictions_topic, p)],
                                     timeout=COMMITTED_TIMEOUT_MS / 1000)
        if tp.error is not None:
            raise KafkaException(tp.error)
        return (None, None) if tp.offset < 0 else (int(tp.offset), tp.metadata or None)

    def seek(self, p: int, start: Offsets) -> None:
        """The predictions consumer (assigned by the group) sought to the task's
        position; the labels partition assigned at its own."""
        assert self.cpreds is not None and self.clabels is not None
        reset = OFFSET_BEGINNING if self.cfg.auto_offset_reset == "earliest" else OFFSET_END
        preds, labels = self.cfg.predictions_topic, self.cfg.labels_topic
        self.cpreds.seek(TopicPartition(preds, p, reset if start[0] is None else start[0]))
        at = TopicPartition(labels, p, reset if start[1] is None else start[1])
        if p in self._labels_on:
            self.clabels.seek(at)
        else:
            self.clabels.incremental_assign([at])
            self._labels_on.add(p)
        self._forget([p])
        for topic, offset in ((preds, start[0]), (labels, start[1])):
            if offset is not None:
                self._next[(topic, p)] = offset

    # ------------------------------------------------------------ reading

    def _poll_predictions(self, timeout_ms: int, max_records: int) -> list[Chunk]:
        """The records keepalive held first, then a consume."""
        assert self.cpreds is not None
        held, self._held = self._held, []
        return self._consume(self.cpreds, timeout_ms, max_records, held)

    def _poll_labels(self, timeout_ms: int, max_records: int) -> list[Chunk]:
        if not self._labels_on:
            return []
        assert self.clabels is not None
        return [c for c in self._consume(self.clabels, timeout_ms, max_records)
                if c[1] in self._labels_on]

    def _polled(self, chunks: list[Chunk], skips: list[Skip]) -> None:
        for topic, p, *_, offsets, _keys in chunks:
            self._next[(topic, p)] = offsets[-1] + 1
        for s in skips:
            at = (s.topic, s.partition)
            self._next[at] = max(self._next.get(at, 0), s.next_offset)

    def _consume(self, consumer: Consumer, timeout_ms: int, max_records: int,
                 held: list[Message] | None = None) -> list[Chunk]:
        try:
            got = consumer.consume(max_records, timeout_ms / 1000)
        except KafkaException as e:
            self._error(f"poll failed: {e!r}")
            got = []
        good = self._good(consumer, [*(held or ()), *got])
        return _chunks(good) if good else []

    def _good(self, consumer: Consumer, messages: list[Message]) -> list[Message]:
        """The messages without an error. One at an offset of an input partition (a
        batch librdkafka cannot decode, fetched again forever) is skipped by offset
        (``skip_past``, as the static source: counted, dead-lettered); any other is
        logged (e.g. _MAX_POLL_EXCEEDED: this poll rejoins the group)."""
        for m in messages:
            err = m.error()
            if err is None:
                continue
            offset = m.offset()
            if m.topic() not in self._kinds or offset is None or offset < 0:
                self._error(f"consume: {err}")
                continue
            skip, trouble = skip_past(consumer, self._bad_batch, m, err)
            self._skips.append(skip)
            if trouble is not None:
                self._error(trouble)
        return [m for m in messages if m.error() is None]

    def _error(self, what: str) -> None:
        now = time.monotonic()
        if now - self._error_at >= ERROR_LOG_S:
            self._error_at = now
            log.warning("librdkafka group consumer: %s", what)

    def keepalive(self) -> None:
        """The group's poll timer reset during a long checkpoint. librdkafka counts
        ``max.poll.interval.ms`` from the application's last consume or poll of the
        consumer queue and has no call that resets it without one, so this consumes with
        no wait and holds what came for the next poll (``poll_chunks``; ``_next`` keeps
        the positions the loop has read to). Safe against the rebalance callbacks such a
        consume may run: they only note the event (nothing is dropped or restored in the
        middle of the checkpoint), the records of a partition that moved are not held
        (it is sought when restored), and ``group_metadata`` refuses a checkpoint while
        an event waits, so a checkpoint encoded before a rebalance is not committed
        under the generation after it; one that meets a rebalance within its sends
        carries the old generation, which the broker refuses."""
        if self.cpreds is None:
            return
        try:
            got = self.cpreds.consume(KEEPALIVE_RECORDS, 0)
        except KafkaException as e:
            self._error(f"keepalive failed: {e!r}")
            return
        running = (set(self.owned) - self.unrestored
                   - {p for _, parts in self.events for p in parts})
        for m in self._good(self.cpreds, got):
            p: Any = m.partition()
            if p in running:
                self._held.append(m)
                self._next.setdefault((self.cfg.predictions_topic, p), m.offset() or 0)

    def group_metadata(self) -> Any:
        """As ``GroupSource.group_metadata`` (librdkafka's serialized metadata);
        ChangelogError also while a rebalance noted by keepalive waits for the poll."""
        assert self.cpreds is not None
        if self.events:
            raise ChangelogError("the group is rebalancing: the checkpoint waits for the "
                                 "partitions this member keeps")
        meta = self.cpreds.consumer_group_metadata()
        if not self._member(meta):
            raise ChangelogError("this member is not in the group (no generation): its "
                                 "partitions may be another member's")
        return meta

    def in_group(self) -> bool:
        return self.cpreds is not None and self._member(self.cpreds.consumer_group_metadata())

    def _member(self, meta: Any) -> bool:
        # librdkafka clears the member id when it leaves the group (past
        # max.poll.interval.ms, or dropped by the coordinator) but may keep the
        # generation (Tansu's 0), so both are asked
        assert self.cpreds is not None
        gen = generation(meta)
        return bool(self.cpreds.memberid()) and (gen is None or gen >= 0)

    def position(self, topic: str, partition: int) -> int | None:
        """The next offset the loop reads of ``topic`` on ``partition``: past the last
        record handed out, else where it was sought, else librdkafka's (None before its
        first fetch)."""
        if (topic, partition) in self._next:
            return self._next[(topic, partition)]
        consumer = self.cpreds if topic == self.cfg.predictions_topic else self.clabels
        if consumer is None:
            return None
        try:
            [tp] = consumer.position([TopicPartition(topic, partition)])
        except KafkaException:
            return None
        return int(tp.offset) if tp.offset >= 0 else None

    def _fetch_ends(self) -> None:
        """Every ``ENDS_EVERY_S``: the high watermarks of librdkafka's last fetches (no
        request on the loop thread)."""
        now = time.monotonic()
        if now < self._ends_at:
            return
        self._ends_at = now + ENDS_EVERY_S
        out: dict[tuple[str, int], int] = {}
        for consumer, topic in ((self.cpreds, self.cfg.predictions_topic),
                                (self.clabels, self.cfg.labels_topic)):
            if consumer is None:
                continue
            for p in self.owned:
                try:
                    _low, high = consumer.get_watermark_offsets(TopicPartition(topic, p),
                                                                cached=True)
                except KafkaException:
                    continue
                if high is not None and high >= 0:
                    out[(topic, p)] = int(high)
        self._ends = out

    def connected(self) -> bool:
        return self.cpreds is not None

    def close(self, leave: Any = None) -> None:
        for consumer in (self.cpreds, self.clabels):
            if consumer is not None:
                try:
                    consumer.close()
                except Exception:
                    log.debug("closing a consumer raised", exc_info=True)
        self.cpreds = self.clabels = None
        self._labels_on.clear()
