"""What one task's changelog holds, as the member that owns the task knows it, and the
records its next checkpoint writes (contract §8: the changelog is written
incrementally; the format is in ARCHITECTURE.md, "Changelog format").

A task is written in *incarnations*: one starts when a member restores (or creates) the
task, and again after a checkpoint of it failed, so an incarnation's checkpoints
``<incarnation>:1, :2, ...`` are all committed but perhaps the last. Each checkpoint's
head carries the *lineage*: the incarnations the task's state went through, each with
the last of its checkpoints on the chain. A restore takes each section's newest
version on that chain and nothing else (an aborted transaction's, a fenced zombie's).
"""

from __future__ import annotations

import hashlib
import uuid
from typing import Any

from calmon.engine import sections
from calmon.engine.engine import Engine
from calmon.io.changelog import CHUNK_BYTES, Restored, TaskWrite
from calmon.io.checkpoint import decode, encode


def _digest(value: bytes) -> bytes:
    return hashlib.blake2b(value, digest_size=16).digest()


def _chunks(value: bytes | None) -> int:
    return 0 if value is None else max(1, -(-len(value) // CHUNK_BYTES))


def _incarnation() -> str:
    return uuid.uuid4().hex[:12]


class TaskLog:
    """One task's changelog bookkeeping: which sections it holds, from which
    incarnation, with what digest; the lineage of its last committed checkpoint."""

    def __init__(self) -> None:
        self.incarnation = _incarnation()
        self.seq = 0
        self.lineage: list[list[Any]] = []  # the last committed checkpoint's
        self.holders: dict[str, str] = {}  # section -> incarnation (removed ones too)
        self.digests: dict[str, bytes] = {}
        self.chunks: dict[str, int] = {}
        self.index_mark: tuple[int, ...] | None = None
        self.pending: set[int] = set()  # groups touched since the last commit
        self._attempt: tuple[TaskWrite, tuple[int, ...]] | None = None

    @classmethod
    def restore(cls, engine: Engine, restored: Restored) -> dict[str, Any] | None:
        """Task state from the changelog's sections into ``engine``; the positions it
        reflects, or None when there was nothing to restore."""
        if restored.name is None:
            return None
        head = decode(restored.sections[sections.HEAD])
        head["engine"] = sections.join_done(
            head["engine"], lambda name: decode(restored.sections[name])["done"])
        index = decode(restored.sections[sections.INDEX])["index"]
        groups = {int(name[1:]): decode(value) for name, value in restored.sections.items()
                  if name.startswith("g") and name[1:].isdigit()}
        empty = Engine(engine.cfg).snapshot_series([])
        engine.restore(sections.assemble(head["engine"], index, groups, empty))
        engine.take_touched()  # what it holds is what the changelog holds
        return {str(k): int(v) for k, v in head["positions"].items()}

    @classmethod
    def of(cls, engine: Engine, restored: Restored) -> TaskLog:
        """The bookkeeping of a task just restored from ``restored``."""
        log = cls()
        log.lineage = [list(e) for e in restored.lineage]
        # a removed piece of the joined-id memory is forgotten (the head names the ones
        # it takes): its name never comes back with other contents
        log.holders = {k: v for k, v in restored.holders.items()
                       if not k.startswith(sections.DONE) or k in restored.sections}
        log.digests = {k: _digest(v) for k, v in restored.sections.items()}
        log.chunks = {k: _chunks(v) for k, v in restored.sections.items()}
        log.index_mark = engine.index_mark() if restored.name is not None else None
        return log

    def write(self, engine: Engine, positions: dict[str, int], offset: int, *,
              full: bool = False) -> TaskWrite:
        """The records of this task's next checkpoint: its head, its index if it
        changed, the pieces of the joined-id memory the changelog does not hold (and
        tombstones for those it no longer needs), and each group of series touched
        since the last commit (``full``: every group) whose encoding differs from what
        the changelog holds."""
        self.pending |= sections.groups_of(engine.take_touched())
        if full:
            self.pending |= sections.live_groups(engine)
        head, pieces = sections.split_done(engine.snapshot_head())
        values: dict[str, bytes | None] = {
            sections.HEAD: encode({"engine": head, "positions": positions})}
        for name, piece in pieces.items():
            if self.chunks.get(name, 0) == 0:  # named by its content: new, or not at all
                values[name] = encode({"done": piece})
        values.update({name: None for name in self.chunks
                       if name.startswith(sections.DONE) and name not in pieces})
        mark = engine.index_mark()
        if mark != self.index_mark:
            values[sections.INDEX] = encode({"index": engine.index.snapshot()})
        for k in sorted(self.pending):
            doc = sections.group(engine, k)
            values[sections.group_name(k)] = None if doc is None else encode(doc)
        changed = {name: v for name, v in values.items()
                   if name == sections.HEAD  # always: the checkpoint's name is on it
                   or (v is None and self.chunks.get(name, 0) > 0)
                   or (v is not None and self.digests.get(name) != _digest(v))}
        self.seq += 1
        holders = {**self.holders, **{name: self.incarnation for name in changed}}
        live = set(holders.values()) | {self.incarnation}
        lineage = [e for e in self.lineage if e[0] != self.incarnation and e[0] in live]
        lineage.append([self.incarnation, self.seq])
        write = TaskWrite(f"{self.incarnation}:{self.seq}", lineage, changed,
                          {name: self.chunks.get(name, 0) for name in changed}, offset)
        self._attempt = (write, mark)
        return write

    def committed(self) -> None:
        """The last ``write`` is in the changelog."""
        assert self._attempt is not None
        write, mark = self._attempt
        for name, value in write.sections.items():
            self.holders[name] = self.incarnation
            if value is None and name.startswith(sections.DONE):
                self.holders.pop(name)
            if value is None:
                self.digests.pop(name, None)
                self.chunks.pop(name, None)
            else:
                self.digests[name] = _digest(value)
                self.chunks[name] = _chunks(value)
        self.lineage = write.lineage
        self.index_mark = mark
        self.pending.clear()
        self._attempt = None

    def failed(self) -> None:
        """The last ``write`` was not committed: a new incarnation goes on from the
        last committed checkpoint (so the aborted one is never on a chain), and the
        groups it held are written again."""
        self._attempt = None
        self.incarnation = _incarnation()
        self.seq = 0
