"""Group mode's changelog (contract §8): each task's state in the compacted
``kafka.state_changelog_topic``, written incrementally in the same Kafka transaction as
the group's offsets, and read back by whichever member is assigned the task's
partition.

A task is an input partition ``p``; its state goes to changelog partition ``p`` as
sections (``calmon.engine.sections``: head, index, groups of series), each under keys
``p/<section>/<chunk>``; a checkpoint writes the sections that changed
(``calmon.tasklog``). Every record names its checkpoint (``calmon-ckpt``:
``<incarnation>:<seq>``) and the predictions offset committed with it; the head's first
chunk carries the lineage, the incarnations the state went through, each with the
last of its checkpoints on the chain. The committed offset's metadata names the
checkpoint; a restore reads the partition to its end and takes each section's newest
version on that chain (``_Versions``), so records of an aborted transaction (a fenced
zombie's, which Tansu serves even under ``read_committed``) are never taken. A broker
that drops offset metadata (Tansu) is read by offset: the newest complete head written
with the committed offset. The format in full: ARCHITECTURE.md, "Changelog format".

EOS-v2 (KIP-447): one transactional producer per member; the group's generation is
checked by the broker at ``send_offsets_to_transaction``, so a member that lost its
partitions (a zombie) cannot commit, and its records are aborted.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.errors import KafkaError, TopicAlreadyExistsError
from kafka.structs import OffsetAndMetadata

from calmon.config import KafkaConfig
from calmon.engine.sections import HEAD  # the section a restore starts from
from calmon.io.topics import client_settings

log = logging.getLogger(__name__)

CKPT_HEADER = "calmon-ckpt"  # "<incarnation>:<seq>"
CHUNK_HEADER = "calmon-chunk"  # "<index>/<count>"
POS_HEADER = "calmon-offset"  # the predictions offset committed with it
LINEAGE_HEADER = "calmon-lineage"  # on a head's first chunk: JSON [[incarnation, seq], ...]
BETWEEN_RECORDS = 200
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


def _records(part: int, write: TaskWrite) -> Iterator[tuple[bytes, bytes | None,
                                                           list[tuple[str, bytes]]]]:
    """A task's records: each section's chunks, then tombstones for the chunks it no
    longer has (all of them for a removed section)."""
    for section, value in write.sections.items():
        chunks = ([] if value is None else
                  [value[i:i + CHUNK_BYTES] for i in range(0, len(value), CHUNK_BYTES)] or [b""])
        n = len(chunks)
        for i in range(max(n, write.chunks_before.get(section, 0))):
            heads = [(CKPT_HEADER, write.name.encode()),
                     (CHUNK_HEADER, f"{i}/{n}".encode()),
                     (POS_HEADER, str(write.offset).encode())]
            if section == HEAD and i == 0:
                heads.append((LINEAGE_HEADER, json.dumps(write.lineage).encode()))
            yield f"{part}/{section}/{i}".encode(), chunks[i] if i < n else None, heads


def member_id(cfg: KafkaConfig) -> str:
    """This member's transactional id: the static member's name (a restart fences its
    former self), else a new one per process."""
    gid = cfg.client.get("group_instance_id") or (
        cfg.client.get("group.instance.id") if cfg.library == "confluent" else None)
    own = str(gid) if gid else uuid.uuid4().hex[:12]
    return f"{cfg.group_id}-state-{own}"


@dataclass
class TaskWrite:
    """One task's records in a checkpoint: the sections that changed since its last
    committed checkpoint (``calmon.engine.sections``), encoded, or None for a section
    now empty (tombstones)."""

    name: str  # "<incarnation>:<seq>"
    lineage: list[list[Any]]  # [[incarnation, last seq on the chain], ...], oldest first
    sections: dict[str, bytes | None]
    chunks_before: dict[str, int]  # section -> chunks it had (those past the new count go)
    offset: int  # the predictions offset committed with it


@dataclass
class Restored:
    """A task's sections as the changelog holds them for the committed checkpoint."""

    sections: dict[str, bytes]  # section -> value (the newest on the chain)
    holders: dict[str, str]  # section -> the incarnation that wrote it (tombstones too)
    lineage: list[list[Any]]  # the committed checkpoint's
    name: str | None  # None: no committed checkpoint of this task
    bytes_read: int  # changelog bytes read for it
    # the changelog offset after every record of the chain (where a read for what
    # follows starts, ``calmon.io.taskcache``); None: not known
    end: int | None = None
    source: str = "changelog"  # or "cache", "cache+changelog" (calmon.io.taskcache)
    cache_bytes: int = 0  # bytes of it read from the local cache


def parse_name(name: str) -> tuple[str, int] | None:
    inc, _, seq = name.partition(":")
    return (inc, int(seq)) if inc and seq.isdigit() else None


@dataclass
class _Version:
    count: int  # chunks; 0: the section was removed
    pos: str  # the predictions offset committed with it
    last: int = -1  # changelog offset of its newest record
    lineage: list[list[Any]] | None = None
    chunks: dict[int, bytes] | None = None

    def complete(self) -> bool:
        return self.count == 0 or (self.chunks is not None and len(self.chunks) == self.count)

    def value(self) -> bytes:
        assert self.chunks is not None
        return b"".join(self.chunks[i] for i in range(self.count))


