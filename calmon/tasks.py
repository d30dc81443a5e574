"""Group mode's tasks (contract §8): one ``Engine`` per owned input partition (Kafka
Streams' task: a partition with its own state), restored from the changelog when the
group assigns the partition, written to it with the group's offsets in one
transaction at each checkpoint, dropped when the partition goes.

The rebalance hooks run inside the source's ``poll`` on the loop thread, the only
writer of the tasks; readers get ``status()`` (a new list each call) and the summed
statistics of ``calmon.engine.summed``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from calmon.cluster.group_sender import GroupSender
from calmon.config import Config
from calmon.engine.delta import Delta
from calmon.engine.engine import Engine
from calmon.engine.records import Kind, Raw
from calmon.io.changelog import Changelog, ChangelogError, Restored, TaskWrite
from calmon.io.group_source import GroupSource, Offsets
from calmon.io.source import Chunk, Skip, to_batch
from calmon.io.taskcache import TaskCache, restore_from
from calmon.io.totals import ProcessTotals
from calmon.tasklog import TaskLog

log = logging.getLogger(__name__)

FEED_AT = 2000  # a task is fed once it holds this many records (the columnar join's size)
HOLD_S = 0.5  # or once its oldest record waited this long
KEEPALIVE_S = 1.0  # a checkpoint polls the group this often (max_poll_interval_ms >= 1s)
# calmon_restore_seconds buckets
RESTORE_BUCKETS = (0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, float("inf"))


@dataclass
class Task:
    partition: int
    engine: Engine
    state: str = "restoring"  # restoring | running
    bytes_done: int = 0
    records_done: int = 0
    records_total: int = 0
    restored_from: str | None = None  # the checkpoint it was restored from
    restored_source: str | None = None  # changelog | cache | cache+changelog
    cache_bytes: int = 0  # bytes of it read from the local cache (state.dir)
    positions: dict[str, int] = field(default_factory=dict)  # topic -> next offset
    log: TaskLog = field(default_factory=TaskLog)  # what its changelog holds

    def view(self) -> dict[str, Any]:
        out: dict[str, Any] = {"partition": self.partition, "state": self.state,
                               "restored_from": self.restored_from,
                               "positions": dict(self.positions),
                               "pending": self.engine.join.pending}
        if self.state == "restoring":
            out["restore"] = {"bytes_done": self.bytes_done,
                              "records_done": self.records_done,
                              "records_total": self.records_total}
        else:
            out["restored_bytes"] = self.bytes_done  # from the changelog
            out["restored_source"] = self.restored_source
            out["restored_cache_bytes"] = self.cache_bytes
        return out


class Tasks:
    """The tasks of one member and the source's rebalance hooks."""

    def __init__(self, cfg: Config, changelog: Changelog, totals: ProcessTotals) -> None:
        self.cfg = cfg
        self.changelog = changelog
        self.totals = totals
        # each task's committed state in state.dir, for fast restarts (taskcache)
        self.cache = TaskCache(cfg.state.dir, cfg.kafka.changelog_topic)
        self.cache_use = {"cache": 0, "cache+changelog": 0, "unused": 0}
        self.source: GroupSource | None = None  # set once built (it calls these hooks)
        self.tasks: dict[int, Task] = {}
        self._kinds = {cfg.kafka.predictions_topic: Kind.PREDICTION,
                       cfg.kafka.labels_topic: Kind.LABEL}
        self.restore_counts = [0] * len(RESTORE_BUCKETS)  # cumulative per bucket
        self.restore_sum = 0.0
        self.restored_bytes = 0
        self.last_checkpoint: float | None = None
        self.fenced = 0  # checkpoint transactions the broker refused
        # what each task's last checkpoint held (engine version, positions): unchanged
        # tasks are not written again
        self._written: dict[int, tuple[int, tuple[tuple[str, int], ...]]] = {}
        self.careful: set[int] = set()  # tasks read one record at a time (an engine bug)
        self._held: dict[int, list[Chunk]] = {}  # records read, not yet fed (see feed)
        self._held_since: dict[int, float] = {}
        self._held_skips: dict[int, list[Skip]] = {}  # offsets read past, not yet counted
        self.poison: set[str] = set()  # sources of records the engine raises on
        # scaled-out recalibration: each task's joined samples, in its checkpoint
        self.joined: GroupSender | None = None
        # a rolled-back task's records already in the process totals: topic -> the next
        # offset not yet counted (its records are read again, one at a time)
        self._counted: dict[int, dict[str, int]] = {}
        self._alive_at = 0.0  # the group's poll timer last reset by a checkpoint

    def engines(self) -> list[Engine]:
        return [t.engine for t in self.tasks.values()]

    def dropped_models(self, known: set[str]) -> set[str]:
        """``ProcessTotals.follow`` in group mode: of ``known``, the models no task holds
        (none while a task waits for its restore: its models are not known yet)."""
        if self.source is not None and self.source.unrestored:
            return set()
        held: set[str] = set()
        for engine in self.engines():
            with engine.lock:
                held.update(m for m in engine.models if m)
        return known - held

    # ------------------------------------------------------------ hooks

    def lost(self, partitions: list[int]) -> None:
        for p in partitions:
            self.tasks.pop(p, None)
            self.cache.forget(p)  # its files stay: as of its last committed checkpoint
            self._written.pop(p, None)
            self._held.pop(p, None)
            self._held_since.pop(p, None)
            self._held_skips.pop(p, None)
            if self.joined is not None:
                self.joined.drop(p)

    def assigned(self, committed: Mapping[int, tuple[int | None, str | None]]
                 ) -> dict[int, Offsets]:
        """Each new task restored from the changelog to its end, before any record of
        its partition is read; where each starts (its checkpoint's positions)."""
        starts: dict[int, Offsets] = {}
        for p, (offset, ckpt) in sorted(committed.items()):
            task = self.tasks[p] = Task(p, Engine(self.cfg))
            began = time.monotonic()

            def progress(done: int, records: int, total: int, task: Task = task) -> None:
                task.bytes_done, task.records_done, task.records_total = done, records, total

            restored, positions = self._restore(task, offset, ckpt, progress)
            self._observe(time.monotonic() - began, restored.bytes_read)
            task.bytes_done = restored.bytes_read
            task.cache_bytes = restored.cache_bytes
            task.log = TaskLog.of(task.engine, restored)
            if positions is not None:
                task.positions = positions
                task.restored_from = restored.name or f"offset {offset}"
                task.restored_source = restored.source
            self.cache.adopt(p, restored, offset)
            task.state = "running"
            if self.joined is not None:
                self.joined.restored(p, task.engine, task.positions)
            starts[p] = (task.positions.get(self.cfg.kafka.predictions_topic),
                         task.positions.get(self.cfg.kafka.labels_topic))
            log.info("task %d restored from %s (%s: %d changelog bytes, %d cached bytes "
                     "read; %d pending)", p, task.restored_from or "nothing: a new task",
                     restored.source, restored.bytes_read, restored.cache_bytes,
                     task.engine.join.pending)
        return starts

    def _restore(self, task: Task, offset: int | None, ckpt: str | None,
                 progress: Any) -> tuple[Restored, dict[str, Any] | None]:
        """Task state from its local cache where that is provably the committed state
        (``taskcache.restore_from``), else from the changelog; the restored form and
        the positions it reflects."""
        p = task.partition
        cached = self.cache.load(p) if offset is not None else None
        if cached is not None and offset is not None:
            try:
                got = restore_from(self.changelog, cached, p, offset, ckpt, progress)
                if got is not None:
                    positions = TaskLog.restore(task.engine, got)
                    self.cache_use[got.source] += 1
                    return got, positions
            except ChangelogError as e:
                log.warning("task %d: cannot read the changelog past its cache (%s)", p, e)
            except (ValueError, KeyError, TypeError, IndexError) as e:
                self.cache.corrupt += 1
                log.warning("task %d: its cache does not restore (%r): restoring from the "
                            "changelog", p, e)
            self.cache_use["unused"] += 1
            log.info("task %d: the local cache (checkpoint %s) is not the committed state "
                     "(%s): restoring from the changelog", p, cached.name,
                     ckpt or f"offset {offset}")
            task.engine = Engine(self.cfg)  # whatever a failed restore left
        try:
            restored = self.changelog.restore(p, offset, ckpt, progress)
            return restored, TaskLog.restore(task.engine, restored)
        except (ChangelogError, ValueError, KeyError, TypeError) as e:
            # a committed checkpoint that cannot be read: the partition is not read
            # unowned either; the group moves it on when this member leaves
            log.error("task %d: cannot restore checkpoint %s: %s", p, ckpt, e)
            raise

    def _observe(self, seconds: float, nbytes: int) -> None:
        for i, le in enumerate(RESTORE_BUCKETS):
            if seconds <= le:
                self.restore_counts[i] += 1
        self.restore_sum += seconds
        self.restored_bytes += nbytes

    # ------------------------------------------------------------ records

    def feed(self, chunks: list[Chunk], not_after: float, *, force: bool = False,
             skips: list[Skip] | None = None) -> list[Any]:
        """Each partition's records into its task; the rejected records. A task's
        records are held until it has ``FEED_AT`` of them or the oldest waited
        ``HOLD_S`` (``force``: all now, before a checkpoint): a poll split over many
        tasks would otherwise feed each a few hundred records, under the batch size at
        which the join decides over columns. A task whose engine raises (a calmon bug:
        bad data is only counted) goes back to its committed checkpoint and reads its
        partition again one record at a time, the record that raises counted invalid
        as ``internal`` from then on. ``skips``: offsets the source read past without
        a record (``Skip``), held with the records and counted by their task."""
        now = time.monotonic()
        for chunk in chunks:
            if chunk[1] in self.tasks:  # else revoked within this poll
                self._held.setdefault(chunk[1], []).append(chunk)
                self._held_since.setdefault(chunk[1], now)
        for skip in skips or ():
            if skip.partition in self.tasks:
                self._held_skips.setdefault(skip.partition, []).append(skip)
                self._held_since.setdefault(skip.partition, now)
        rejected: list[Any] = []
        for p in sorted(self._held_since):
            mine = self._held.get(p, [])
            if not (force or sum(len(c[4]) for c in mine) >= FEED_AT
                    or now - self._held_since[p] >= HOLD_S):
                continue
            skipped = self._held_skips.pop(p, [])
            self._held.pop(p, None)
            del self._held_since[p]
            task = self.tasks.get(p)
            if task is None:
                continue
            batch = to_batch(mine, self._kinds, columns=True)
            out = self._feed_task(task, batch.columns(), not_after) if mine else []
            if out is None:
                continue  # rolled back: read again from the checkpoint's positions
            rejected.extend(out)
            rejected.extend(self._skipped(task, skipped))
            batch.add_skips(skipped)
            for (topic, _), off in batch.positions.items():
                task.positions[topic] = off
        return rejected

    def _skipped(self, task: Task, skips: list[Skip]) -> list[Any]:
        """Skipped offsets counted invalid by their task, each once under its reason
        (an empty reason only moves the position), as the static daemon counts them."""
        out = []
        for s in skips:
            if not s.reason:
                continue
            at = f"{s.topic}/{s.partition}/{s.first}"
            out.append(task.engine.reject(Raw(self._kinds[s.topic], s.value, None, at),
                                          s.reason))
            self._count(task.partition, at, task.engine.last_delta)
            span = f" to {s.next_offset - 1}" if s.next_offset - s.first > 1 else ""
            log.warning("task %d: offsets %s%s read past (%s: %s)", task.partition, at,
                        span, s.reason, s.detail)
        return out

    def _feed_task(self, task: Task, records: Any, not_after: float) -> list[Any] | None:
        p, engine = task.partition, task.engine
        if p not in self.careful:
            try:
                out = engine.feed(records, not_after)
            except Exception:
                log.exception("task %d: the engine raised on a batch of %d records; back "
                              "to its checkpoint to find the record", p, len(records))
                self._roll_back(p)
                return None
            self.totals.add(engine.last_delta)
            return out
        out = []
        for r in records:
            if r.source in self.poison:
                out.append(engine.reject(r, "internal"))
                self._count(p, r.source, engine.last_delta)
                continue
            try:
                out.extend(engine.feed([r], not_after))
            except Exception:
                log.exception("task %d: the engine raises on the record at %s: counted "
                              "as internal from now on", p, r.source)
                self.poison.add(r.source)
                self._roll_back(p)
                return None
            self._count(p, r.source, engine.last_delta)
        return out

    def _count(self, p: int, source: str, delta: Delta) -> None:
        """A careful task's record into the process totals, unless it was counted before
        its task was rolled back (``_counted``): a ``_total`` counter counts a record once."""
        topic, _, offset = source.rsplit("/", 2)
        at = int(offset)
        counted = self._counted.setdefault(p, {})
        if at < counted.get(topic, 0):
            return
        self.totals.add(delta)
        counted[topic] = at + 1

    def _roll_back(self, p: int) -> None:
        """Task ``p`` from its committed checkpoint again, its consumers moved back to
        the checkpoint's positions, and read one record at a time from now on; what it
        fed since that checkpoint stays in the process totals and is not counted again."""
        assert self.source is not None
        self.careful.add(p)
        task = self.tasks.get(p)
        counted = self._counted.setdefault(p, {})
        for topic, at in (task.positions.items() if task is not None else ()):
            counted[topic] = max(counted.get(topic, 0), at)  # fed since its checkpoint
        self.lost([p])
        self.source.reload(p)

    # ------------------------------------------------------------ checkpoints

    def checkpoint(self, partitions: list[int] | None = None) -> bool:
        """Steps of group mode's commit: every (or these) task's changed sections and
        positions, with the predictions offsets, in one transaction; False when
        refused. The group's poll timer is kept alive meanwhile (``keepalive``), so a
        large checkpoint never outlasts ``max_poll_interval_ms``."""
        source = self.source
        if source is None or not self.tasks:
            return False
        parts = sorted(self.tasks if partitions is None else partitions)
        pred = self.cfg.kafka.predictions_topic
        writes: dict[int, TaskWrite] = {}
        offsets: dict[int, int] = {}
        marks: dict[int, tuple[int, tuple[tuple[str, int], ...]]] = {}
        self._alive_at = time.monotonic()
        for p in parts:
            task = self.tasks[p]
            for topic in self._kinds:
                if topic not in task.positions:
                    at = source.position(topic, p)
                    if at is not None:
                        task.positions[topic] = at
            if pred not in task.positions:
                continue  # nowhere to commit yet: its first poll has not resolved
            marks[p] = (task.engine.version, tuple(sorted(task.positions.items())))
            if self._written.get(p) == marks[p]:
                continue  # nothing new since its last checkpoint
            offsets[p] = task.positions[pred]
            writes[p] = task.log.write(task.engine, dict(task.positions), offsets[p])
            self.keepalive()
        if not writes:
            return False
        extra = [] if self.joined is None else self.joined.collect(
            {p: (self.tasks[p].engine, self.tasks[p].positions) for p in writes})
        began = time.monotonic()
        try:
            source.group_metadata()  # out of the group: refused before anything is written
            n = self.changelog.commit(writes, offsets, source.group_metadata,
                                      between=self.keepalive, extra=extra)
        except ChangelogError as e:
            self.fenced += 1
            for p in writes:
                self.tasks[p].log.failed()
            log.warning("checkpoint refused, nothing written: %s", e)
            return False
        for p in writes:
            self.tasks[p].log.committed()
            self._written[p] = marks[p]
            self.cache.save(p, writes[p], self.tasks[p].log.holders,
                            self.changelog.ends.get(p))
        self.last_checkpoint = time.time()
        if self.joined is not None:
            self.joined.committed()
        log.debug("checkpoint of tasks %s at %s: %d records, sent in %.2fs", sorted(writes),
                  offsets, n, time.monotonic() - began)
        return True

    def keepalive(self) -> None:
        """While a checkpoint works: the group's poll timer reset every
        ``KEEPALIVE_S`` (a poll that reads nothing), so the member stays in the
        group however long the checkpoint takes."""
        if self.source is not None and time.monotonic() - self._alive_at >= KEEPALIVE_S:
            self.source.keepalive()
            self._alive_at = time.monotonic()

    def positions(self) -> dict[tuple[str, int], int]:
        """Every task's next offsets of both topics (what its state reflects)."""
        return {(topic, p): off for p, task in list(self.tasks.items())
                for topic, off in task.positions.items()}

    def status(self) -> list[dict[str, Any]]:
        return [t.view() for _, t in sorted(self.tasks.items())]

    def counts(self) -> dict[str, int]:
        out = {"restoring": 0, "running": 0}
        for t in list(self.tasks.values()):
            out[t.state] = out.get(t.state, 0) + 1
        return out
