"""The source of ``kafka.library: confluent``: a confluent-kafka (librdkafka)
``Consumer`` with the semantics of ``KafkaSource`` (see ``calmon.io.source``).

Static ``assign()`` with explicit start offsets, no group membership; the group
id only stores commits for lag monitoring. librdkafka fetches and decodes in its
own threads, so a poll here is mostly a walk over ready messages.

Connection state: librdkafka has no per-connection query, so ``connected()`` is
kept from its callbacks (served inside ``consume()``): the one-second statistics
say whether any broker connection is UP, and an all-brokers-down error clears it
at once.
"""

from __future__ import annotations

import logging
import operator
import time
import uuid
from itertools import pairwise, repeat
from typing import Any

import numpy as np
import orjson
from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_END,
    OFFSET_INVALID,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)

from calmon.config import KafkaConfig
from calmon.io import source as shared
from calmon.io.confluent_settings import LibrdkafkaLog, librdkafka_settings
from calmon.io.pacing import Pacer
from calmon.io.security import credentials_problem, tls_failure
from calmon.io.source import Chunk, KafkaAuthError, KafkaSourceError, Position, Skip, SourceBase
from calmon.io.topics import fetch_bytes

log = logging.getLogger(__name__)

_NO_TIMESTAMP = 0  # confluent_kafka.TIMESTAMP_NOT_AVAILABLE
END_OFFSETS_TIMEOUT_S = 2.0  # a slow broker delays lag figures, never the poll loop for long
METADATA_TIMEOUT_S = 2.0  # the same for a partition check (refresh())


