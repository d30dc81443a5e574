"""Group mode's local task cache (``calmon.io.taskcache``, contract §8): what it keeps
after each committed checkpoint, and when a restore may take it. The committed state is
what a full read of the changelog gives (``_Versions`` over every record, as
``Changelog.restore`` takes it): the cache, alone or with the records after it, must
give exactly that, or not be used."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from calmon.io.changelog import Restored, TaskWrite, _records, _Versions
from calmon.io.taskcache import DIRNAME, MANIFEST, PREFIX_MAX_AGE_S, TaskCache, restore_from

TOPIC = "g-state-changelog"
PART = 3


def write(name: str, lineage: list[list[Any]], offset: int,
          sections: dict[str, bytes | None]) -> TaskWrite:
    """(a removed section had one chunk: it gets a tombstone)"""
    return TaskWrite(name, lineage, sections,
                     {s: 1 for s, v in sections.items() if v is None}, offset)


A1 = write("a:1", [["a", 1]], 10, {"h": b"head1", "i": b"index", "g0": b"g0v1", "g1": b"g1v1",
                                   "dx": b"piece"})
A2 = write("a:2", [["a", 2]], 20, {"h": b"head2", "g0": b"g0v2"})
# another member goes on from a:2: g1 changed, g0 removed, the piece forgotten
B1 = write("b:1", [["a", 2], ["b", 1]], 25, {"h": b"headb1", "g1": b"g1b", "g0": None,
                                             "dx": None})
# a zombie's aborted checkpoint on a:2 (Tansu serves it)
Z3 = write("a:3", [["a", 3]], 30, {"h": b"zombie", "g1": b"zombie-g1"})


class Log:
    """A changelog partition holding these writes, in order, read as ``Changelog.read``
    reads it (from an offset to the end)."""

    def __init__(self, *writes: TaskWrite) -> None:
        self.recs = [(k, dict(h), v) for w in writes for k, v, h in _records(PART, w)]
        self.reads: list[int | None] = []

    def read(self, part: int, start: int | None, progress: Any = None
             ) -> tuple[_Versions, int, int] | None:
        self.reads.append(start)
        held = _Versions(part)
        done = 0
        for at, (k, h, v) in enumerate(self.recs):
            if start is None or at >= start:
                held.add(k, h, v, at)
                done += len(v or b"")
        return held, done, len(self.recs)


def full(log: Log, ckpt: str | None, committed: int) -> Restored:
    """What ``Changelog.restore`` gives: the partition read from its beginning."""
    got = log.read(PART, None)
    assert got is not None
    held, done, end = got
    found = held.committed(ckpt, committed)
    assert found is not None
    values, holders = held.chain(found[1].lineage or [])
    return Restored(values, holders, found[1].lineage or [], found[0], done, end)


def cache_at(tmp_path: Path, log: Log, n: int, *writes: TaskWrite) -> TaskCache:
    """A member's cache after committing ``writes`` (the first ``n`` records of ``log``)
    from an empty task."""
    cache = TaskCache(tmp_path, TOPIC)
    cache.adopt(PART, Restored({}, {}, [], None, 0), None)
    holders: dict[str, str] = {}
    for w in writes:  # as TaskLog.committed keeps them
        for s, v in w.sections.items():
            holders[s] = w.name.split(":")[0]
            if v is None and s.startswith("d"):
                del holders[s]
        cache.save(PART, w, dict(holders), n)
    return cache


def same(a: Restored, b: Restored) -> None:
    assert (a.name, a.sections, a.lineage) == (b.name, b.sections, b.lineage)
    assert {k: v for k, v in a.holders.items() if k in a.sections} == {
        k: v for k, v in b.holders.items() if k in b.sections}


def test_the_cache_holds_the_committed_sections_and_only_their_files(tmp_path: Path) -> None:
    log = Log(A1, A2)
    cache_at(tmp_path, log, len(log.recs), A1, A2)
    got = TaskCache(tmp_path, TOPIC).load(PART)
    assert got is not None
    assert got.name == "a:2" and got.since == len(log.recs) and got.pos == 20
    same(got.restored(), full(log, "a:2", 20))
    d = tmp_path / DIRNAME / str(PART)
    # g0's first version and nothing else is gone; a file per section, and the manifest
    assert sorted(f.name.split("-")[0] for f in d.iterdir()) == sorted(
        ["h", "i", "g0", "g1", "dx", MANIFEST])


def test_exact_by_name_reads_nothing(tmp_path: Path) -> None:
    log = Log(A1, A2)
    cached = cache_at(tmp_path, log, len(log.recs), A1, A2).load(PART)
    assert cached is not None
    got = restore_from(log, cached, PART, 20, "a:2")  # type: ignore[arg-type]
    assert got is not None and got.source == "cache" and log.reads == []
    same(got, full(log, "a:2", 20))


def test_a_later_checkpoint_on_the_chain_reads_only_the_tail(tmp_path: Path) -> None:
    log = Log(A1, A2, B1, Z3)
    at = len(list(_records(PART, A1))) + len(list(_records(PART, A2)))
    cached = cache_at(tmp_path, log, at, A1, A2).load(PART)
    assert cached is not None
    for ckpt in ("b:1", None):  # by name, and by offset (a broker that drops metadata)
        log.reads.clear()
        got = restore_from(log, cached, PART, 25, ckpt)  # type: ignore[arg-type]
        assert got is not None and got.source == "cache+changelog", ckpt
        assert log.reads == [at]
        same(got, full(log, "b:1", 25))
        assert "g0" not in got.sections and got.sections["g1"] == b"g1b"
        assert "dx" not in got.holders


def test_a_cache_off_the_committed_chain_is_not_used(tmp_path: Path) -> None:
    # the cache is a:1; the committed checkpoint c:1 went on from a state without it
    other = write("c:1", [["c", 1]], 25, {"h": b"c", "i": b"ci"})
    log = Log(A1, other)
    at = len(list(_records(PART, A1)))
    cached = cache_at(tmp_path, log, at, A1).load(PART)
    assert cached is not None
    assert restore_from(log, cached, PART, 25, "c:1") is None  # type: ignore[arg-type]
    assert restore_from(log, cached, PART, 25, None) is None  # type: ignore[arg-type]
    # a name the tail does not hold: not a successor of the cache
    assert restore_from(log, cached, PART, 25, "q:9") is None  # type: ignore[arg-type]


def test_by_offset_the_cache_is_the_state_only_at_its_own_offset(tmp_path: Path) -> None:
    log = Log(A1, A2)
    cached = cache_at(tmp_path, log, len(log.recs), A1, A2).load(PART)
    assert cached is not None
    got = restore_from(log, cached, PART, 20, None)  # type: ignore[arg-type]
    assert got is not None and got.source == "cache"
    same(got, full(log, None, 20))
    assert restore_from(log, cached, PART, 21, None) is None  # type: ignore[arg-type]


def test_an_old_cache_reads_the_changelog_in_full(tmp_path: Path) -> None:
    # a tail read past delete.retention.ms could miss a removed section's tombstone
    log = Log(A1, A2, B1)
    at = len(list(_records(PART, A1))) + len(list(_records(PART, A2)))
    cached = cache_at(tmp_path, log, at, A1, A2).load(PART)
    assert cached is not None
    late = time.time() + PREFIX_MAX_AGE_S + 60
    assert restore_from(log, cached, PART, 25, "b:1", now=late) is None  # type: ignore[arg-type]


def test_a_corrupt_cache_is_counted_removed_and_not_used(tmp_path: Path) -> None:
    log = Log(A1, A2)
    cache_at(tmp_path, log, len(log.recs), A1, A2)
    d = tmp_path / DIRNAME / str(PART)
    g1 = next(d.glob("g1-*"))
    g1.write_bytes(b"g1v0")  # not what its digest names
    cache = TaskCache(tmp_path, TOPIC)
    assert cache.load(PART) is None and cache.corrupt == 1
    assert not d.exists()
    cache_at(tmp_path, log, len(log.recs), A1, A2)
    (d / MANIFEST).write_text('{"format": 1, "partition": 3, "sections": [')
    assert cache.load(PART) is None and cache.corrupt == 2
    # a cache of another changelog topic is not used, and not counted corrupt
    cache_at(tmp_path, log, len(log.recs), A1, A2)
    m = json.loads((d / MANIFEST).read_text())
    (d / MANIFEST).write_text(json.dumps({**m, "topic": "other"}))
    assert cache.load(PART) is None and cache.corrupt == 2
