"""Pending predictions by id (id -> slot), looked up a whole batch of ids at a time.

While it is small, a dict: fastest while it fits in the CPU's caches. Past
``SMALL`` ids, where a dict's cost is memory (~40 B an entry in its own tables
and a 28-byte int object for each value), an open-addressing hash table over
numpy (``Buckets``): a bucket is 4 bytes (the slot, or EMPTY / GONE) in a table
kept between 15% and 40% full, and each slot keeps its id's 8-byte hash; a
batch's lookups are a few numpy gathers, whose cache misses overlap. It goes
back to a dict once it shrinks well below ``SMALL``.

Ids are placed by Python's ``hash`` (salted per process), so the table is never
persisted: a restore rebuilds it. A hash match is confirmed against the caller's
``keys`` (slot -> id), so the table is exact even if two ids ever share a hash.
"""

from __future__ import annotations

from itertools import repeat
from operator import eq

import numpy as np

EMPTY, GONE = -1, -2  # a bucket never used; one whose id left (probes go on past it)
MIN_BUCKETS = 64
LOAD_NUM, LOAD_DEN = 2, 5  # at most 40% of the buckets used (or GONE): short probes
SCALAR_BELOW = 8  # ids still probing when a vectorised round stops paying
SHRINK_ABOVE = 2**16  # buckets (256 KB)
SMALL = 2**16  # ids: a dict up to this many, Buckets past it


class IdIndex:
    """id -> slot for ids the caller keeps in ``keys[slot]`` (a list it grows and
    clears in place). ``add`` and ``remove`` take whole columns of slots: callers add
    only slots whose id is absent, and remove only slots that are present (their
    ``keys`` entry may already be cleared). ``find_one`` does not find a slot whose
    ``keys`` entry was cleared."""

    def __init__(self, keys: list[str | None], small: int | None = None) -> None:
        self._keys = keys
        self._small = SMALL if small is None else small
        self._dict: dict[str, int] | None = {}
        # dict mode: slot -> id, for remove (the caller may have cleared keys[slot])
        self._ids: list[str | None] = []
        self._table: Buckets | None = None

    @property
    def used(self) -> int:
        return len(self._dict) if self._dict is not None else self._table.used  # type: ignore[union-attr]

    def find(self, ids: list[str]) -> np.ndarray:
        """The slot of each id, or -1."""
        if self._dict is not None:
            return np.fromiter(map(self._dict.get, ids, repeat(-1)), np.int64, len(ids))
        assert self._table is not None
        return self._table.find(ids, Buckets.hashes(ids), self._keys)

    def find_one(self, pid: str) -> int:
        if self._dict is not None:
            s = self._dict.get(pid, -1)
            return s if s >= 0 and self._keys[s] == pid else -1
        assert self._table is not None
        return self._table.find_one(pid, self._keys)

    def slots(self) -> np.ndarray:
        """The indexed slots, ascending."""
        if self._dict is not None:
            return np.sort(np.fromiter(self._dict.values(), np.int64, len(self._dict)))
        assert self._table is not None
        return self._table.slots()

    def add(self, slots: list[int]) -> None:
        ids = list(map(self._keys.__getitem__, slots))
        if self._dict is not None and len(self._dict) + len(slots) <= self._small:
            self._dict.update(zip(ids, slots))  # type: ignore[arg-type]
            self._own(slots, ids)
            return
        if self._dict is not None:  # past SMALL: the dict's ids move to buckets
            self._table = Buckets(len(self._keys))
            self._table.add(Buckets.hashes(list(self._dict)),
                            np.fromiter(self._dict.values(), np.int64, len(self._dict)))
            self._dict, self._ids = None, []
        assert self._table is not None
        self._table.grow_slots(len(self._keys))
        self._table.add(Buckets.hashes(ids), np.asarray(slots, np.int64))  # type: ignore[arg-type]

    def remove(self, slots: list[int]) -> None:
        if self._dict is not None:
            ids = self._ids
            for slot in slots:
                del self._dict[ids[slot]]  # type: ignore[arg-type]
                ids[slot] = None  # the id string goes with its prediction
            return
        assert self._table is not None
        self._table.remove(np.asarray(slots, np.int64))
        if self._table.used * 4 < self._small:  # well below SMALL again: a dict
            live = self._table.slots().tolist()
            ids = list(map(self._keys.__getitem__, live))
            self._dict = dict(zip(ids, live))  # type: ignore[arg-type]
            self._own(live, ids)
            self._table = None

    def _own(self, slots: list[int], ids: list[str | None]) -> None:
        """Dict mode: remember each slot's id."""
        if len(self._ids) < len(self._keys):
            self._ids.extend([None] * (len(self._keys) - len(self._ids)))
        for _ in map(self._ids.__setitem__, slots, ids):  # a C loop
            pass