class ConfluentSource(SourceBase):
    """Static-assignment librdkafka consumer over ``predictions_topic`` and ``labels_topic``."""

    def __init__(self, config: KafkaConfig, *, metadata_timeout_s: float = 30.0,
                 log_interval_s: float = 60.0) -> None:
        if config.predictions_topic == config.labels_topic:
            raise ValueError("predictions_topic and labels_topic must differ")
        super().__init__(config)
        self._config = config
        self._metadata_timeout_s = metadata_timeout_s
        self._log_interval_s = log_interval_s
        self._consumer: Consumer | None = None
        self._bad_batch: dict[Position, tuple[int, int]] = {}  # first offset, next to try
        self._progress: dict[Position, tuple[int, float]] = {}  # fetch position, since when
        self._progress_at = 0.0
        self._connected = False
        self._refused: str | None = None  # why the broker refused us (login, certificate)
        # labels no earlier than their predictions, as far as can be told (io/pacing.py)
        self._pacer = Pacer(config.predictions_topic, config.labels_topic, self._lagging)
        self._last_warning = -float("inf")

    # ------------------------------------------------------------------ setup

    def _settings(self) -> dict[str, Any]:
        cfg = self._config
        size = fetch_bytes(cfg.max_record_bytes)
        fetch_max = max(50 * 1024 * 1024, size)
        settings: dict[str, Any] = {
            "client.id": "calmon" if cfg.static is None else f"calmon-{cfg.static.index}",
            "max.partition.fetch.bytes": size,
            "fetch.max.bytes": fetch_max,
            "receive.message.max.bytes": max(100_000_000, fetch_max + 512),
            # a misspelt input topic must fail loudly, not be created empty
            "allow.auto.create.topics": False,
            "statistics.interval.ms": 1000,  # feeds connected()
            # librdkafka (2.x) waits fetch.queue.backoff.ms, 1 s by default, before it
            # fetches again once its queue is past queued.min.messages: a consumer that
            # drains 5,000-record polls in milliseconds then stalls for most of a second
            # (measured: 130k records/s through the consumer process instead of 440k)
            "fetch.queue.backoff.ms": 10,
            "logger": LibrdkafkaLog(),
        }
        settings.update(librdkafka_settings(cfg.client, role="consumer"))
        # These carry calmon's semantics; a client override would break them.
        forced = {
            "bootstrap.servers": ",".join(cfg.bootstrap_servers),
            # librdkafka wants a group even to assign(); one of its own commits nothing
            # (commit() returns False without group_id) and has no committed offsets
            "group.id": cfg.group_id or f"calmon-nogroup-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": cfg.auto_offset_reset,
            "enable.partition.eof": False,
            "error_cb": self._on_error,
            "stats_cb": self._on_stats,
            "on_commit": self._on_commit,
        }
        for key in forced.keys() & cfg.client.keys():
            log.warning("kafka.client.%s: ignored, calmon sets it itself", key)
        for key in ("group_id", "enable_auto_commit", "auto_offset_reset", "bootstrap_servers"):
            if key in cfg.client:
                log.warning("kafka.client.%s: ignored, calmon sets it itself", key)
        settings.update(forced)
        return settings

    def _partitions(self, consumer: Consumer, topic: str, deadline: float) -> set[int]:
        """Partition ids of ``topic``; waits for metadata up to ``deadline``."""
        last_error: Exception | None = None
        missing_since: float | None = None
        while True:
            now = time.monotonic()
            timeout = max(0.5, min(5.0, deadline - now))
            try:
                meta = consumer.list_topics(topic, timeout=timeout).topics.get(topic)
                last_error = None
            except KafkaException as exc:  # broker unreachable: keep trying until the deadline
                meta, last_error = None, exc
                consumer.poll(0)  # serves error_cb: a refused login or certificate says why
                if self._refused is not None:
                    raise KafkaAuthError(self._refused) from None
            if meta is not None and meta.error is None and meta.partitions:
                return set(meta.partitions)
            if meta is not None and last_error is None:
                # The broker answered without the topic. Give a just-created topic a
                # few seconds to show up, but report a typo long before the deadline.
                missing_since = now if missing_since is None else missing_since
                if now - missing_since >= shared.MISSING_TOPIC_GRACE_S:
                    break
            if time.monotonic() >= deadline:
                break
            time.sleep(0.1)
        servers = ",".join(self._config.bootstrap_servers)
        if last_error is not None:
            raise KafkaSourceError(
                f"cannot read metadata of topic {topic!r} from {servers}: {last_error}")
        raise KafkaSourceError(
            f"topic {topic!r} does not exist (or is not visible to this client) on {servers}")

    def assign(self, positions: dict[Position, int] | None = None, *,
               from_checkpoint: bool = False) -> list[Position]:
        """As ``KafkaSource.assign`` (see ``calmon.io.source.ChunkSource``)."""
        deadline = time.monotonic() + self._metadata_timeout_s
        if self._consumer is None:
            try:
                self._consumer = Consumer(self._settings())
            except (KafkaException, ValueError, TypeError) as exc:  # e.g. an unknown property
                raise KafkaSourceError(f"kafka.client: librdkafka consumer: {exc}") from exc
        consumer = self._consumer
        owned = self._plan({t: self._partitions(consumer, t, deadline) for t in self._kinds})
        self._problem = None
        if not owned:
            log.warning(
                "instance %s owns no partition of %s", self._config.instance, sorted(self._kinds))
        stored = positions or {}
        if from_checkpoint:  # never counted in the restored state: straight to the reset point
            missing = OFFSET_BEGINNING if self._config.auto_offset_reset == "earliest" else (
                OFFSET_END)
        else:  # librdkafka resolves it: committed offset, else auto.offset.reset
            missing = OFFSET_INVALID
        consumer.assign([TopicPartition(t, p, stored.get((t, p), missing)) for t, p in owned])
        self._pacer.clear()
        self._pair_partitions(owned)
        self._connected = True  # metadata just came back
        self._owned = sorted(owned)
        log.info("assigned %d partitions: %s", len(owned), self._owned)
        return list(self._owned)

    # ------------------------------------------------------------------ reading

    def poll_chunks(self, timeout_ms: int = 1000, max_records: int = 500) -> list[Chunk]:
        """One consume() as per-partition columns, paced (``calmon.io.pacing``): the
        predictions first, labels held while their partition's predictions lag."""
        return self._pacer.pace(self._consume_chunks(timeout_ms, max_records))

    def _pair_partitions(self, owned: list[Position]) -> None:
        """Labels are paced only where both topics have the same partition numbers."""
        cfg = self._config
        self._pacer.pairs = ({p for t, p in owned if t == cfg.predictions_topic}
                             == {p for t, p in owned if t == cfg.labels_topic})

    def _lagging(self, partition: int) -> bool:
        """Whether the predictions partition ``partition`` has records librdkafka has
        not handed over yet (from its local state: the last fetch's high watermark)."""
        consumer = self._consumer
        if consumer is None:
            return False
        tp = TopicPartition(self._config.predictions_topic, partition)
        try:
            position = consumer.position([tp])[0].offset
            low, high = consumer.get_watermark_offsets(tp, cached=True)
        except KafkaException:
            return False
        if high is None or high < 0:
            return True  # not fetched yet: its records may well be on their way
        if position < 0:  # nothing handed over yet
            return bool(high > (low if low is not None and low >= 0 else 0))
        return bool(position < high)

    def _consume_chunks(self, timeout_ms: int, max_records: int) -> list[Chunk]:
        if self._consumer is None:
            raise RuntimeError("ConfluentSource.poll() before assign()")
        try:
            messages = self._consumer.consume(max_records, timeout_ms / 1000.0)
        except KafkaException as exc:
            self._trouble(f"poll failed: {exc!r}")
            return []
        if not messages:
            if self._connected:
                self._recovered()
            else:
                self._trouble("broker unreachable")
            return []
        # records came from a broker: connected, whatever a stale all-brokers-down error
        # served in the same consume() said (after a broker restart librdkafka delivers
        # the outage's errors late, and the next statistics are up to a second away)
        self._connected = True
        self._recovered()
        # one C getter per field over the whole poll, then runs of a partition sliced
        # out: a third of the per-message Python of a loop that appends field by field
        # (identity, not ==: a KafkaError compared with None raises)
        if all(map(operator.is_, map(Message.error, messages), repeat(None))):
            return _chunks(messages)
        # consume() interleaves partitions; group them, keeping offset order in each
        groups: dict[tuple[str, int], tuple[list[bytes | None], list[int | None], list[int],
                                            list[bytes | None]]] = {}
        for m in messages:
            err = m.error()
            if err is not None:
                self._message_error(m, err)
                continue
            at: Any = (m.topic(), m.partition())  # both set on a fetched message
            cols = groups.get(at)
            if cols is None:
                cols = groups[at] = ([], [], [], [])
            cols[0].append(m.value())
            kind, ts = m.timestamp()
            cols[1].append(None if kind == _NO_TIMESTAMP else ts)
            offset: Any = m.offset()
            cols[2].append(offset)
            key: Any = m.key()
            cols[3].append(key)
        return [(t, p, values, stamps, offsets, keys)
                for (t, p), (values, stamps, offsets, keys) in groups.items()]

    def _partition_sets(self) -> dict[str, set[int]] | None:
        """Asks the broker (a metadata request per topic, a short timeout), only while
        it is reachable."""
        consumer = self._consumer
        if consumer is None or not self._connected:
            return None
        out: dict[str, set[int]] = {}
        for topic in self._kinds:
            try:
                meta = consumer.list_topics(topic, timeout=METADATA_TIMEOUT_S).topics.get(topic)
            except KafkaException as exc:
                log.debug("cannot read partition metadata: %r", exc)
                return None
            if meta is None or meta.error is not None or not meta.partitions:
                return None
            out[topic] = set(meta.partitions)
        return out

    def _add(self, new: list[Position]) -> None:
        consumer = self._consumer
        assert consumer is not None
        consumer.incremental_assign([TopicPartition(t, p, OFFSET_BEGINNING) for t, p in new])
        self._pair_partitions([*self._owned, *new])

    def commit(self, positions: dict[Position, int]) -> bool:
        """Commit next offsets (lag monitoring, a checkpoint-less start), asynchronously so a slow
        coordinator never stalls polling; failures are logged from the callback."""
        if self._consumer is None or not self._config.group_id:
            return False
        owned = set(self._owned)
        offsets = [TopicPartition(t, p, off) for (t, p), off in positions.items()
                   if (t, p) in owned]
        if not offsets:
            return True
        if not self._connected:
            self._trouble("offset commit skipped: broker unreachable")
            return False
        try:
            self._consumer.commit(offsets=offsets, asynchronous=True)
        except KafkaException as exc:
            self._trouble(f"offset commit failed: {exc!r}")
            return False
        return True

    def end_offsets(self) -> dict[Position, int]:
        """High watermarks of the owned partitions; empty when the broker is slow."""
        consumer = self._consumer
        if consumer is None:
            return {}
        out: dict[Position, int] = {}
        for topic, partition in self._owned:
            try:
                _low, high = consumer.get_watermark_offsets(
                    TopicPartition(topic, partition), timeout=END_OFFSETS_TIMEOUT_S,
                    cached=False)
            except KafkaException as exc:
                log.debug("cannot fetch end offsets: %r", exc)
                return {}
            if high is not None and high >= 0:
                out[(topic, partition)] = int(high)
        return out

    def stuck(self) -> str | None:
        """``SourceBase.stuck``, and a partition whose fetch position has not moved for
        ``STUCK_AFTER_S`` while records lie after it: librdkafka inflates batches in
        its own threads, and one it cannot get past (a decompression bomb) holds the
        partition without any error. Read from librdkafka's local state (positions,
        the watermarks of its last fetches), at most once a second."""
        why = super().stuck()
        consumer, now = self._consumer, time.monotonic()
        if why is not None or consumer is None or now - self._progress_at < 1.0:
            return why
        self._progress_at = now
        try:
            positions = consumer.position([TopicPartition(t, p) for t, p in self._owned])
        except KafkaException as exc:
            log.debug("cannot read positions: %r", exc)
            return None
        for tp in positions:
            key: Position = (tp.topic, tp.partition)
            seen = self._progress.get(key)
            if seen is None or seen[0] != tp.offset:
                self._progress[key] = (tp.offset, now)
                continue
            offset, since = seen
            if offset < 0 or now - since < shared.STUCK_AFTER_S:
                continue
            try:
                _low, high = consumer.get_watermark_offsets(tp, cached=True)
            except KafkaException:
                continue
            if high is not None and high > offset:
                return (f"{key[0]}/{key[1]} has stayed at offset {offset} for "
                        f"{now - since:.0f}s with {high - offset} records after it")
        return None

    def connected(self) -> bool:
        """True while librdkafka last reported a broker connection UP (no I/O)."""
        return self._consumer is not None and self._connected

    def refused(self) -> str | None:
        """While no broker connection is up: why the broker refused the last one (the
        credentials, the certificate), naming the setting; else None."""
        return None if self.connected() else self._refused

    def close(self) -> None:
        """Close without committing (commits are explicit); waits for pending commits."""
        consumer, self._consumer = self._consumer, None
        self._connected = False
        if consumer is None:
            return
        try:
            consumer.close()
        except Exception:  # best effort; the process may be exiting
            log.debug("error closing the librdkafka consumer", exc_info=True)

    # ------------------------------------------------------------------ callbacks

    def _on_error(self, err: KafkaError) -> None:
        code = err.code()
        if code in (KafkaError._AUTHENTICATION, KafkaError._SSL):
            client = self._config.client
            self._refused = (credentials_problem(client, err.str())
                             if code == KafkaError._AUTHENTICATION
                             else tls_failure(client, err.str()))
            self._trouble(self._refused)
        elif code == KafkaError._ALL_BROKERS_DOWN:
            self._connected = False
        elif err.fatal():
            self._trouble(f"fatal error: {err}")
        else:
            log.debug("librdkafka: %s", err)

    def _on_stats(self, stats: str) -> None:
        try:
            brokers = orjson.loads(stats).get("brokers", {})
        except (orjson.JSONDecodeError, AttributeError):
            return
        self._connected = any(b.get("state") == "UP" for b in brokers.values())
        if self._connected:
            self._refused = None

    def _on_commit(self, err: KafkaError | None, partitions: list[TopicPartition]) -> None:
        failed = [tp for tp in partitions if tp.error is not None]
        if err is not None or failed:
            self._trouble(f"offset commit failed: {err or failed[0].error}")

    def _message_error(self, m: Message, err: KafkaError) -> None:
        """One message's error, handled on its own: one at an offset of an input
        partition (a batch librdkafka could not decode) is a skipped offset, counted
        by the daemon; any other is trouble, logged (and ``stuck()`` if it lasts)."""
        if err.code() == KafkaError._PARTITION_EOF:
            return
        topic, partition, offset = m.topic(), m.partition(), m.offset()
        if (topic not in self._kinds or partition is None or offset is None or offset < 0
                or self._consumer is None):
            self._trouble(f"fetch error: {err}")
            return
        skip, trouble = skip_past(self._consumer, self._bad_batch, m, err)
        self._skips.append(skip)
        if trouble is not None:
            self._trouble(trouble)

    # ------------------------------------------------------------------ logging

    def _trouble(self, what: str) -> None:
        now = time.monotonic()
        self._last_trouble, self._last_failed = what, now
        if self._down_since is None:
            self._down_since = now
        if now - self._last_warning >= self._log_interval_s:
            self._last_warning = now
            log.warning("Kafka %s (%s); down for %.0fs, retrying", what,
                        ",".join(self._config.bootstrap_servers), now - self._down_since)

    def _recovered(self) -> None:
        if self._down_since is not None:
            log.warning("Kafka reachable again after %.0fs", time.monotonic() - self._down_since)
            self._down_since = None
            self._last_warning = -float("inf")


