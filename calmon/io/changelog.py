"""Group mode's changelog (contract §8): each task's state in the compacted
``kafka.state_changelog_topic``, written in the same Kafka transaction as the group's
offsets, and read back by whichever member is assigned the task's partition.

A task is an input partition ``p``; its state goes to changelog partition ``p`` under
keys ``p/<chunk>`` (a state larger than a record is cut in chunks), each record with a
header naming the checkpoint it belongs to (``calmon-ckpt``: the member's transactional
id and a serial) and the predictions offset committed with it. The offsets committed in
the same transaction carry that name as their metadata, so a restore takes the chunks
of exactly the committed checkpoint: records of an aborted transaction (a fenced
zombie's, which Tansu serves even under ``read_committed``) and older versions not yet
compacted away are skipped by name. A broker that drops offset metadata (Tansu) is
read by offset instead: the newest complete checkpoint written with the committed
offset. Each checkpoint holds a task's whole state with the positions of both topics it
reflects, so even an aborted one taken that way is a consistent state to go on from.

EOS-v2 (KIP-447): one transactional producer per member; the group's generation is
checked by the broker at ``send_offsets_to_transaction``, so a member that lost its
partitions (a zombie) cannot commit, and its records are aborted.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.errors import KafkaError, TopicAlreadyExistsError
from kafka.structs import OffsetAndMetadata

from calmon.config import KafkaConfig
from calmon.io.checkpoint import decode, encode
from calmon.io.topics import client_settings

log = logging.getLogger(__name__)

CKPT_HEADER = "calmon-ckpt"
CHUNK_HEADER = "calmon-chunk"  # "<index>/<count>"
POS_HEADER = "calmon-offset"  # the predictions offset committed with it
CHUNK_BYTES = 512 * 1024  # well inside the default record and request limits
RESTORE_POLL_MS = 500
# a member killed mid-transaction holds its partitions' committed offsets unstable
# (and the changelog's last stable offset) until this passes: short, but well above a
# checkpoint's time
TRANSACTION_TIMEOUT_MS = 20_000
# compacted, and in segments small enough that compaction keeps up with a snapshot per
# task per checkpoint (Kafka never compacts the active segment; the default is 7 days)
TOPIC_CONFIGS = {"cleanup.policy": "compact", "segment.ms": "600000",
                 "min.cleanable.dirty.ratio": "0.1"}


# a record written in a checkpoint's transaction besides the state: (topic, key, value,
# headers)
Extra = tuple[str, bytes, bytes, list[tuple[str, bytes]]]


class ChangelogError(Exception):
    """The checkpoint transaction failed (fenced, generation moved, broker trouble):
    nothing of it is committed."""


def producer_settings(cfg: KafkaConfig) -> dict[str, Any]:
    return {"bootstrap_servers": list(cfg.bootstrap_servers),
            **client_settings(cfg.client, KafkaProducer.DEFAULT_CONFIG, role="producer")}


def reader_settings(cfg: KafkaConfig) -> dict[str, Any]:
    settings = {k: v for k, v in client_settings(
        cfg.client, KafkaConsumer.DEFAULT_CONFIG, role="consumer").items()
        if k not in ("group_instance_id", "session_timeout_ms", "heartbeat_interval_ms",
                     "max_poll_interval_ms")}
    settings.update(bootstrap_servers=list(cfg.bootstrap_servers), group_id=None,
                    enable_auto_commit=False, isolation_level="read_committed",
                    key_deserializer=None, value_deserializer=None)
    return settings


def ensure_topic(cfg: KafkaConfig, partitions: int, timeout_s: float = 30.0) -> None:
    """Create the changelog topic, compacted, with ``partitions`` partitions, unless it
    exists (a topic made by hand is used as it is)."""
    from kafka.admin import KafkaAdminClient, NewTopic

    settings = {k: v for k, v in client_settings(
        cfg.client, KafkaAdminClient.DEFAULT_CONFIG, role="admin").items()}
    admin = KafkaAdminClient(bootstrap_servers=list(cfg.bootstrap_servers), **settings)
    try:
        if cfg.changelog_topic in admin.list_topics():
            return
        topic = NewTopic(cfg.changelog_topic, partitions, 1, topic_configs=TOPIC_CONFIGS)
        try:
            admin.create_topics([topic], timeout_ms=int(timeout_s * 1000))
            log.info("created the changelog topic %r (%d partitions, compacted)",
                     cfg.changelog_topic, partitions)
        except TopicAlreadyExistsError:  # another member made it first
            pass
    finally:
        admin.close()


def member_id(cfg: KafkaConfig) -> str:
    """This member's transactional id: the static member's name (a restart fences its
    former self), else a new one per process."""
    gid = cfg.client.get("group_instance_id")
    own = str(gid) if gid else uuid.uuid4().hex[:12]
    return f"{cfg.group_id}-state-{own}"


@dataclass
class Restored:
    """A task's state as the changelog holds it for the committed checkpoint."""

    state: dict[str, Any] | None  # None: no committed checkpoint of this task
    bytes_read: int


