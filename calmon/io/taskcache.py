"""Group mode's local cache of task state in ``state.dir`` (contract §8: "a cache for
fast restarts, never the source of truth").

After each committed checkpoint, a task's sections in the form a restore gives them
(``changelog.Restored``: the newest version of each on the chain) are kept in
``<state.dir>/task-cache/<partition>/``: one file a section, named by the section and
a digest of its content (so a checkpoint writes only the sections it changed, and a
file is never rewritten with other bytes), and a ``manifest.json`` put in place
atomically last, naming the checkpoint, its lineage, the sections' files and digests,
the predictions offset committed with it and the changelog offset after its records.
Files the manifest no longer names are removed after it.

A restore uses the cache only where it is provably the committed state
(``restore_from``):

- the committed offset's metadata names the cached checkpoint: the cache is the state,
  nothing is read from the changelog;
- it names a later checkpoint whose lineage goes through the cached one (another
  member went on from it, or this one committed after its cache was written): only the
  changelog records after the cached offset are read and taken over the cache, each
  section's newest version on the chain, as a full restore does; only while the cache
  is younger than ``PREFIX_MAX_AGE_S`` (a removed section's tombstone is kept for the
  topic's ``delete.retention.ms``, a day by default: a tail read after it is gone
  would keep the section);
- a broker that drops offset metadata (Tansu): the records after the cached offset are
  read; a complete head there written with the committed offset is the committed one
  (as a full restore picks it: the newest) and is taken as above; none, and the cache
  was written with the committed offset: the cache is the state.

Anything else (another chain, a cache of another topic, a file whose digest does not
match, a manifest that does not parse) reads the changelog in full; an unreadable
cache is counted and logged, never fatal.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from calmon.engine.sections import DONE, HEAD
from calmon.io.changelog import Changelog, ChangelogError, Restored, TaskWrite, parse_name

log = logging.getLogger(__name__)

DIRNAME = "task-cache"
MANIFEST = "manifest.json"
FORMAT = 1
PREFIX_MAX_AGE_S = 3600.0


def _hex(value: bytes) -> str:
    return hashlib.blake2b(value, digest_size=16).hexdigest()


def _replace(path: Path, data: bytes) -> None:
    """``path`` replaced whole, not fsynced (no disk flush in a checkpoint): what a
    crash leaves short or old fails its digest, does not parse, or names an older
    checkpoint, and each of those reads the changelog."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


class CacheCorrupt(Exception):
    """A cache that is there but cannot be read as written."""


@dataclass
class Cached:
    """One task's state as its cache holds it."""

    name: str  # the checkpoint "<incarnation>:<seq>"
    lineage: list[list[Any]]
    holders: dict[str, str]
    sections: dict[str, bytes]
    pos: int  # the predictions offset committed with it
    since: int | None  # the changelog offset after its records (None: not known)
    written_at: float  # wall clock
    nbytes: int

    def restored(self, *, read: int = 0, end: int | None = None) -> Restored:
        return Restored(dict(self.sections), dict(self.holders),
                        [list(e) for e in self.lineage], self.name, read,
                        self.since if end is None else end, "cache", self.nbytes)


def on_chain(name: str, lineage: list[list[Any]]) -> bool:
    """Whether checkpoint ``name`` is an ancestor of (or is) the checkpoint whose
    lineage this is: its incarnation is on it, at or past its sequence number (an
    incarnation's checkpoints each go on from the one before)."""
    parsed = parse_name(name)
    if parsed is None:
        return False
    inc, seq = parsed
    return any(e[0] == inc and int(e[1]) >= seq for e in lineage)


def restore_from(changelog: Changelog, cached: Cached, part: int, committed: int,
                 ckpt: str | None, progress: Callable[[int, int, int], None] | None = None,
                 now: float | None = None) -> Restored | None:
    """Task ``part``'s committed state from its cache and what the changelog holds past
    it, or None when the cache cannot be shown to be on the committed chain (the module
    docstring). ChangelogError on broker trouble."""
    if ckpt is not None and ckpt == cached.name:
        return cached.restored()
    if cached.since is None:
        return None
    got = changelog.read(part, cached.since, progress)
    if got is None:
        return None
    held, nbytes, end = got
    found = held.committed(ckpt, committed)
    if found is None:
        # by name: a checkpoint not in the tail is not one that went on from the cache
        if ckpt is None and cached.pos == committed:
            return cached.restored(read=nbytes, end=end)
        return None
    name, head = found
    lineage = head.lineage or []
    age = (time.time() if now is None else now) - cached.written_at
    if not on_chain(cached.name, lineage) or not 0 <= age <= PREFIX_MAX_AGE_S:
        return None
    try:
        values, holders = held.chain(lineage)
    except ChangelogError:
        return None
    if HEAD not in holders:
        return None  # the committed head is in the tail: on its own chain, or nothing is
    sections = dict(cached.sections)
    for section in holders:
        if section in values:
            sections[section] = values[section]
        else:  # removed since
            sections.pop(section, None)
    merged = {**cached.holders, **holders}
    # as TaskLog.of: a removed piece of the joined-id memory is forgotten
    merged = {k: v for k, v in merged.items() if not k.startswith(DONE) or k in sections}
    return Restored(sections, merged, lineage, name, nbytes, end, "cache+changelog",
                    cached.nbytes)