def skip_past(consumer: Consumer, bad: dict[Position, tuple[int, int]], m: Message,
              err: KafkaError) -> tuple[Skip, str | None]:
    """A message error at an offset of an input partition: the offset skipped (and the
    consumer sought past it), with why the seek failed, if it did. librdkafka reports a
    batch it cannot decode (at its first offset, or where the fetch began) and fetches
    it again, forever. The error does not say where the batch ends, so the consumer
    steps one offset at a time (``bad``: per partition, the batch's first offset and the
    next to try); an error between the batch's first offset and the step just taken is
    the same batch, counted once (the later skips have no reason)."""
    topic: Any = m.topic()
    partition: Any = m.partition()
    offset: Any = m.offset()
    key = (topic, partition)
    seen = bad.get(key)
    same = seen is not None and seen[0] <= offset <= seen[1]
    first = seen[0] if same and seen is not None else offset
    step = max(offset, seen[1] if same and seen is not None else offset) + 1
    bad[key] = (first, step)
    skip = Skip(topic, partition, step - 1, step, "" if same else "bad_batch",
                f"librdkafka: {err.str()}", None)
    try:
        consumer.seek(TopicPartition(topic, partition, step))
    except KafkaException as exc:
        return skip, (f"cannot seek past the batch at {topic}/{partition}/{offset}: "
                      f"{exc!r}")
    return skip, None


