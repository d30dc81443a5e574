"""Kafka record keys against ids: a record whose key is not its id cannot be relied on
to co-partition with the other topic's record of the same id.

A key matches when it is the id's UTF-8 bytes, or, for an id that is an integer (as
calmon writes it, ``str(int)``), its 8-byte big-endian form (Java's
``LongSerializer``). A null key never matches. Records that did not come from Kafka
(``UNKEYED``: files) are not compared.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import compress

from calmon.engine.parsed import LABEL, PRED, Parsed
from calmon.engine.rawbatch import RawBatch
from calmon.engine.records import UNKEYED, Kind, Unkeyed

Key = bytes | None | Unkeyed

_IS_PRED = PRED.__eq__
_IS_LABEL = LABEL.__eq__


def mismatches(raws: RawBatch, parsed: Parsed) -> tuple[int, int]:
    """(predictions, labels) of the batch whose key is not their id; only records
    parsed as a prediction or a label count. ``raws.keys`` must be set."""
    if not parsed.reasons:  # every record parsed, as the kind of its topic
        pk, lk = raws.keys_of(Kind.PREDICTION), raws.keys_of(Kind.LABEL)
    else:
        keys, codes = raws.keys, parsed.kinds
        assert keys is not None
        pk = list(compress(keys, map(_IS_PRED, codes))) if parsed.p_id else []
        lk = list(compress(keys, map(_IS_LABEL, codes))) if parsed.l_id else []
    return count(pk, parsed.p_id), count(lk, parsed.l_id)


def count(keys: Sequence[Key], ids: Sequence[str]) -> int:
    """How many of ``keys`` do not match the id beside them."""
    n = len(ids)
    if n == 0:
        return 0
    try:  # the common batch, every key its id: two joins and one comparison in C
        joined = b"\0".join(keys)  # type: ignore[arg-type]  # None, UNKEYED: TypeError
        mine = "\0".join(ids).encode("utf-8", "surrogatepass")
        # equal joins with n - 1 separators in all: no element holds one, so each
        # key equals its id
        if joined == mine and mine.count(b"\0") == n - 1:
            return 0
    except TypeError:
        pass
    return sum(1 for key, id_ in zip(keys, ids) if key is not UNKEYED and not matches(key, id_))


def matches(key: Key, id_: str) -> bool:
    """Whether one record's key is its id (see the module docstring)."""
    if key is None or key is UNKEYED:
        return key is UNKEYED
    assert isinstance(key, bytes)
    if key == id_.encode("utf-8", "surrogatepass"):
        return True
    return len(key) == 8 and str(int.from_bytes(key, "big", signed=True)) == id_