class TaskCache:
    """The tasks' caches under ``<state_dir>/task-cache``; the loop thread's alone.
    Every failure is logged and counted, never raised: the changelog is the state."""

    def __init__(self, state_dir: Path | str, changelog_topic: str) -> None:
        self.root = Path(state_dir) / DIRNAME
        self.topic = changelog_topic
        # partition -> the manifest on disk, while it is the task's committed state
        self._manifests: dict[int, dict[str, Any]] = {}
        self.corrupt = 0  # caches found unreadable
        self.write_failures = 0

    def _dir(self, part: int) -> Path:
        return self.root / str(part)

    def load(self, part: int) -> Cached | None:
        """Task ``part``'s cache; None when there is none or it cannot be read (counted
        and logged: a corrupt one)."""
        path = self._dir(part) / MANIFEST
        try:
            text = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as e:
            self._corrupt(part, f"cannot read {path}: {e}")
            return None
        try:
            return self._parse(part, json.loads(text))
        except (CacheCorrupt, OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            self._corrupt(part, str(e) or type(e).__name__)
            return None

    def _corrupt(self, part: int, why: str) -> None:
        """Counted, logged, and removed (its files are not taken again by name)."""
        self.corrupt += 1
        self._manifests.pop(part, None)
        log.warning("task %d: the local cache is unreadable (%s): restoring from the "
                    "changelog", part, why)
        shutil.rmtree(self._dir(part), ignore_errors=True)

    def _parse(self, part: int, m: dict[str, Any]) -> Cached | None:
        if m.get("format") != FORMAT or m["partition"] != part:
            raise CacheCorrupt(f"not a cache of task {part} in format {FORMAT}")
        if m["topic"] != self.topic:
            log.info("task %d: the local cache is of changelog %r, not %r: not used", part,
                     m["topic"], self.topic)
            return None
        sections: dict[str, bytes] = {}
        for section, (fname, digest, _size) in m["sections"].items():
            value = (self._dir(part) / str(fname)).read_bytes()
            if _hex(value) != digest:
                raise CacheCorrupt(f"section {section}: its file does not match its digest")
            sections[str(section)] = value
        lineage = m["lineage"]
        if parse_name(str(m["name"])) is None or not isinstance(lineage, list):
            raise CacheCorrupt("no checkpoint name or lineage")
        since = m["since"]
        self._manifests[part] = m
        return Cached(str(m["name"]), [[str(e[0]), int(e[1])] for e in lineage],
                      {str(k): str(v) for k, v in m["holders"].items()}, sections,
                      int(m["pos"]), None if since is None else int(since),
                      float(m["written_at"]), sum(len(v) for v in sections.values()))

    def adopt(self, part: int, restored: Restored, pos: int | None) -> None:
        """After a restore: the cache holds ``restored`` (the committed state, written
        with the predictions offset ``pos``), written where it is not already."""
        if restored.name is None:  # a new task: its first checkpoint's write is all of it
            self._manifests[part] = {"name": None, "sections": {}}
            return
        base = self._manifests.get(part)
        if restored.source == "cache" and base is not None and base["name"] == restored.name:
            return  # the cache is it
        entries = {} if base is None else dict(base["sections"])
        changed: dict[str, bytes | None] = dict(restored.sections)
        changed.update({s: None for s in entries if s not in restored.sections})
        self._store(part, entries, changed, restored.name, restored.lineage,
                    restored.holders, pos if pos is not None else -1, restored.end)

    def save(self, part: int, write: TaskWrite, holders: dict[str, str],
             since: int | None) -> None:
        """After a committed checkpoint of task ``part``: its cache goes on by
        ``write`` (the sections it changed); ``holders``: the task's after it. A task
        whose cache is not its last committed state (a write failed) is left."""
        base = self._manifests.get(part)
        if base is None:
            return
        self._store(part, dict(base["sections"]), dict(write.sections), write.name,
                    write.lineage, holders, write.offset, since)

    def forget(self, part: int) -> None:
        """Task ``part`` dropped: its files stay (a later assignment may use them)."""
        self._manifests.pop(part, None)

    def _store(self, part: int, entries: dict[str, Any], changed: dict[str, bytes | None],
               name: str, lineage: list[list[Any]], holders: dict[str, str], pos: int,
               since: int | None) -> None:
        d = self._dir(part)
        self._manifests.pop(part, None)  # until the new one is in place
        try:
            d.mkdir(parents=True, exist_ok=True)
            for section, value in changed.items():
                if value is None:
                    entries.pop(section, None)
                    continue
                digest = _hex(value)
                fname = f"{section}-{digest}"
                if not (d / fname).exists():
                    _replace(d / fname, value)
                entries[section] = [fname, digest, len(value)]
            manifest = {"format": FORMAT, "topic": self.topic, "partition": part,
                        "name": name, "lineage": lineage, "holders": holders,
                        "sections": entries, "pos": pos, "since": since,
                        "written_at": time.time()}
            _replace(d / MANIFEST, json.dumps(manifest).encode())
        except OSError as e:
            self.write_failures += 1
            log.warning("task %d: cannot write its local cache (%s): restarts read the "
                        "changelog", part, e)
            return
        self._manifests[part] = manifest
        keep = {MANIFEST, *(e[0] for e in entries.values())}
        try:
            for f in d.iterdir():
                if f.name not in keep:  # (this process alone writes here: the state lock)
                    f.unlink(missing_ok=True)
        except OSError as e:  # left for the next checkpoint's pass
            log.debug("task %d: cannot remove old cache files: %s", part, e)

    def status(self) -> dict[str, int]:
        return {"corrupt": self.corrupt, "write_failures": self.write_failures}