class Buckets:
    """id -> slot as numpy buckets, for ids the caller keeps in ``keys[slot]``."""

    def __init__(self, slots: int = 16) -> None:
        self._buckets = np.full(MIN_BUCKETS, EMPTY, np.int32)
        self._mask = MIN_BUCKETS - 1
        self._hash = np.zeros(slots, np.int64)  # slot -> hash of its id
        self.used = 0  # slots indexed
        self._filled = 0  # buckets not EMPTY: used + GONE

    def grow_slots(self, n: int) -> None:
        """Room for slots ``0..n-1``."""
        if n > len(self._hash):
            new = np.zeros(n, np.int64)
            new[:len(self._hash)] = self._hash
            self._hash = new

    @staticmethod
    def hashes(ids: list[str]) -> np.ndarray:
        return np.fromiter(map(hash, ids), np.int64, len(ids))

    # ------------------------------------------------------------ lookups

    def find(self, ids: list[str], hashes: np.ndarray, keys: list[str | None]) -> np.ndarray:
        """The slot of each id, or -1."""
        out = np.full(len(ids), -1, np.int64)
        if not self.used or not len(ids):
            return out
        buckets, mask, slot_hash = self._buckets, self._mask, self._hash
        at = hashes & mask
        todo = np.arange(len(ids))
        h = hashes
        while len(todo) > SCALAR_BELOW:
            s = buckets[at].astype(np.int64)
            hit = (s >= 0) & (slot_hash[np.maximum(s, 0)] == h)
            out[todo[hit]] = s[hit]
            more = (s != EMPTY) & ~hit
            todo, at, h = todo[more], (at[more] + 1) & mask, h[more]
        for i in todo.tolist():  # the last long probes: one by one is cheaper than a round
            out[i] = self._probe(ids[i], int(hashes[i]), keys)
        found = np.flatnonzero(out >= 0)
        if len(found):  # a hash match is an id match, unless two ids share a hash
            f = found.tolist()
            same = list(map(eq, map(keys.__getitem__, out[found].tolist()),
                            map(ids.__getitem__, f)))
            if not all(same):
                for i, ok in zip(f, same):
                    if not ok:
                        out[i] = self._probe(ids[i], int(hashes[i]), keys)
        return out

    def find_one(self, pid: str, keys: list[str | None]) -> int:
        """The slot of one id, or -1."""
        return self._probe(pid, hash(pid), keys) if self.used else -1

    def _probe(self, pid: str, h: int, keys: list[str | None]) -> int:
        at = h & self._mask
        buckets = self._buckets
        while True:
            s = int(buckets[at])
            if s == EMPTY:
                return -1
            if s >= 0 and int(self._hash[s]) == h and keys[s] == pid:
                return s
            at = (at + 1) & self._mask

    def slots(self) -> np.ndarray:
        """The indexed slots, ascending."""
        b = self._buckets
        return np.sort(b[b >= 0]).astype(np.int64)

    # ------------------------------------------------------------ changes

    def add(self, hashes: np.ndarray, slots: np.ndarray) -> None:
        """Index ``slots`` under ``hashes`` (ids not indexed yet)."""
        n = len(slots)
        if not n:
            return
        self._hash[slots] = hashes
        if (self._filled + n) * LOAD_DEN > LOAD_NUM * len(self._buckets):
            self._rebuild(self.used + n)
        buckets, mask = self._buckets, self._mask
        at = hashes & mask
        todo = np.asarray(slots, np.int32)
        while len(todo):
            s = buckets[at]
            free = np.flatnonzero(s < 0)
            # ids of this batch that want the same free bucket: one write wins
            buckets[at[free]] = todo[free]
            win = free[buckets[at[free]] == todo[free]]
            self._filled += int(np.count_nonzero(s[win] == EMPTY))
            more = np.ones(len(todo), bool)
            more[win] = False
            # the others found their bucket taken (before, or by a winner): next one
            todo, at = todo[more], (at[more] + 1) & mask
        self.used += n

    def remove(self, slots: np.ndarray) -> None:
        """Unindex ``slots`` (each indexed)."""
        if not len(slots):
            return
        buckets, mask = self._buckets, self._mask
        slots = np.asarray(slots, np.int64)
        at = self._hash[slots] & mask
        todo = slots
        while len(todo):
            hit = buckets[at] == todo
            buckets[at[hit]] = GONE
            todo, at = todo[~hit], (at[~hit] + 1) & mask
        self.used -= len(slots)
        # shrinks only a large table that emptied: small ones would rebuild every batch
        if self._filled * LOAD_DEN > LOAD_NUM * len(buckets) or (len(buckets) > SHRINK_ABOVE
                                                and 32 * self.used < len(buckets)):
            self._rebuild(self.used)

    def _rebuild(self, n: int) -> None:
        """A fresh table for ``n`` ids, at most 30% full: GONE buckets dropped."""
        live = self.slots()
        size = MIN_BUCKETS
        while 10 * n > 3 * size:
            size *= 2
        self._buckets = np.full(size, EMPTY, np.int32)
        self._mask = size - 1
        self._filled = 0
        used, self.used = self.used, 0
        if len(live):
            self.add(self._hash[live], live)
        assert self.used == used