def _is_lineage(x: Any) -> bool:
    return isinstance(x, list) and all(
        isinstance(e, list) and len(e) == 2 and isinstance(e[0], str) and type(e[1]) is int
        for e in x)


class _Versions:
    """What a changelog partition holds, read to its end: per section and incarnation
    the two newest versions (an incarnation ends at its first aborted checkpoint, so
    the newest on the chain is one of them)."""

    def __init__(self, part: int) -> None:
        self.prefix = f"{part}/"
        self.held: dict[str, dict[str, dict[int, _Version]]] = {}

    def add(self, key: bytes | None, heads: dict[str, bytes], value: bytes | None,
            offset: int) -> None:
        parts = (key or b"").decode(errors="replace").split("/")
        name = parse_name(heads.get(CKPT_HEADER, b"").decode(errors="replace"))
        if len(parts) != 3 or name is None or CHUNK_HEADER not in heads:
            return  # not a record of this format
        section, index = parts[1], int(parts[2]) if parts[2].isdigit() else -1
        _, _, count = heads[CHUNK_HEADER].decode(errors="replace").partition("/")
        if not count.isdigit() or index < 0:
            return
        n = int(count)
        if index >= n and n:
            return  # a tombstone of a chunk past a version's count
        inc, seq = name
        seqs = self.held.setdefault(section, {}).setdefault(inc, {})
        v = seqs.get(seq)
        if v is None:
            v = seqs[seq] = _Version(n, heads.get(POS_HEADER, b"").decode(),
                                     chunks={} if n else None)
            for old in sorted(seqs)[:-2]:
                del seqs[old]
            if seq not in seqs:
                return
        if LINEAGE_HEADER in heads:
            try:
                lineage = json.loads(heads[LINEAGE_HEADER])
            except ValueError:
                lineage = None
            v.lineage = lineage if _is_lineage(lineage) else None
        if n and v.chunks is not None and value is not None:
            v.chunks[index] = value
        v.last = offset

    def committed(self, ckpt: str | None, committed: int) -> tuple[str, _Version] | None:
        """The committed checkpoint's head: by name, else (a broker that drops offset
        metadata) the newest complete one written with the committed offset."""
        heads = self.held.get(HEAD, {})
        if ckpt is not None:
            name = parse_name(ckpt)
            v = None if name is None else heads.get(name[0], {}).get(name[1])
            return None if v is None or not v.complete() else (ckpt, v)
        best: tuple[str, _Version] | None = None
        for inc, seqs in heads.items():
            for seq, v in seqs.items():
                if v.complete() and v.pos == str(committed) and (
                        best is None or v.last > best[1].last):
                    best = (f"{inc}:{seq}", v)
        return best

    def chain(self, lineage: list[list[Any]]) -> tuple[dict[str, bytes], dict[str, str]]:
        """Each section's newest version on the chain ``lineage`` names: incarnations in
        order, each up to the last of its checkpoints the chain goes through. Records of
        anything else (an aborted checkpoint, a fenced zombie's) are left out."""
        bound = {str(inc): (i, int(b)) for i, (inc, b) in enumerate(lineage)}
        values: dict[str, bytes] = {}
        holders: dict[str, str] = {}
        for section, incs in self.held.items():
            best: tuple[int, int, str, _Version] | None = None
            for inc, seqs in incs.items():
                if inc not in bound:
                    continue
                order, last = bound[inc]
                for seq, v in seqs.items():
                    if seq <= last and (best is None or (order, seq) > best[:2]):
                        best = (order, seq, inc, v)
            if best is None:
                continue
            holders[section] = best[2]
            if not best[3].complete():
                raise ChangelogError(f"section {section} of checkpoint {best[2]}:{best[1]} "
                                     f"is not all in the changelog")
            if best[3].count:
                values[section] = best[3].value()
        return values, holders


