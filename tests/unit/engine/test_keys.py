"""Record keys against ids (``calmon_key_mismatch_total``): the id's UTF-8 bytes, or for
an integer id its 8-byte big-endian form (Java's LongSerializer, written here with
``struct``); a null key never matches; records from files are not compared."""

from __future__ import annotations

import json
import random
import struct

from calmon.config import Config
from calmon.engine.engine import Engine
from calmon.engine.keys import count, matches
from calmon.engine.rawbatch import RawBatch
from calmon.engine.records import UNKEYED, Kind, Raw

T0 = 1_764_460_800.0


def long_key(n: int) -> bytes:
    return struct.pack(">q", n)  # java.lang.Long through LongSerializer


def test_a_key_matches_its_id_in_either_form() -> None:
    assert matches(b"req-91", "req-91")
    assert matches("ünï".encode(), "ünï")
    assert matches(b"91", "91")
    assert matches(long_key(91), "91")
    assert matches(long_key(-7), "-7")
    assert matches(long_key(2**63 - 1), str(2**63 - 1))
    assert not matches(None, "91")  # a null key
    assert not matches(b"", "91")
    assert not matches(long_key(92), "91")
    assert not matches(long_key(91), "req-91")
    assert not matches(b"91 ", "91")
    assert not matches("ünï".encode("latin-1"), "ünï")
    assert matches(UNKEYED, "anything")  # not from Kafka: nothing to compare


def test_count_agrees_with_one_by_one() -> None:
    rng = random.Random(5)
    for _ in range(200):
        n = rng.randint(1, 40)
        ids = [rng.choice(["a", "b\0c", "é", "12", "-3", "x" * 5]) + str(rng.randint(0, 9))
               for _ in range(n)]
        keys: list[bytes | None] = []
        for i in ids:
            r = rng.random()
            keys.append(i.encode() if r < 0.6 else None if r < 0.7 else
                        long_key(int(i)) if i.lstrip("-").isdigit() else b"\0" + i.encode())
        want = sum(1 for k, i in zip(keys, ids) if not matches(k, i))
        assert count(keys, ids) == want
    # separators inside ids cannot make unequal lists look equal
    assert count([b"a\0", b"b"], ["a", "\0b"]) == 2


def _pred(pid: str | int) -> bytes:
    return json.dumps({"id": pid, "model": "m", "ts": T0, "prob": 0.25}).encode()


def _label(lid: str | int) -> bytes:
    return json.dumps({"id": lid, "label": 1, "ts": T0 + 1}).encode()


def test_the_engine_counts_mismatches_per_topic() -> None:
    """Keys travel from the poll's columns to the engine; invalid records are not
    compared (they are counted as invalid), records of a file are not either."""
    e = Engine(Config())
    batch = RawBatch()
    batch.add_partition(Kind.PREDICTION, "p", 0,
                        [_pred("a"), _pred(7), b"not json", _pred("c")], [None] * 4,
                        [0, 1, 2, 3], [b"a", long_key(7), None, b"C"])
    batch.add_partition(Kind.LABEL, "l", 0, [_label("a"), _label(7), _label("c")],
                        [None] * 3, [0, 1, 2], [None, b"7", b"c"])
    batch.add_raws([Raw(Kind.LABEL, _label("zz"), None, "file:1")])  # no key to compare
    e.feed(batch)
    assert e.last_delta.key_mismatch == {"predictions": 1, "labels": 1}
    assert e.counters["joined"] == 3
    # the same records one at a time (the daemon's careful path) count the same
    e2 = Engine(Config())
    total: dict[str, int] = {"predictions": 0, "labels": 0}
    for r in batch:
        e2.feed([r])
        for k, v in e2.last_delta.key_mismatch.items():
            total[k] += v
    assert total == {"predictions": 1, "labels": 1}


def test_records_without_kafka_keys_are_not_compared() -> None:
    e = Engine(Config())
    e.feed([Raw(Kind.PREDICTION, _pred("a")), Raw(Kind.LABEL, _label("a"))])
    assert not +e.last_delta.key_mismatch
