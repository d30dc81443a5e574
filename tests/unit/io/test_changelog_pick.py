"""Which changelog records a restore takes (``calmon.io.changelog``, contract §8): per
section, the newest version on the chain the committed checkpoint's lineage names;
the committed checkpoint found by the offset metadata's name, or, where the broker drops
metadata (Tansu), as the newest complete head written with the committed offset.
Records of an aborted transaction (Tansu serves them under read_committed), removed
sections and stale chunks are never taken."""

from __future__ import annotations

import json

import pytest

from calmon.io.changelog import (
    CHUNK_HEADER,
    CKPT_HEADER,
    LINEAGE_HEADER,
    POS_HEADER,
    ChangelogError,
    TaskWrite,
    _records,
    _Versions,
)


def write(name: str, lineage: list[list[object]], offset: int,
          sections: dict[str, bytes | None], before: dict[str, int] | None = None
          ) -> TaskWrite:
    return TaskWrite(name, lineage, sections, before or {}, offset)


def read(*writes: TaskWrite) -> _Versions:
    held = _Versions(3)
    at = 0
    for w in writes:
        for key, value, heads in _records(3, w):
            held.add(key, dict(heads), value, at)
            at += 1
    return held


A1 = write("a:1", [["a", 1]], 10, {"h": b"head1", "i": b"index", "g0": b"g0v1", "g1": b"g1v1"})
A2 = write("a:2", [["a", 2]], 20, {"h": b"head2", "g0": b"g0v2"})
# a zombie's aborted checkpoint, built on a:2, after the one that took over from it
Z3 = write("a:3", [["a", 3]], 30, {"h": b"zombie", "g1": b"zombie-g1", "g0": None})
B1 = write("b:1", [["a", 2], ["b", 1]], 25, {"h": b"headb1", "g1": b"g1b"})


def test_by_name_the_chain_takes_each_sections_newest_version() -> None:
    held = read(A1, A2, B1, Z3)
    name, head = held.committed("b:1", 25) or ("", None)
    assert name == "b:1" and head is not None
    values, holders = held.chain(head.lineage or [])
    assert values == {"h": b"headb1", "i": b"index", "g0": b"g0v2", "g1": b"g1b"}
    assert holders["g0"] == "a" and holders["g1"] == "b"


def test_an_aborted_checkpoint_off_the_chain_is_left_out() -> None:
    held = read(A1, A2, B1, Z3)
    _, head = held.committed("b:1", 25) or ("", None)
    assert head is not None
    values, _ = held.chain(head.lineage or [])
    assert b"zombie" not in values.values() and b"zombie-g1" not in values.values()
    # an earlier committed checkpoint is read as it was
    _, head2 = held.committed("a:2", 20) or ("", None)
    assert head2 is not None
    assert held.chain(head2.lineage or [])[0] == {"h": b"head2", "i": b"index",
                                                  "g0": b"g0v2", "g1": b"g1v1"}


def test_without_metadata_the_committed_offset_decides() -> None:
    held = read(A1, A2, B1, Z3)
    assert (held.committed(None, 25) or ("",))[0] == "b:1"
    assert (held.committed(None, 20) or ("",))[0] == "a:2"
    assert held.committed(None, 99) is None


def test_a_removed_section_and_shrunk_chunks_stay_removed() -> None:
    big = b"x" * (512 * 1024 + 5)  # two chunks
    w1 = write("a:1", [["a", 1]], 1, {"h": b"h1", "g0": big, "g1": b"one"})
    w2 = write("a:2", [["a", 2]], 2, {"h": b"h2", "g0": b"small", "g1": None},
               {"g0": 2, "g1": 1})
    held = read(w1, w2)
    _, head = held.committed("a:2", 2) or ("", None)
    assert head is not None
    assert held.chain(head.lineage or [])[0] == {"h": b"h2", "g0": b"small"}
    _, head1 = held.committed("a:1", 1) or ("", None)
    assert head1 is not None
    assert held.chain(head1.lineage or [])[0] == {"h": b"h1", "g0": big, "g1": b"one"}


def test_compaction_keeps_the_chain_readable() -> None:
    """After compaction only the newest committed record of each key is left: the
    lineage on the committed head still names every incarnation a section came from."""
    held = _Versions(3)
    newest: dict[bytes, tuple[bytes | None, dict[str, bytes]]] = {}
    for w in (A1, A2, B1):
        for key, value, heads in _records(3, w):
            newest[key] = (value, dict(heads))
    for at, (key, (value, heads)) in enumerate(newest.items()):
        held.add(key, heads, value, at)
    _, head = held.committed("b:1", 25) or ("", None)
    assert head is not None
    assert held.chain(head.lineage or [])[0] == {"h": b"headb1", "i": b"index",
                                                 "g0": b"g0v2", "g1": b"g1b"}


def test_a_committed_section_not_all_there_is_an_error() -> None:
    held = _Versions(3)
    heads = {CKPT_HEADER: b"a:1", CHUNK_HEADER: b"0/1", POS_HEADER: b"1",
             LINEAGE_HEADER: json.dumps([["a", 1]]).encode()}
    held.add(b"3/h/0", heads, b"h", 0)
    held.add(b"3/g0/0", {**heads, CHUNK_HEADER: b"0/2"}, b"half", 1)
    _, head = held.committed("a:1", 1) or ("", None)
    assert head is not None
    with pytest.raises(ChangelogError):
        held.chain(head.lineage or [])


def test_records_of_another_format_are_ignored() -> None:
    held = _Versions(3)
    held.add(b"3/0", {CKPT_HEADER: b"x:1:17", CHUNK_HEADER: b"0/1", POS_HEADER: b"1"}, b"v", 0)
    assert held.committed(None, 1) is None
