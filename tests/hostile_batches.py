"""Record batches a hostile (or merely unusual) producer writes: compressed with each
codec, a gzip bomb, a batch whose compressed bytes are garbage. Shared by the source
tests and the daemon tests."""

from __future__ import annotations

import contextlib
import zlib
from collections.abc import Iterator
from typing import Any

MIB = 1024 * 1024


def gzip_bomb(inflated: int) -> bytes:
    """A gzip member of zeros that inflates to ``inflated`` bytes, made a MiB at a time
    (600 MB -> about 580 KB), so the test never holds what it makes calmon refuse."""
    c = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    zeros = bytes(MIB)
    parts = [c.compress(zeros) for _ in range(inflated // MIB)]
    parts.append(c.flush())
    return b"".join(parts)


@contextlib.contextmanager
def gzip_payload(payload: bytes) -> Iterator[None]:
    """While open, every gzip batch kafka-python's producer builds carries ``payload``
    as its compressed records (the header, offsets and CRC stay right, as a broker
    sees them). kafka-python sends a batch uncompressed when compression does not
    make it smaller: give it records larger than ``payload``."""
    from kafka.record import default_records

    real = default_records.gzip_encode
    default_records.gzip_encode = lambda _data, *a, **k: payload
    try:
        yield
    finally:
        default_records.gzip_encode = real


def send_one_batch(bootstrap: str, topic: str, partition: int, values: list[bytes],
                   **settings: Any) -> list[int]:
    """``values`` as one record batch (linger long enough, one flush); their offsets."""
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, max_request_size=16 * MIB,
                             batch_size=32 * MIB, linger_ms=1000, request_timeout_ms=10000,
                             **settings)
    try:
        futures = [producer.send(topic, value=v, partition=partition) for v in values]
        producer.flush(30)
        return [f.get(30).offset for f in futures]
    finally:
        producer.close(timeout=5)


# a YAML billion-laughs: 9^9 strings through aliases, a few hundred bytes of text
ALIAS_BOMB = """\
a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]
b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]
h: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]
i: &i [*h,*h,*h,*h,*h,*h,*h,*h,*h]
"""
