"""``ConfluentSource``'s grouping of one ``consume()`` into per-partition columns,
against a plain loop: partitions interleaved or in runs, two topics with the same
partition numbers, messages without a timestamp, tombstones (no value), keys and
unkeyed messages."""

from __future__ import annotations

import random
from typing import Any

import pytest

pytest.importorskip("confluent_kafka")  # the optional extra calmon[fast]

from confluent_kafka import TIMESTAMP_CREATE_TIME, TIMESTAMP_NOT_AVAILABLE, Message

from calmon.io.confluent_source import _chunks


def plain(messages: list[Any]) -> dict[tuple[str, int], tuple[list[Any], ...]]:
    out: dict[tuple[str, int], tuple[list[Any], ...]] = {}
    for m in messages:
        values, stamps, offsets, keys = out.setdefault((m.topic(), m.partition()),
                                                       ([], [], [], []))
        kind, ts = m.timestamp()
        values.append(m.value())
        stamps.append(None if kind == TIMESTAMP_NOT_AVAILABLE else ts)
        offsets.append(m.offset())
        keys.append(m.key())
    return out


@pytest.mark.parametrize("seed", range(20))
def test_chunks_group_as_a_plain_loop_does(seed: int) -> None:
    rng = random.Random(seed)
    next_offset: dict[tuple[str, int], int] = {}
    messages = []
    key = ("predictions", 0)
    for _ in range(rng.randint(1, 300)):
        if rng.random() < 0.3:  # a new run: another partition, maybe another topic
            key = (rng.choice(["predictions", "labels"]), rng.randrange(3))
        offset = next_offset.get(key, 0)
        next_offset[key] = offset + rng.choice([1, 1, 2])  # gaps: compaction
        stamp = ((TIMESTAMP_NOT_AVAILABLE, -1) if rng.random() < 0.1
                 else (TIMESTAMP_CREATE_TIME, 1_700_000_000_000 + offset))
        value = None if rng.random() < 0.05 else f"v{offset}".encode()
        kafka_key = None if rng.random() < 0.1 else f"id-{offset}".encode()
        messages.append(Message(topic=key[0], partition=key[1], offset=offset, value=value,
                                timestamp=stamp, key=kafka_key))
    want = plain(messages)
    got = _chunks(messages)
    assert {(t, p): (v, s, o, k) for t, p, v, s, o, k in got} == want
    assert len(got) == len(want)  # one chunk per partition