class Changelog:
    """The member's transactional writer and the restore reader of the changelog."""

    def __init__(self, cfg: KafkaConfig) -> None:
        self.cfg = cfg
        self.topic = cfg.changelog_topic
        self.transactional_id = member_id(cfg)
        self._producer: KafkaProducer | None = None
        self.records = 0  # records written by committed checkpoints
        self.bytes = 0  # their values' bytes
        # changelog partition -> the offset after its records of the last committed
        # transaction (the local cache's starting point for a later read)
        self.ends: dict[int, int] = {}

    def _writer(self) -> KafkaProducer:
        if self._producer is None:
            self._producer = self._new_producer()
        return self._producer

    def _new_producer(self) -> Any:
        """A transactional producer, initialised (``confluent_changelog``: librdkafka's,
        behind the same calls)."""
        p = KafkaProducer(transactional_id=self.transactional_id,
                          transaction_timeout_ms=TRANSACTION_TIMEOUT_MS,
                          **producer_settings(self.cfg))
        p.init_transactions()
        return p

    def commit(self, states: Mapping[int, TaskWrite], offsets: Mapping[int, int],
               group_metadata: Any, *, between: Callable[[], None] | None = None,
               extra: Sequence[Extra] = ()) -> int:
        """One transaction: every task's changed sections (partition -> its write) and
        the predictions offsets of the same partitions, each named by its task's
        checkpoint, and the ``extra`` records (topic, key, value, headers: the joined
        batches of scaled-out recalibration). ``between`` is called every
        ``BETWEEN_RECORDS`` records (the loop keeps the group's poll timer alive);
        ``group_metadata`` may be a callable, asked just before the offsets are sent.
        Returns the records written; raises ChangelogError when nothing was committed."""
        p = self._writer()
        n = nbytes = 0
        last: dict[int, Any] = {}
        try:
            p.begin_transaction()
            for part, write in states.items():
                for key, value, heads in _records(part, write):
                    last[part] = p.send(self.topic, key=key, value=value, partition=part,
                                        headers=heads)
                    n += 1
                    nbytes += len(value or b"")
                    if between is not None and n % BETWEEN_RECORDS == 0:
                        between()
            meta = {TopicPartition(self.cfg.predictions_topic, part):
                    OffsetAndMetadata(off, states[part].name, -1)
                    for part, off in offsets.items()}
            # the member's generation taken as late as it can be (a callable checks the
            # member is still in the group, and raises ChangelogError when it is not)
            generation = group_metadata() if callable(group_metadata) else group_metadata
            p.send_offsets_to_transaction(meta, generation)
            # after the offsets, where Apache Kafka checks the member's generation: a
            # zombie's are not even written as aborted records (which Tansu serves)
            for topic, key, value, headers in extra:
                p.send(topic, key=key, value=value, headers=headers)
            p.commit_transaction()
        except Exception as e:
            self._drop(p)
            raise ChangelogError(f"the checkpoint transaction failed: {e!r}") from e
        self.records += n
        self.bytes += nbytes
        self.ends = {}
        for part, future in last.items():
            try:  # sent and committed: known
                self.ends[part] = int(future.get(timeout=1).offset) + 1
            except Exception:
                log.debug("offset of the changelog record not known", exc_info=True)
        return n

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

    def read(self, part: int, start: int | None,
             progress: Callable[[int, int, int], None] | None = None
             ) -> tuple[_Versions, int, int] | None:
        """Changelog partition ``part`` read from ``start`` (None: its beginning) to its
        end: what it holds, the bytes read and the end offset; None when ``start`` is
        not within the partition (a topic made anew). ``progress(bytes_done,
        records_done, records_total)`` as it reads. ChangelogError on broker trouble."""
        reader = KafkaConsumer(**reader_settings(self.cfg))
        try:
            tp = TopicPartition(self.topic, part)
            reader.assign([tp])
            begin = int(reader.beginning_offsets([tp])[tp])
            end = int(reader.end_offsets([tp])[tp])
            if start is None:
                reader.seek_to_beginning(tp)
            elif begin <= start <= end:
                reader.seek(tp, start)
                begin = start
            else:
                return None
            held = _Versions(part)
            done = 0
            while reader.position(tp) < end:
                for rec in reader.poll(timeout_ms=RESTORE_POLL_MS).get(tp, ()):
                    done += len(rec.value or b"")
                    held.add(rec.key, dict(rec.headers or ()), rec.value, rec.offset)
                if progress is not None:
                    progress(done, reader.position(tp) - begin, end - begin)
            return held, done, end
        except KafkaError as e:
            raise ChangelogError(f"cannot read {self.topic}/{part}: {e!r}") from e
        finally:
            reader.close(autocommit=False)

    def restore(self, part: int, committed: int | None, ckpt: str | None,
                progress: Callable[[int, int, int], None] | None = None) -> Restored:
        """Task ``part``'s sections as of checkpoint ``ckpt`` (the metadata of the
        committed offset ``committed``; without it, the newest one written with that
        offset): the changelog partition read to its end, each section's newest version
        on the chain the checkpoint names. ``progress(bytes_done, records_done,
        records_total)`` as it reads (the bytes ahead are not known before they are
        read)."""
        if committed is None:
            return Restored({}, {}, [], None, 0)
        got = self.read(part, None, progress)
        assert got is not None  # read from the beginning
        held, done, end = got
        found = held.committed(ckpt, committed)
        if found is None:
            if ckpt is None:  # offsets committed without a state: nothing to go on
                return Restored({}, {}, [], None, done)
            raise ChangelogError(f"{self.topic}/{part}: checkpoint {ckpt} is committed "
                                 f"but its head is not all in the changelog")
        name, head = found
        lineage = head.lineage or []
        values, holders = held.chain(lineage)
        if HEAD not in values:
            raise ChangelogError(f"{self.topic}/{part}: checkpoint {name} names no "
                                 f"chain its own head is on")
        return Restored(values, holders, lineage, name, done, end)

    def close(self) -> None:
        p, self._producer = self._producer, None
        if p is not None:
            try:
                p.close(timeout=5)
            except Exception:
                log.debug("closing the changelog producer raised", exc_info=True)
