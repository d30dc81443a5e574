"""calmon.io.batch_guard.inflate: each Kafka codec, bounded. The expected bytes come
from the codec libraries' own one-shot functions (what kafka-python uses)."""

from __future__ import annotations

import gzip
import os
import struct

import lz4.frame
import pytest
import snappy
import zstandard
from kafka import codec as kafka_codec

from calmon.io.batch_guard import GZIP, LZ4, SNAPPY, ZSTD, TooLarge, inflate
from tests.hostile_batches import MIB, gzip_bomb

DATA = b"".join(b'{"id": "r-%d", "model": "m", "prob": 0.%d}' % (i, i % 97)
                for i in range(20_000))  # about 800 KB, compressible


def encoders() -> dict[int, bytes]:
    return {
        GZIP: gzip.compress(DATA),
        SNAPPY: kafka_codec.snappy_encode(DATA),  # xerial framing, as the Java client
        LZ4: lz4.frame.compress(DATA),
        ZSTD: zstandard.ZstdCompressor().compress(DATA),
    }


@pytest.mark.parametrize("codec", [GZIP, SNAPPY, LZ4, ZSTD])
def test_each_codec_inflates_exactly(codec: int) -> None:
    assert bytes(inflate(codec, encoders()[codec], 64 * MIB)) == DATA


def test_raw_snappy_and_concatenated_gzip_members() -> None:
    assert bytes(inflate(SNAPPY, snappy.compress(DATA), 64 * MIB)) == DATA
    two = gzip.compress(DATA[:1000]) + gzip.compress(DATA[1000:])
    assert bytes(inflate(GZIP, two, 64 * MIB)) == DATA


@pytest.mark.parametrize("codec", [GZIP, SNAPPY, LZ4, ZSTD])
def test_past_the_limit_is_too_large(codec: int) -> None:
    with pytest.raises(TooLarge):
        inflate(codec, encoders()[codec], len(DATA) - 1)
    assert len(inflate(codec, encoders()[codec], len(DATA))) == len(DATA)  # the bound is inclusive


def test_a_gzip_bomb_stops_at_the_limit() -> None:
    bomb = gzip_bomb(256 * MIB)
    assert len(bomb) < 300 * 1024
    with pytest.raises(TooLarge):
        inflate(GZIP, bomb, 4 * MIB)


def test_a_snappy_block_claiming_too_much_is_refused_before_inflating() -> None:
    # a raw block whose length header says 1 GiB: refused from the header alone
    claim = 1 << 30
    varint = bytearray()
    while claim >= 0x80:
        varint.append((claim & 0x7F) | 0x80)
        claim >>= 7
    varint.append(claim)
    with pytest.raises(TooLarge):
        inflate(SNAPPY, bytes(varint) + b"\x00" * 10, 64 * MIB)


@pytest.mark.parametrize("codec", [GZIP, SNAPPY, LZ4, ZSTD, 5, 7])
def test_garbage_is_a_value_error(codec: int) -> None:
    garbage = os.urandom(4096)
    with pytest.raises(ValueError):
        inflate(codec, garbage, 64 * MIB)


@pytest.mark.parametrize("codec", [GZIP, LZ4, ZSTD])
def test_truncated_data_is_a_value_error(codec: int) -> None:
    whole = encoders()[codec]
    with pytest.raises(ValueError):
        inflate(codec, whole[: len(whole) // 2], 64 * MIB)


def test_xerial_block_lengths_are_checked() -> None:
    framed = kafka_codec.snappy_encode(DATA)
    bad = framed[:16] + struct.pack("!i", len(framed)) + framed[20:]  # past the end
    with pytest.raises(ValueError):
        inflate(SNAPPY, bad, 64 * MIB)


def test_values_too_large_to_carry_stay_in_the_consumer_process() -> None:
    from calmon.engine.records import Kind
    from calmon.io.consumer_process import _drop_huge
    from calmon.io.source import Skip, to_batch

    carry = 100
    chunks = [("p", 0, [b"a", b"x" * 101, None, b"y" * 100], [1, 2, 3, 4], [10, 11, 12, 13],
               [b"k0", b"k1", b"k2", None]),
              ("p", 1, [b"z" * 500], [5], [7], [None]),
              ("l", 0, [b"b"], [6], [3], [b"k"])]
    skips: list[Skip] = []
    out = _drop_huge(chunks, carry, skips)
    # the one at the limit crosses (oversize for the engine, dead-lettered whole)
    assert out == [("p", 0, [b"a", None, b"y" * 100], [1, 3, 4], [10, 12, 13],
                    [b"k0", b"k2", None]),
                   ("l", 0, [b"b"], [6], [3], [b"k"])]
    assert [(s.topic, s.partition, s.first, s.next_offset, s.reason, s.value) for s in skips] == [
        ("p", 0, 11, 12, "oversize", None), ("p", 1, 7, 8, "oversize", None)]
    batch = to_batch(out, {"p": Kind.PREDICTION, "l": Kind.LABEL}, columns=True)
    batch.add_skips(skips)
    # positions move past the dropped values, a partition left with none included
    assert batch.positions == {("p", 0): 14, ("p", 1): 8, ("l", 0): 4}
