"""Group mode's source (``kafka.instance: group``, contract §8), kafka-python.

Two consumers in the loop thread (never a child process: the rebalance callbacks
restore and flush task state, which the loop thread alone writes):

- the *predictions* consumer subscribes to ``predictions_topic`` with the
  consumer-group protocol (static membership with ``group_instance_id``); its
  ``ConsumerRebalanceListener`` runs inside ``poll`` and calls the owner's hooks;
- the *labels* consumer has no group and is assigned, by hand, the labels
  partitions with the numbers the predictions consumer was given.

Why two consumers rather than one with a custom assignor: kafka-python's assignors
assign the subscribed topics' partitions independently, and a custom one would have
to be installed on every member (a member with the default assignor would break the
pairing). The labels side needs no group: its positions live in the task's state,
written with the predictions offsets in one transaction (``calmon.io.changelog``).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from kafka import KafkaConsumer, TopicPartition
from kafka.consumer.subscription_state import ConsumerRebalanceListener
from kafka.errors import KafkaError

from calmon.config import KafkaConfig
from calmon.engine.records import Kind
from calmon.io import batch_guard
from calmon.io.changelog import ChangelogError
from calmon.io.source import Batch, Chunk, CoPartitionError, KafkaSourceError, Skip, to_batch
from calmon.io.topics import client_settings, copartition_problem, fetch_bytes

log = logging.getLogger(__name__)

GROUP_KEYS = ("group_instance_id", "session_timeout_ms", "heartbeat_interval_ms",
              "max_poll_interval_ms")
COMMITTED_TIMEOUT_MS = 2000  # a poll's worth: an unknown committed offset is asked again
ENDS_EVERY_S = 5.0  # end offsets (the lag gauge) fetched this often
Offsets = tuple[int | None, int | None]  # where a task starts: (predictions, labels)


class Hooks(Protocol):
    """What the owner of the tasks does when the group moves partitions."""

    def lost(self, partitions: list[int]) -> None:
        """Drop these tasks (revoked or lost: the rebalance has begun by the time the
        loop thread hears of it, so what they hold past their last checkpoint is read
        again by the next owner, and a commit now would be refused)."""

    def assigned(self, committed: Mapping[int, tuple[int | None, str | None]]
                 ) -> dict[int, Offsets]:
        """Restore these tasks (partition -> the committed predictions offset and its
        metadata, the checkpoint's name) and say where each starts reading."""
        ...


def too_silent(heard: float, session_s: float, interval_s: float) -> float | None:
    """The seconds since ``heard`` (``time.monotonic()``: the coordinator's last answer)
    when past the bound a live member never reaches, else None."""
    silent = time.monotonic() - heard
    return silent if silent > max(session_s / 2, session_s - interval_s) else None


def _settings(cfg: KafkaConfig, *, group: bool) -> dict[str, Any]:
    size = fetch_bytes(cfg.max_record_bytes)
    out: dict[str, Any] = {"max_partition_fetch_bytes": size,
                           "fetch_max_bytes": max(50 * 1024 * 1024, size),
                           "allow_auto_create_topics": False}
    out.update(client_settings(cfg.client, KafkaConsumer.DEFAULT_CONFIG, role="consumer"))
    if not group:
        for key in GROUP_KEYS:
            out.pop(key, None)
    out.update(bootstrap_servers=list(cfg.bootstrap_servers),
               group_id=cfg.group_id if group else None, enable_auto_commit=False,
               auto_offset_reset=cfg.auto_offset_reset, key_deserializer=None,
               value_deserializer=None)
    return out


class _Listener(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, source: GroupSource) -> None:
        self.source = source

    # kafka-python 3 runs these on its IO thread, where nothing may block (no committed
    # offsets, no restore): they only note the event. Nothing is paused here either (a
    # partition paused here and revoked before it was resumed once left its member out
    # of the next rebalances on Apache Kafka): the records of a partition whose task is
    # not restored yet are dropped by poll_chunks, and the restore seeks.
    def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        self.source.events.append(("revoked", sorted(tp.partition for tp in revoked)))

    def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        self.source.vouched(time.monotonic())  # a generation the broker just gave
        self.source.events.append(("assigned", sorted(tp.partition for tp in assigned)))

    def on_partitions_lost(self, lost: list[TopicPartition]) -> None:
        self.source.events.append(("lost", sorted(tp.partition for tp in lost)))


class GroupSource:
    """The member's consumers; ``start`` then ``poll`` from one thread."""

    def __init__(self, cfg: KafkaConfig, hooks: Hooks, *,
                 metadata_timeout_s: float = 30.0) -> None:
        self.cfg = cfg
        self.hooks = hooks
        self.metadata_timeout_s = metadata_timeout_s
        self.preds: KafkaConsumer | None = None
        self.labels: KafkaConsumer | None = None
        self.owned: list[int] = []
        self.partitions = 0  # of each input topic, once checked
        self.rebalances = 0
        self.events: list[tuple[str, list[int]]] = []  # noted by the listener, in order
        self._ends: dict[tuple[str, int], int] = {}
        self.unrestored: set[int] = set()  # assigned, task not restored yet (not read)
        self._ends_at = 0.0
        self._kinds = {cfg.predictions_topic: Kind.PREDICTION, cfg.labels_topic: Kind.LABEL}
        self._skips: list[Skip] = []  # read past by the library, not yet sorted by a poll
        self._skipped: list[Skip] = []  # of running tasks, for take_skips
        # when the broker last vouched for this member (a heartbeat answered without
        # error, sent then, or an assignment): None when kafka-python's clock is read
        self.answered: float | None = None
        fetch = fetch_bytes(cfg.max_record_bytes)
        self._batch_limit = max(batch_guard.BATCH_LIMIT, 2 * fetch)
        self._poll_budget = max(batch_guard.POLL_BUDGET, fetch)

    def start(self) -> int:
        """Connect, check co-partitioning (CoPartitionError) and subscribe; the
        partition count of the input topics."""
        batch_guard.install()  # batches kafka-python cannot read are skipped, not raised
        try:
            self.preds = KafkaConsumer(**_settings(self.cfg, group=True))
            self.labels = KafkaConsumer(**_settings(self.cfg, group=False))
        except KafkaError as e:
            raise KafkaSourceError(f"cannot connect to "
                                   f"{','.join(self.cfg.bootstrap_servers)}: {e}") from e
        counts = [self._count(self.preds, self.cfg.predictions_topic),
                  self._count(self.labels, self.cfg.labels_topic)]
        problem = copartition_problem((self.cfg.predictions_topic, counts[0]),
                                      (self.cfg.labels_topic, counts[1]), "group")
        if problem is not None:
            raise CoPartitionError(problem)
        self.partitions = counts[0]
        self._watch_heartbeats()
        self.preds.subscribe([self.cfg.predictions_topic], listener=_Listener(self))
        return self.partitions

    def _count(self, consumer: KafkaConsumer, topic: str) -> int:
        deadline = time.monotonic() + self.metadata_timeout_s
        while time.monotonic() < deadline:
            try:
                parts = consumer.partitions_for_topic(topic)
            except KafkaError:
                parts = None
            if parts:
                return len(parts)
            time.sleep(0.2)
        raise KafkaSourceError(f"topic {topic!r} does not exist (or is not visible) on "
                               f"{','.join(self.cfg.bootstrap_servers)}")

    # ------------------------------------------------------------ the group moves

    def _handle_events(self) -> None:
        """What the listener noted, in order, on the loop thread; the tasks of the
        partitions still assigned after all of it are restored by the caller (one that
        came and went within the poll is never restored)."""
        while self.events:
            what, parts = self.events.pop(0)
            if what == "assigned":
                self._assigned(parts)
                continue
            (log.info if what == "revoked" else log.warning)("partitions %s: %s", what, parts)
            self.rebalances += 1
            self.hooks.lost(parts)
            self.owned = [p for p in self.owned if p not in parts]
            self.unrestored -= set(parts)
            self._assign_labels()

    def _assigned(self, parts: list[int]) -> None:
        """New partitions are not read (their labels paused, their predictions dropped)
        until their task is restored (``_restore``), which may take several polls: a
        killed member's open transaction keeps their committed offsets unstable until
        it times out, and the loop polls on meanwhile (a member that stops polling past
        max_poll_interval_ms is dropped)."""
        assert self.preds is not None and self.labels is not None
        log.info("partitions assigned: %s", parts)
        self.owned = sorted(set(self.owned) | set(parts))
        self._assign_labels()
        self.labels.pause(*[TopicPartition(self.cfg.labels_topic, p) for p in parts])
        self.unrestored |= set(parts)

    # what ``committed`` raises while the broker cannot say yet (this library's error)
    NOT_YET: tuple[type[Exception], ...] = (KafkaError,)

    def _restore(self) -> None:
        """The tasks of ``unrestored`` in partition order, each from its committed
        checkpoint (``hooks.assigned``), then read from its positions (``_started``);
        stops at the first whose committed offset is not known yet (the rest wait for
        the next poll: the loop must poll on)."""
        for p in sorted(self.unrestored):
            try:
                committed = self.committed(p)
            except self.NOT_YET as e:
                log.info("committed offset of partition %d not known yet (%r): its task "
                         "waits", p, e)
                break
            starts = self.hooks.assigned({p: committed})
            if self._started(p, starts.get(p, (None, None))):
                self.unrestored.discard(p)

    def _started(self, p: int, start: Offsets) -> bool:
        """Partition ``p``'s consumers moved to its restored task's positions and its
        labels resumed; whether it may be read now."""
        assert self.labels is not None
        self.seek(p, start)
        self.labels.resume(TopicPartition(self.cfg.labels_topic, p))
        return True

    def reload(self, p: int) -> None:
        """Partition ``p``'s task again from its committed checkpoint, both topics
        paused until it is restored (at the next poll, or later)."""
        assert self.labels is not None
        self.labels.pause(TopicPartition(self.cfg.labels_topic, p))
        self.unrestored.add(p)

    def committed(self, p: int) -> tuple[int | None, str | None]:
        """Predictions partition ``p``'s committed offset and its metadata; KafkaError
        while the broker cannot say."""
        assert self.preds is not None
        meta = self.preds.committed(TopicPartition(self.cfg.predictions_topic, p),
                                    metadata=True, timeout_ms=COMMITTED_TIMEOUT_MS)
        return ((None, None) if meta is None else
                (int(meta.offset), getattr(meta, "metadata", None) or None))

    def seek(self, p: int, start: Offsets) -> None:
        """Both consumers of partition ``p`` to a task's positions; a task without a
        checkpoint starts at auto_offset_reset on both topics."""
        assert self.preds is not None and self.labels is not None
        for consumer, topic, at in ((self.preds, self.cfg.predictions_topic, start[0]),
                                    (self.labels, self.cfg.labels_topic, start[1])):
            tp = TopicPartition(topic, p)
            if at is not None:
                consumer.seek(tp, at)
            elif self.cfg.auto_offset_reset == "earliest":
                consumer.seek_to_beginning(tp)
            else:
                consumer.seek_to_end(tp)

    def _assign_labels(self) -> None:
        assert self.labels is not None
        self.labels.assign([TopicPartition(self.cfg.labels_topic, p) for p in self.owned])

    # ------------------------------------------------------------ reading

    # the daemon's Source interface: assign is start, offsets commit with the state
    def assign(self, positions: dict[tuple[str, int], int] | None = None, *,
               from_checkpoint: bool = False) -> list[int]:
        self.start()
        return []

    def commit(self, positions: dict[tuple[str, int], int]) -> bool:
        return False  # offsets are committed in the checkpoint's transaction only

    def poll(self, timeout_ms: int = 1000, max_records: int = 500) -> Batch:
        return to_batch(self.poll_chunks(timeout_ms, max_records), self._kinds, columns=True)

    def poll_chunks(self, timeout_ms: int, max_records: int) -> list[Chunk]:
        """Records of both topics as per-partition columns (offsets ascending). A
        rebalance noted inside the predictions poll is handled before the labels are
        read (tasks dropped, or restored and their consumers moved to their positions).
        Batches that cannot be read are skipped by offset (``take_skips``). Never
        raises on broker trouble."""
        running = set(self.owned) - self.unrestored
        out = self._poll_predictions(timeout_ms // 2, max_records)
        running -= {p for _, parts in self.events for p in parts}  # moved in this poll
        self._handle_events()
        if self.unrestored:
            self._restore()
        # only partitions whose task ran before the poll and still runs: a task
        # dropped, or restored (and sought) in this poll, reads its records afresh
        keep = running & (set(self.owned) - self.unrestored)
        out = [c for c in out if c[1] in keep]
        skips = [s for s in self._skips if s.partition in keep]
        self._skips = []
        out += self._poll_labels(timeout_ms // 2, max_records)
        live = set(self.owned) - self.unrestored
        skips += [s for s in self._skips if s.partition in live]
        self._skips = []
        self._polled(out, skips)
        self._skipped += skips
        self._fetch_ends()
        return out

    def take_skips(self) -> list[Skip]:
        """The offsets of running tasks' partitions the polls since the last call read
        past without a record (a batch that cannot be decoded, one that inflates past
        the bound: see ``Skip``), oldest first."""
        out, self._skipped = self._skipped, []
        return out

    def _poll_predictions(self, timeout_ms: int, max_records: int) -> list[Chunk]:
        assert self.preds is not None
        return self._read(self.preds, timeout_ms, max_records)

    def _poll_labels(self, timeout_ms: int, max_records: int) -> list[Chunk]:
        assert self.labels is not None
        return self._read(self.labels, timeout_ms, max_records) if self.owned else []

    def _polled(self, chunks: list[Chunk], skips: list[Skip]) -> None:
        """What a poll hands out (a library that keeps its own positions notes them)."""

    def _read(self, consumer: KafkaConsumer, timeout_ms: int, max_records: int
              ) -> list[Chunk]:
        """One poll, batches decoded in bounded memory and one that cannot be read
        skipped (``batch_guard``, as the static source): never raised at the same
        offset every poll."""
        batch_guard.begin(batch_limit=self._batch_limit, poll_budget=self._poll_budget,
                          keep_bytes=self.cfg.max_record_bytes)
        try:
            polled = consumer.poll(timeout_ms=timeout_ms, max_records=max_records)
        except Exception as e:  # KafkaError, or a decoding error kafka-python lets out
            log.warning("poll failed: %r", e)
            polled = {}
        finally:
            skips, deferred = batch_guard.end()
        for tp, offset in deferred.items():  # read again, first, in the next poll
            try:
                consumer.seek(tp, offset)
            except (KafkaError, ValueError, KeyError) as e:  # revoked within the poll
                log.debug("partition %s not sought back: %r", tp, e)
        self._skips += skips
        return [(tp.topic, tp.partition, [r.value for r in recs],
                 [r.timestamp for r in recs], [r.offset for r in recs],
                 [r.key for r in recs]) for tp, recs in polled.items() if recs]

    def keepalive(self) -> None:
        """The group's poll timer reset without a poll (kafka-python's coordinator, as
        a poll does first): a long checkpoint does not make this member leave the group
        at ``max_poll_interval_ms``. Not a poll: nothing is fetched, no partition is
        paused, and a rebalance under way waits for the loop's next poll (pausing
        partitions for a poll that revoked them left a member out of the next
        rebalances)."""
        beat = getattr(self._coordinator(), "poll_heartbeat", None)
        if beat is None:
            return
        try:
            beat()
        except Exception as e:  # the heartbeat thread failed: the next poll rejoins
            log.warning("keepalive of the group failed: %r", e)

    def group_metadata(self) -> Any:
        """The member's group generation for the checkpoint's transaction; ChangelogError
        once the consumer has left the group (a paused member's heartbeat thread leaves
        past max_poll_interval_ms before the loop hears of it): a commit without a
        generation (-1, no member id) is not checked by the broker (KIP-447 keeps it for
        producers of no group), so it would write a zombie's state over the new owner's."""
        assert self.preds is not None
        meta = self.preds.group_metadata()
        if meta.generation_id < 0 or not meta.member_id:
            raise ChangelogError("this member is not in the group (no generation): its "
                                 "partitions may be another member's")
        silent = self._heartbeat_silence()
        if silent is not None:
            raise ChangelogError(f"no heartbeat of this member answered for {silent:.1f} s: "
                                 "the group may have moved its partitions")
        return meta

    def _coordinator(self) -> Any:
        """kafka-python's group coordinator of the predictions consumer (private: None
        where a version has none), whose heartbeats the keepalive and the fencing check
        use."""
        return getattr(self.preds, "_coordinator", None)

    def _watch_heartbeats(self) -> None:
        """calmon's own clock of the broker vouching for this member (``answered``):
        kafka-python counts a REBALANCE_IN_PROGRESS answer as a heartbeat (right for
        staying in a rebalancing group) and restarts its clock on finding the
        coordinator again, while Tansu answers a dropped member's stale generation with
        REBALANCE_IN_PROGRESS, so by kafka-python's clock a resumed zombie looks alive.
        Only a heartbeat answered without error counts here (kafka-python's
        coordinator, private: without it, its own clock is read)."""
        coordinator = self._coordinator()
        handle = getattr(coordinator, "_handle_heartbeat_response", None)
        if handle is None:
            return

        def observed(response: Any, send_time: float) -> Any:
            if getattr(response, "error_code", None) == 0:
                self.vouched(send_time)
            return handle(response, send_time)

        coordinator._handle_heartbeat_response = observed
        self.answered = -math.inf

    def vouched(self, at: float) -> None:
        """The broker answered this member as one of its group, at ``at`` (monotonic)."""
        if self.answered is not None and at > self.answered:
            self.answered = at

    def _heartbeat_silence(self) -> float | None:
        """Seconds since the broker last vouched for this member, when that is too long
        to trust the generation: a member resumed after a pause past the session timeout
        still holds its old generation until its consumer hears otherwise, and a broker
        that does not check it (Tansu) would take its commit. A live member's heartbeat
        thread is answered every ``heartbeat_interval_ms``; the bound leaves one
        interval for the commit itself (kafka-python's ``Heartbeat``, private)."""
        beat = getattr(self._coordinator(), "heartbeat", None)
        if beat is None:
            return None
        try:
            session = beat.config["session_timeout_ms"] / 1000
            interval = beat.config["heartbeat_interval_ms"] / 1000
            heard = (max(beat.last_receive, beat.last_reset) if self.answered is None
                     else self.answered)
        except (AttributeError, KeyError, TypeError):
            return None
        return too_silent(heard, session, interval)

    def in_group(self) -> bool:
        """Whether the member holds a generation of the group (else ``group_metadata``
        refuses)."""
        return self.preds is not None and self.preds.group_metadata().generation_id >= 0

    def position(self, topic: str, partition: int) -> int | None:
        """The next offset the consumer of ``topic`` reads on ``partition``; None when
        not known within a poll's worth (kafka-python first fetches the committed offset
        of every assigned partition without a position, which the broker withholds while
        a transaction holds it: unbounded, that wait would stop the loop's polls)."""
        consumer = self.preds if topic == self.cfg.predictions_topic else self.labels
        try:
            return None if consumer is None else int(consumer.position(
                TopicPartition(topic, partition), timeout_ms=COMMITTED_TIMEOUT_MS))
        except (KafkaError, AssertionError, ValueError, TypeError):
            return None

    def end_offsets(self) -> dict[tuple[str, int], int]:
        """The owned partitions' end offsets as the loop thread last fetched them (any
        thread may ask: the consumers are the loop thread's alone)."""
        return self._ends

    def _fetch_ends(self) -> None:
        """Every ``ENDS_EVERY_S``, on the loop thread."""
        now = time.monotonic()
        if now < self._ends_at:
            return
        self._ends_at = now + ENDS_EVERY_S
        out: dict[tuple[str, int], int] = {}
        for consumer, topic in ((self.preds, self.cfg.predictions_topic),
                                (self.labels, self.cfg.labels_topic)):
            if consumer is None or not self.owned:
                continue
            try:
                ends = consumer.end_offsets([TopicPartition(topic, p) for p in self.owned],
                                            timeout_ms=2000)
            except KafkaError:
                continue
            out.update({(tp.topic, tp.partition): int(o) for tp, o in ends.items()
                        if o is not None})
        self._ends = out  # replaced whole

    def connected(self) -> bool:
        return self.preds is not None

    def close(self, leave: Callable[[], None] | None = None) -> None:
        for consumer in (self.preds, self.labels):
            if consumer is not None:
                try:
                    consumer.close(autocommit=False)
                except Exception:
                    log.debug("closing a consumer raised", exc_info=True)
        self.preds = self.labels = None