def _chunks(messages: list[Any]) -> list[Chunk]:
    """Error-free messages as per-partition columns, offset order kept in each. Each
    getter is mapped over the poll in C, and the runs of one partition are found in
    numpy: 180 instead of 280 ns a message (measured on 5,000)."""
    # (the getters' types allow None; a fetched message has topic, partition, offset)
    topics: list[Any] = list(map(Message.topic, messages))
    parts: list[Any] = list(map(Message.partition, messages))
    values = list(map(Message.value, messages))
    stamps = [ts if kind != _NO_TIMESTAMP else None
              for kind, ts in map(Message.timestamp, messages)]
    offsets: list[Any] = list(map(Message.offset, messages))
    keys: list[Any] = list(map(Message.key, messages))
    n = len(messages)
    p, t = np.array(parts), np.array(topics, dtype=object)
    cuts = [0, *(np.flatnonzero((p[1:] != p[:-1]) | (t[1:] != t[:-1])) + 1).tolist(), n]
    groups: dict[tuple[str, int], tuple[list[bytes | None], list[int | None], list[int],
                                        list[bytes | None]]] = {}
    for a, b in pairwise(cuts):
        cols = groups.get((topics[a], parts[a]))
        if cols is None:
            groups[(topics[a], parts[a])] = (values[a:b], stamps[a:b], offsets[a:b], keys[a:b])
        else:
            cols[0].extend(values[a:b])
            cols[1].extend(stamps[a:b])
            cols[2].extend(offsets[a:b])
            cols[3].extend(keys[a:b])
    return [(t, p, vs, ss, os_, ks) for (t, p), (vs, ss, os_, ks) in groups.items()]
