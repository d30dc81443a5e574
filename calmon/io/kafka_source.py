"""Predictions and labels from Kafka as raw records plus the offsets they reach.

One kafka-python ``KafkaConsumer`` reads both topics with static ``assign()``:
no group membership, so no rebalances and no join delay, and an instance's
partitions are fixed by ``kafka.instance`` so its state dir always matches them.
Offsets are committed to the group id so that lag shows up in the usual Kafka
tooling; they are also where a run without a checkpoint starts (``calmon.io.start``).

Not thread-safe (kafka-python consumers are not): poll, commit and assign
belong to one thread. ``connected()`` only reads flags and may be called from
another thread (readiness probe).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

from kafka import KafkaConsumer, TopicPartition
from kafka.errors import KafkaError, SaslAuthenticationFailedError
from kafka.structs import OffsetAndMetadata

from calmon.config import KafkaConfig
from calmon.io import batch_guard, kafka_fixes
from calmon.io.security import credentials_problem, tls_problem
from calmon.io.source import MISSING_TOPIC_GRACE_S, Chunk, KafkaAuthError, Position, SourceBase
from calmon.io.source import Batch as Batch  # re-exported: older imports
from calmon.io.source import KafkaSourceError as KafkaSourceError
from calmon.io.start import Start, start_of
from calmon.io.topics import client_settings, fetch_bytes

log = logging.getLogger(__name__)

_MISSING_TOPIC_GRACE_S = MISSING_TOPIC_GRACE_S
END_OFFSETS_TIMEOUT_MS = 2000  # a slow broker delays lag figures, never the poll loop for long
METADATA_MAX_AGE_MS = 30_000  # kafka-python's default is 5 min


def consumer_lag(end_offsets: dict[Position, int],
                 positions: dict[Position, int]) -> dict[Position, int]:
    """Records calmon has still to read per partition: the partition's end offset
    (the offset of its next record) minus calmon's next offset, for partitions where
    both are known. Floored at 0: end offsets are fetched every few seconds, so the
    position may already be past an older end offset."""
    return {tp: max(0, end - positions[tp]) for tp, end in end_offsets.items()
            if tp in positions}


def connect(factory: Any, settings: dict[str, Any], client: Mapping[str, Any],
            servers: Sequence[str]) -> Any:
    """``factory(**settings)`` (a kafka-python client that bootstraps), or
    KafkaAuthError naming the ``kafka.client`` setting when the broker refuses the
    login or its certificate is not trusted (kafka-python only logs a failed TLS
    handshake and retries it until its bootstrap timeout, so the certificate is
    checked first); any other error as the factory raised it."""
    why = tls_problem(servers, client)
    if why is not None:
        raise KafkaAuthError(why)
    began = time.monotonic()
    try:
        return factory(**settings)
    except SaslAuthenticationFailedError as exc:
        raise KafkaAuthError(credentials_problem(client, str(exc))) from None
    except KafkaError:
        rejected = kafka_fixes.auth_failure(str(settings.get("client_id")), began)
        if rejected is not None:
            raise KafkaAuthError(credentials_problem(client, rejected)) from None
        raise


class KafkaSource(SourceBase):
    """Static-assignment consumer over ``predictions_topic`` and ``labels_topic``
    (``kafka.library: kafka-python``; see ``calmon.io.source.ChunkSource``)."""

    def __init__(
        self,
        config: KafkaConfig,
        *,
        metadata_timeout_s: float = 30.0,
        log_interval_s: float = 60.0,
    ) -> None:
        if config.predictions_topic == config.labels_topic:
            raise ValueError("predictions_topic and labels_topic must differ")
        super().__init__(config)
        self._config = config
        self._metadata_timeout_s = metadata_timeout_s
        self._log_interval_s = log_interval_s
        self._consumer: KafkaConsumer | None = None
        self._client_id = ""
        self._last_warning = -float("inf")
        # every batch decoded in bounded memory, and one that cannot be read skipped
        # (counted by the daemon) rather than raised at the same offset every poll
        batch_guard.install()
        fetch = fetch_bytes(config.max_record_bytes)
        self._batch_limit = max(batch_guard.BATCH_LIMIT, 2 * fetch)
        self._poll_budget = max(batch_guard.POLL_BUDGET, fetch)

    # ------------------------------------------------------------------ setup

    def _settings(self) -> dict[str, Any]:
        cfg = self._config
        size = fetch_bytes(cfg.max_record_bytes)
        defaults: dict[str, Any] = {
            "client_id": "calmon" if cfg.static is None else f"calmon-{cfg.static.index}",
            "max_partition_fetch_bytes": size,
            "fetch_max_bytes": max(50 * 1024 * 1024, size),
            # A misspelt input topic must fail loudly, not be created empty.
            "allow_auto_create_topics": False,
            "bootstrap_timeout_ms": int(self._metadata_timeout_s * 1000),
            # partitions added to the topics are seen within this (refresh())
            "metadata_max_age_ms": METADATA_MAX_AGE_MS,
        }
        accepted = KafkaConsumer.DEFAULT_CONFIG
        settings = {k: v for k, v in defaults.items() if k in accepted}
        settings.update(client_settings(cfg.client, accepted, role="consumer"))
        # These carry calmon's semantics; a client override would break them.
        forced = {
            "bootstrap_servers": list(cfg.bootstrap_servers),
            "group_id": cfg.group_id or None,
            "enable_auto_commit": False,
            "auto_offset_reset": cfg.auto_offset_reset,
            "key_deserializer": None,
            "value_deserializer": None,
        }
        for key in forced.keys() & cfg.client.keys():
            log.warning("kafka.client.%s: ignored, calmon sets it itself", key)
        settings.update(forced)
        return settings

    def _connect(self) -> KafkaConsumer:
        cfg = self._config
        settings = self._settings()
        self._client_id = str(settings.get("client_id"))
        try:
            return connect(KafkaConsumer, settings, cfg.client, cfg.bootstrap_servers)
        except KafkaError as exc:
            raise KafkaSourceError(
                f"cannot connect to {','.join(cfg.bootstrap_servers)}: {exc}") from exc

    def _partitions(self, consumer: KafkaConsumer, topic: str, deadline: float) -> set[int]:
        """Partition ids of ``topic``; waits for metadata up to ``deadline``."""
        last_error: Exception | None = None
        missing_since: float | None = None
        while True:
            now = time.monotonic()
            try:
                parts = consumer.partitions_for_topic(topic)
                last_error = None
            except KafkaError as exc:  # broker unreachable: keep trying until the deadline
                parts, last_error = None, exc
            if parts:
                return set(parts)
            if parts is not None and last_error is None:
                # The broker answered without the topic. Give a just-created topic a
                # few seconds to show up, but report a typo long before the deadline.
                missing_since = now if missing_since is None else missing_since
                if now - missing_since >= _MISSING_TOPIC_GRACE_S:
                    break
            if now >= deadline:
                break
            time.sleep(0.1)
        if last_error is not None:
            raise KafkaSourceError(
                f"cannot read metadata of topic {topic!r} from "
                f"{','.join(self._config.bootstrap_servers)}: {last_error}"
            )
        raise KafkaSourceError(
            f"topic {topic!r} does not exist (or is not visible to this client) on "
            f"{','.join(self._config.bootstrap_servers)}"
        )

    def assign(
        self, positions: dict[Position, int] | None = None, *, from_checkpoint: bool = False
    ) -> list[Position]:
        """Take this instance's partitions of both topics and set where to read.

        A partition found in ``positions`` (restored from a checkpoint) starts at
        that next offset; any other starts at the group's committed offset, else
        at ``auto_offset_reset``. With ``from_checkpoint`` (``positions`` came with
        a restored state, possibly an older one than the group's committed offsets
        belong to), a partition missing from ``positions`` was never counted in that
        state, so it starts at ``auto_offset_reset`` and committed offsets are not
        used. Returns the owned partitions, sorted.
        Raises KafkaSourceError when the broker stays unreachable for
        ``metadata_timeout_s`` or a topic does not exist.
        """
        deadline = time.monotonic() + self._metadata_timeout_s
        if self._consumer is None:
            self._consumer = self._connect()
        consumer = self._consumer
        owned = self._plan({t: self._partitions(consumer, t, deadline) for t in self._kinds})
        self._problem = None
        if not owned:
            log.warning(
                "instance %s owns no partition of %s", self._config.instance, sorted(self._kinds)
            )
        consumer.assign([TopicPartition(t, p) for t, p in owned])
        stored = positions or {}
        unknown = []
        for t, p in owned:
            if (t, p) in stored:
                consumer.seek(TopicPartition(t, p), stored[(t, p)])
            else:
                unknown.append(TopicPartition(t, p))
        if from_checkpoint and unknown:
            if self._config.auto_offset_reset == "earliest":
                consumer.seek_to_beginning(*unknown)
            else:
                consumer.seek_to_end(*unknown)
        # Partitions without a stored position are resolved lazily by kafka-python
        # on the next poll: committed offset first, then auto_offset_reset.
        self._owned = sorted(owned)
        log.info("assigned %d partitions: %s", len(owned), self._owned)
        self.starts = self._find_starts(consumer, stored, from_checkpoint)
        self._say_starts(self._config.group_id or None, self._config.auto_offset_reset)
        return list(self._owned)

    def _find_starts(self, consumer: Any, stored: Mapping[Position, int],
                     checkpointed: bool) -> dict[Position, Start]:
        """Where each owned partition starts (``calmon.io.start``'s rule, which the seeks
        above and kafka-python's lazy reset follow), for the log and /status; empty when
        the broker does not answer (the run goes on: this is only said)."""
        tps = [TopicPartition(t, p) for t, p in self._owned]
        if not tps:
            return {}
        try:
            begin = consumer.beginning_offsets(tps, timeout_ms=END_OFFSETS_TIMEOUT_MS)
            end = consumer.end_offsets(tps, timeout_ms=END_OFFSETS_TIMEOUT_MS)
            group = bool(self._config.group_id) and not stored and not checkpointed
            out = {}
            for tp in tps:
                key = (tp.topic, tp.partition)
                committed = consumer.committed(tp) if group else None
                at = stored.get(key, committed)
                # some brokers (Tansu) answer an end offset short of the last batch: a
                # stored or committed offset past it is still inside the partition
                top = max(int(end[tp]), at if at is not None else 0)
                out[key] = start_of(checkpointed=bool(stored) or checkpointed,
                                    stored=stored.get(key), committed=committed,
                                    begin=int(begin[tp]), end=top,
                                    reset=self._config.auto_offset_reset)
            return out
        except Exception as exc:  # only said: it must never fail the assign
            log.debug("cannot say where the partitions start: %r", exc)
            return {}

    # ------------------------------------------------------------------ reading

    def poll_chunks(self, timeout_ms: int = 1000, max_records: int = 500) -> list[Chunk]:
        """``poll`` as plain per-partition columns: cheap to pickle to another process."""
        if self._consumer is None:
            raise RuntimeError("KafkaSource.poll() before assign()")
        batch_guard.begin(batch_limit=self._batch_limit, poll_budget=self._poll_budget,
                          keep_bytes=self._config.max_record_bytes)
        try:
            polled = self._consumer.poll(timeout_ms=timeout_ms, max_records=max_records)
        except Exception as exc:  # KafkaError, or a decoding error kafka-python lets out
            polled = None
            self._trouble(f"poll failed: {exc!r}")
        finally:
            skips, deferred = batch_guard.end()
        for tp, offset in deferred.items():  # read again, first, in the next poll
            self._consumer.seek(tp, offset)
        if skips:
            self._skips.extend(skips)
            self._recovered()  # the partition moved on
        if polled is None:
            return []
        if not polled:
            # kafka-python swallows connection errors inside poll(), so an empty
            # poll is the only hint: ask the connection state.
            if self.connected():
                self._recovered(records=False)
            else:
                self._trouble("broker unreachable")
            return []
        self._recovered()
        return [(tp.topic, tp.partition, [r.value for r in recs],
                 [r.timestamp for r in recs], [r.offset for r in recs], [r.key for r in recs])
                for tp, recs in polled.items() if recs]

    def _partition_sets(self) -> dict[str, set[int]] | None:
        """From the client's metadata cache, which it refreshes every
        ``metadata_max_age_ms`` on its own (no I/O here while the topics are known)."""
        consumer = self._consumer
        if consumer is None:
            return None
        try:
            parts = {t: set(consumer.partitions_for_topic(t) or ()) for t in self._kinds}
        except KafkaError as exc:
            log.debug("cannot read partition metadata: %r", exc)
            return None
        return parts if all(parts.values()) else None  # a topic missing: say nothing yet

    def _add(self, new: list[Position]) -> None:
        consumer = self._consumer
        assert consumer is not None
        # assign() replaces the assignment but keeps the position of every partition
        # still in it (kafka-python's SubscriptionState)
        consumer.assign([TopicPartition(t, p) for t, p in sorted({*self._owned, *new})])
        consumer.seek_to_beginning(*[TopicPartition(t, p) for t, p in new])

    def end_offsets(self) -> dict[Position, int]:
        """End offsets (offset of the next record) of the owned partitions; empty when
        the broker does not answer within ``END_OFFSETS_TIMEOUT_MS``."""
        if self._consumer is None or not self._owned:
            return {}
        try:
            ends = self._consumer.end_offsets([TopicPartition(t, p) for t, p in self._owned],
                                              timeout_ms=END_OFFSETS_TIMEOUT_MS)
        except KafkaError as exc:
            log.debug("cannot fetch end offsets: %r", exc)
            return {}
        return {(tp.topic, tp.partition): int(off) for tp, off in ends.items()
                if off is not None}

    def commit(self, positions: dict[Position, int]) -> bool:
        """Commit next offsets to the group (lag monitoring; a run without a checkpoint
        starts from them).

        Only owned partitions are committed. Returns False, after logging, when
        the commit failed; never raises on broker trouble.
        """
        if self._consumer is None or not self._config.group_id:
            return False
        owned = set(self._owned)
        offsets = {
            TopicPartition(t, p): _offset_and_metadata(off)
            for (t, p), off in positions.items()
            if (t, p) in owned
        }
        if not offsets:
            return True
        try:
            self._consumer.commit(offsets)
        except KafkaError as exc:
            self._trouble(f"offset commit failed: {exc!r}")
            return False
        return True

    def connected(self) -> bool:
        """True while at least one connection to a known broker is up.

        Cheap (no I/O). kafka-python keeps the connection busy with fetches while
        the owner polls, so a False here during polling means the broker is gone.
        """
        consumer = self._consumer
        if consumer is None:
            return False
        try:
            client = consumer._client  # no public per-connection state in kafka-python
            for broker in client.cluster.brokers():
                node = getattr(broker, "node_id", None)
                if node is None:
                    node = broker.nodeId  # kafka-python 2.x BrokerMetadata
                if client.connected(node):
                    return True
            return False
        except Exception:  # internals moved in another kafka-python version
            log.debug("cannot read kafka-python connection state", exc_info=True)
            return True

    def refused(self) -> str | None:
        """While the broker is unreachable: the login it rejected since (its reason,
        naming the setting), else None."""
        since = self._down_since
        if since is None or self.connected():
            return None
        why = kafka_fixes.auth_failure(self._client_id, since - 1.0)
        return credentials_problem(self._config.client, why) if why is not None else None

    def close(self) -> None:
        """Close the consumer without committing (commits are explicit)."""
        consumer, self._consumer = self._consumer, None
        if consumer is None:
            return
        try:
            consumer.close(autocommit=False)
        except Exception:  # closing is best effort; the process may be exiting
            log.debug("error closing Kafka consumer", exc_info=True)

    # ------------------------------------------------------------------ logging

    def _trouble(self, what: str) -> None:
        now = time.monotonic()
        self._last_trouble, self._last_failed = what, now
        if self._down_since is None:
            self._down_since = now
        if now - self._last_warning >= self._log_interval_s:
            self._last_warning = now
            log.warning(
                "Kafka %s (%s); down for %.0fs, retrying",
                what,
                ",".join(self._config.bootstrap_servers),
                now - self._down_since,
            )

    def _recovered(self, records: bool = True) -> None:
        """Records (or skips) came: trouble is over. An empty poll with the broker up
        ends a broker outage, but not polls that raise: kafka-python answers empty
        polls between two that raise on the same batch."""
        if not records and self._last_trouble.startswith("poll failed"):
            return
        if self._down_since is not None:
            log.warning("Kafka reachable again after %.0fs", time.monotonic() - self._down_since)
            self._down_since = None
            self._last_warning = -float("inf")


def _offset_and_metadata(offset: int) -> OffsetAndMetadata:
    # kafka-python >= 2.1 added leader_epoch to the tuple; -1 means unknown.
    if len(OffsetAndMetadata._fields) >= 3:
        return OffsetAndMetadata(offset, "", -1)
    return OffsetAndMetadata(offset, "")  # pragma: no cover - kafka-python 2.0
