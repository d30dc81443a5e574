"""IdIndex and its numpy Buckets against a dict, through random adds, removals and
lookups. The Buckets also with hashes squeezed into a few values, so that ids share
buckets and even whole hashes (the table must still tell them apart by id); the
IdIndex as a dict, as Buckets, and switching between the two."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from calmon.engine.idindex import MIN_BUCKETS, SHRINK_ABOVE, Buckets, IdIndex

IDS = [f"id-{k}" for k in range(300)]

ops = st.lists(st.tuples(st.sampled_from(["add", "remove", "find"]),
                         st.lists(st.sampled_from(IDS), max_size=120)),
               min_size=1, max_size=30)
SETTINGS = settings(max_examples=200, deadline=None, derandomize=True, database=None)


def squeezed(pid: str) -> int:
    return hash(pid) % 5 - 2  # five hash values, negative ones too


HASHES: dict[str, Callable[[str], int]] = {"real": hash, "squeezed": squeezed}


class Model:
    """What the caller of either keeps: ids by slot (cleared on removal, as the join
    does before it removes), free slots, and the dict the index must agree with."""

    def __init__(self) -> None:
        self.keys: list[str | None] = []
        self.want: dict[str, int] = {}
        self.free: list[int] = []

    def take(self, ids: list[str]) -> list[int]:
        slots = []
        for pid in ids:
            if not self.free:
                self.free.append(len(self.keys))
                self.keys.append(None)
            slot = self.free.pop()
            self.keys[slot] = pid
            self.want[pid] = slot
            slots.append(slot)
        return slots

    def drop(self, ids: list[str]) -> list[int]:
        slots = [self.want.pop(pid) for pid in ids]
        for slot in slots:
            self.keys[slot] = None
        self.free += slots
        return slots


@SETTINGS
@given(ops, st.sampled_from(sorted(HASHES)))
def test_buckets_map_ids_as_a_dict_does(ops: list[tuple[str, list[str]]], how: str) -> None:
    h = HASHES[how]
    table = Buckets(4)
    m = Model()
    for op, ids in ops:
        ids = list(dict.fromkeys(ids))  # a batch names an id once
        if op == "add":
            new = [i for i in ids if i not in m.want]
            slots = m.take(new)
            table.grow_slots(len(m.keys))
            table.add(np.array([h(i) for i in new], np.int64), np.array(slots, np.int64))
        elif op == "remove":
            table.remove(np.array(m.drop([i for i in ids if i in m.want]), np.int64))
        else:
            got = table.find(ids, np.array([h(i) for i in ids], np.int64), m.keys).tolist()
            assert got == [m.want.get(i, -1) for i in ids]
            if how == "real":
                assert [table.find_one(i, m.keys) for i in ids] == got
        assert table.used == len(m.want)
        assert table.slots().tolist() == sorted(m.want.values())
        # at most 40% full, counting the buckets of ids that left
        assert table._filled <= 0.4 * len(table._buckets)


@SETTINGS
@given(ops, st.sampled_from([0, 20, 10**9]))
def test_the_index_maps_ids_as_a_dict_does(ops: list[tuple[str, list[str]]],
                                           small: int) -> None:
    """small 0: always buckets; 10**9: always a dict; 20: back and forth."""
    m = Model()
    index = IdIndex(m.keys, small)
    for op, ids in ops:
        ids = list(dict.fromkeys(ids))
        if op == "add":
            index.add(m.take([i for i in ids if i not in m.want]))
        elif op == "remove":
            index.remove(m.drop([i for i in ids if i in m.want]))
        else:
            got = index.find(ids).tolist()
            assert got == [m.want.get(i, -1) for i in ids]
            assert [index.find_one(i) for i in ids] == got
        assert index.used == len(m.want)
        assert index.slots().tolist() == sorted(m.want.values())


def test_find_one_does_not_find_a_slot_whose_id_was_cleared() -> None:
    for small in (0, 10**9):
        m = Model()
        index = IdIndex(m.keys, small)
        index.add(m.take(["a", "b"]))
        m.keys[m.want["a"]] = None  # the join clears it when the prediction leaves
        assert index.find_one("a") == -1 and index.find_one("b") == m.want["b"]


@pytest.mark.parametrize("n", [1000, 100_000])
def test_buckets_stay_small_and_shrink(n: int) -> None:
    """At most ~27 B of buckets per id (4 B a bucket, at least 15% full once grown),
    and a table that emptied shrinks back."""
    ids = [f"req-{k:08d}" for k in range(n)]
    table = Buckets(n)
    keys: list[str | None] = list(ids)
    for lo in range(0, n, 5000):
        chunk = ids[lo:lo + 5000]
        table.add(Buckets.hashes(chunk), np.arange(lo, lo + len(chunk)))
    assert table.find(ids, Buckets.hashes(ids), keys).tolist() == list(range(n))
    assert table._buckets.nbytes <= max(MIN_BUCKETS * 4, 27 * n)
    table.remove(np.arange(n))
    assert table.used == 0 and len(table._buckets) <= max(SHRINK_ABOVE, MIN_BUCKETS)