class _Found:
    """The chunks of the wanted checkpoint as the changelog is read: by name, or (no
    name) the newest complete one written with the committed offset."""

    def __init__(self, name: str | None, offset: str) -> None:
        self.name = name
        self.offset = offset
        self.current: str | None = None
        self.chunks: dict[int, bytes] = {}
        self.count = 0
        self.complete: bytes | None = None

    def add(self, heads: dict[str, bytes], value: bytes) -> None:
        name = heads.get(CKPT_HEADER, b"").decode()
        if self.name is not None and name != self.name:
            return
        if self.name is None and heads.get(POS_HEADER, b"").decode() != self.offset:
            return
        if name != self.current:
            self.current, self.chunks = name, {}
        index, count = heads[CHUNK_HEADER].decode().split("/")
        self.chunks[int(index)], self.count = value, int(count)
        if len(self.chunks) == self.count:
            self.complete = b"".join(self.chunks[i] for i in range(self.count))

    def blob(self) -> bytes | None:
        return self.complete


class Changelog:
    """The member's transactional writer and the restore reader of the changelog."""

    def __init__(self, cfg: KafkaConfig) -> None:
        self.cfg = cfg
        self.topic = cfg.changelog_topic
        self.transactional_id = member_id(cfg)
        self._serial = 0
        self._producer: KafkaProducer | None = None

    def _writer(self) -> KafkaProducer:
        if self._producer is None:
            p = KafkaProducer(transactional_id=self.transactional_id,
                              transaction_timeout_ms=TRANSACTION_TIMEOUT_MS,
                              **producer_settings(self.cfg))
            p.init_transactions()
            self._producer = p
        return self._producer

    def commit(self, states: Mapping[int, dict[str, Any]], offsets: Mapping[int, int],
               group_metadata: Any, extra: Sequence[Extra] = ()) -> str:
        """One transaction: every task's state (partition -> plain data) and the
        predictions offsets of the same partitions, named by one checkpoint id, and the
        ``extra`` records (topic, key, value, headers: the joined batches of scaled-out
        recalibration). Returns the id; raises ChangelogError when nothing was committed."""
        self._serial += 1
        ckpt = f"{self.transactional_id}:{self._serial}:{int(time.time())}"
        p = self._writer()
        try:
            p.begin_transaction()
            for part, state in states.items():
                blob = encode(state)
                chunks = [blob[i:i + CHUNK_BYTES] for i in range(0, len(blob), CHUNK_BYTES)]
                for i, chunk in enumerate(chunks or [b""]):
                    p.send(self.topic, key=f"{part}/{i}".encode(), value=chunk,
                           partition=part,
                           headers=[(CKPT_HEADER, ckpt.encode()),
                                    (CHUNK_HEADER, f"{i}/{max(len(chunks), 1)}".encode()),
                                    (POS_HEADER, str(offsets[part]).encode())])
            meta = {TopicPartition(self.cfg.predictions_topic, part):
                    OffsetAndMetadata(off, ckpt, -1) for part, off in offsets.items()}
            p.send_offsets_to_transaction(meta, group_metadata)
            # after the offsets, where Apache Kafka checks the member's generation: a
            # zombie's are not even written as aborted records (which Tansu serves)
            for topic, key, value, headers in extra:
                p.send(topic, key=key, value=value, headers=headers)
            p.commit_transaction()
        except Exception as e:
            self._drop(p)
            raise ChangelogError(f"the checkpoint transaction failed: {e!r}") from e
        return ckpt

    def _drop(self, p: KafkaProducer) -> None:
        """After a failed transaction: abort when possible, else start anew (a fenced
        producer cannot be used again)."""
        try:
            p.abort_transaction()
            return
        except Exception:
            log.debug("aborting the changelog transaction raised", exc_info=True)
        self._producer = None
        try:
            p.close(timeout=0)
        except Exception:
            log.debug("closing the changelog producer raised", exc_info=True)

    def restore(self, part: int, committed: int | None, ckpt: str | None,
                progress: Callable[[int, int, int], None] | None = None) -> Restored:
        """Task ``part``'s state of checkpoint ``ckpt`` (the metadata of the committed
        offset ``committed``; without it, the newest one written with that offset), read
        from the changelog partition to its end; chunks of any other are skipped.
        ``progress(bytes_done, records_done, records_total)`` as it reads (the bytes
        ahead are not known before they are read)."""
        if committed is None:
            return Restored(None, 0)
        reader = KafkaConsumer(**reader_settings(self.cfg))
        try:
            tp = TopicPartition(self.topic, part)
            reader.assign([tp])
            reader.seek_to_beginning(tp)
            begin = int(reader.beginning_offsets([tp])[tp])
            end = int(reader.end_offsets([tp])[tp])
            found = _Found(ckpt, str(committed))
            done = 0
            while reader.position(tp) < end:
                for rec in reader.poll(timeout_ms=RESTORE_POLL_MS).get(tp, ()):
                    done += len(rec.value or b"")
                    found.add(dict(rec.headers or ()), rec.value or b"")
                if progress is not None:
                    progress(done, reader.position(tp) - begin, end - begin)
            blob = found.blob()
            if blob is None:
                if ckpt is None:  # offsets committed without a state: nothing to go on
                    return Restored(None, done)
                raise ChangelogError(f"{self.topic}/{part}: checkpoint {ckpt} is committed "
                                     f"but its chunks are not all in the changelog")
            return Restored(decode(blob), done)
        except KafkaError as e:
            raise ChangelogError(f"cannot read {self.topic}/{part}: {e!r}") from e
        finally:
            reader.close(autocommit=False)

    def close(self) -> None:
        p, self._producer = self._producer, None
        if p is not None:
            try:
                p.close(timeout=5)
            except Exception:
                log.debug("closing the changelog producer raised", exc_info=True)
