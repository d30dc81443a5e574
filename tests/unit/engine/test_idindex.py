"""IdIndex against a dict, through random adds, removals and lookups; with real
hashes, and with hashes squeezed into a few values so that ids share buckets and
even whole hashes (the table must still tell them apart by id)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from calmon.engine.idindex import MIN_BUCKETS, SHRINK_ABOVE, IdIndex

IDS = [f"id-{k}" for k in range(300)]

ops = st.lists(st.tuples(st.sampled_from(["add", "remove", "find"]),
                         st.lists(st.sampled_from(IDS), max_size=120)),
               min_size=1, max_size=30)


def squeezed(pid: str) -> int:
    return hash(pid) % 5 - 2  # five hash values, negative ones too


HASHES: dict[str, Callable[[str], int]] = {"real": hash, "squeezed": squeezed}


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(ops, st.sampled_from(sorted(HASHES)))
def test_it_maps_ids_as_a_dict_does(ops: list[tuple[str, list[str]]], how: str) -> None:
    h = HASHES[how]
    index = IdIndex(4)
    keys: list[str | None] = []
    want: dict[str, int] = {}
    free: list[int] = []
    for op, ids in ops:
        ids = list(dict.fromkeys(ids))  # a batch names an id once
        hashes = np.array([h(i) for i in ids], np.int64)
        if op == "add":
            new = [i for i in ids if i not in want]
            slots = []
            for pid in new:
                if not free:
                    free.append(len(keys))
                    keys.append(None)
                slot = free.pop()
                keys[slot] = pid
                want[pid] = slot
                slots.append(slot)
            index.grow_slots(len(keys))
            index.add(np.array([h(i) for i in new], np.int64), np.array(slots, np.int64))
        elif op == "remove":
            gone = [i for i in ids if i in want]
            index.remove(np.array([want[i] for i in gone], np.int64))
            for pid in gone:
                keys[want[pid]] = None
                free.append(want.pop(pid))
        else:
            got = index.find(ids, hashes, keys).tolist()
            assert got == [want.get(i, -1) for i in ids]
            if how == "real":
                assert [index.find_one(i, keys) for i in ids] == got
        assert index.used == len(want)
        assert index.slots().tolist() == sorted(want.values())
        # at most 40% full, counting the buckets of ids that left
        assert index._filled <= 0.4 * len(index._buckets)


@pytest.mark.parametrize("n", [1000, 100_000])
def test_it_stays_small_and_shrinks(n: int) -> None:
    """At most ~27 B of buckets per id (4 B a bucket, at least 15% full once grown),
    and a table that emptied shrinks back."""
    ids = [f"req-{k:08d}" for k in range(n)]
    index = IdIndex(n)
    keys: list[str | None] = list(ids)
    for lo in range(0, n, 5000):
        chunk = ids[lo:lo + 5000]
        index.add(IdIndex.hashes(chunk), np.arange(lo, lo + len(chunk)))
    assert index.find(ids, IdIndex.hashes(ids), keys).tolist() == list(range(n))
    assert index._buckets.nbytes <= max(MIN_BUCKETS * 4, 27 * n)
    index.remove(np.arange(n))
    assert index.used == 0 and len(index._buckets) <= max(SHRINK_ABOVE, MIN_BUCKETS)
