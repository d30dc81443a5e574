"""Record batches that kafka-python can always get past, in bounded memory.

kafka-python inflates a compressed batch whole (580 KB of gzip became 600 MB)
and raises on a batch it cannot read, at the same offset on every poll, so one
such batch stops its partition for good. ``install()`` patches its v2 record
batch (``DefaultRecordBatch``: Kafka >= 0.11 producers) and its fetcher so that,
inside a poll bracketed by ``begin()`` and ``end()``:

- a compressed batch is inflated by a bounded decoder (``inflate``): at most
  ``batch_limit`` bytes, never the whole bomb;
- a batch that cannot be read (a codec error, an unknown codec, a CRC mismatch,
  a record that does not parse, more than ``batch_limit`` bytes inflated) yields
  no records and is reported as a ``Skip`` with its offsets and a reason, so the
  partition moves on and the daemon counts it (and dead-letters its bytes);
- once ``poll_budget`` bytes were inflated in the poll, later compressed batches
  are deferred: their partition yields nothing more in this poll and ``end()``
  returns where to seek it back to, so a poll holds a bounded number of bytes
  however its batches are cut.

A skipped batch's records are never seen by anyone, so its bounds come from the
batch header (``base_offset`` to ``next_offset``), clipped to the fetch offset.

Outside a bracket (another kafka-python consumer in the process) batches decode
as before, bounded: one past the limit raises ``CorruptRecordError``. Legacy
message sets (magic 0 and 1) get the bounded codecs but no skipping: a bad one
stalls its partition, which the source reports (``/readyz``).
"""

from __future__ import annotations

import logging
import struct
import threading
import zlib
from dataclasses import dataclass, field
from typing import Any

from calmon.io.source import Skip

log = logging.getLogger(__name__)

MIB = 1024 * 1024
BATCH_LIMIT = 64 * MIB  # default bound on one batch, inflated
POLL_BUDGET = 32 * MIB  # default: past this many inflated bytes a poll takes no more batches

GZIP, SNAPPY, LZ4, ZSTD = 1, 2, 3, 4
CODECS = {GZIP: "gzip", SNAPPY: "snappy", LZ4: "lz4", ZSTD: "zstd"}


class TooLarge(ValueError):
    """Raised by ``inflate`` when the output would pass the limit."""


# ---------------------------------------------------------------- bounded codecs


def inflate(codec: int, data: Any, limit: int) -> bytearray:
    """The decompressed bytes of a Kafka batch payload. Raises TooLarge past ``limit``
    bytes (having produced at most ``limit + 1``), ValueError when the data is not
    valid for the codec, or the codec is unknown."""
    if codec == GZIP:
        return _gzip(data, limit)
    if codec == SNAPPY:
        return _snappy(bytes(data), limit)
    if codec == LZ4:
        return _lz4(bytes(data), limit)
    if codec == ZSTD:
        return _zstd(bytes(data), limit)
    raise ValueError(f"unknown compression codec {codec}")


def _gzip(data: Any, limit: int) -> bytearray:
    out = bytearray()
    rest = bytes(data)
    while rest.strip(b"\0"):  # gzip members one after another, as GzipFile reads them
        d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        try:
            out += d.decompress(rest, limit + 1 - len(out))
            while not d.eof and d.unconsumed_tail and len(out) <= limit:
                out += d.decompress(d.unconsumed_tail, limit + 1 - len(out))
        except zlib.error as e:
            raise ValueError(f"gzip: {e}") from None
        if len(out) > limit:
            raise TooLarge(f"gzip inflates past {limit} bytes")
        if not d.eof:
            raise ValueError("gzip: truncated data")
        rest = d.unused_data
    return out


def _lz4(data: bytes, limit: int) -> bytearray:
    import lz4.frame

    d = lz4.frame.LZ4FrameDecompressor()
    out = bytearray()
    try:
        out += d.decompress(data, max_length=limit + 1)
        while not d.eof and not d.needs_input and len(out) <= limit:
            out += d.decompress(b"", max_length=limit + 1 - len(out))
    except RuntimeError as e:  # lz4's error for corrupt frames
        raise ValueError(f"lz4: {e}") from None
    if len(out) > limit:
        raise TooLarge(f"lz4 inflates past {limit} bytes")
    if not d.eof:
        raise ValueError("lz4: truncated frame")
    return out


def _zstd(data: bytes, limit: int) -> bytearray:
    """Frames after one another, fed 256 bytes at a time: a zstd block of a few bytes
    may stand for 128 KB, so a step makes at most 8 MB past the limit."""
    import zstandard

    out = bytearray()
    pos = 0
    try:
        while pos < len(data):
            d = zstandard.ZstdDecompressor().decompressobj()
            while not d.eof and pos < len(data):
                out += d.decompress(data[pos:pos + 256])
                pos += 256
                if len(out) > limit:
                    raise TooLarge(f"zstd inflates past {limit} bytes")
            if not d.eof:
                raise ValueError("zstd: truncated frame")
            pos = min(pos, len(data)) - len(d.unused_data)
    except zstandard.ZstdError as e:
        raise ValueError(f"zstd: {e}") from None
    return out


_XERIAL = b"\x82SNAPPY\x00"


def _snappy(data: bytes, limit: int) -> bytearray:
    """Raw snappy, or the xerial framing Kafka's Java client writes (blocks of raw
    snappy). Each block states its length up front: checked before inflating."""
    import snappy

    blocks: list[bytes] = []
    if len(data) > 16 and data[:8] == _XERIAL:
        pos = 16
        while pos < len(data):
            if pos + 4 > len(data):
                raise ValueError("snappy: truncated block header")
            (size,) = struct.unpack_from("!i", data, pos)
            if size < 0 or pos + 4 + size > len(data):
                raise ValueError("snappy: bad block length")
            blocks.append(data[pos + 4:pos + 4 + size])
            pos += 4 + size
    else:
        blocks.append(data)
    out = bytearray()
    for block in blocks:
        if len(out) + _snappy_length(block) > limit:
            raise TooLarge(f"snappy inflates past {limit} bytes")
        try:
            out += snappy.decompress(block)
        except snappy.UncompressError as e:
            raise ValueError(f"snappy: {e.__cause__ or e}") from None
    return out


def _snappy_length(block: bytes) -> int:
    """The uncompressed length a raw snappy block starts with (a varint)."""
    n = shift = 0
    for byte in block[:5]:
        n |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return n
    raise ValueError("snappy: bad length header")


# ---------------------------------------------------------------- the poll bracket


@dataclass
class _Poll:
    batch_limit: int = BATCH_LIMIT
    poll_budget: int = POLL_BUDGET
    keep_bytes: int = 0  # a skipped batch up to this size travels with its Skip
    tp: Any = None  # the TopicPartition whose records are being taken
    fetch_offset: int = 0  # where that partition's fetch started
    inflated: int = 0
    skips: list[Skip] = field(default_factory=list)
    deferred: dict[Any, int] = field(default_factory=dict)


_local = threading.local()


def _current() -> _Poll | None:
    return getattr(_local, "poll", None)


def begin(*, batch_limit: int = BATCH_LIMIT, poll_budget: int = POLL_BUDGET,
          keep_bytes: int = 0) -> None:
    """Start a poll on this thread: batches are skipped and deferred, not raised."""
    _local.poll = _Poll(batch_limit=batch_limit, poll_budget=poll_budget,
                        keep_bytes=keep_bytes)


def end() -> tuple[list[Skip], dict[Any, int]]:
    """End this thread's poll: the batches skipped, and per TopicPartition the offset
    to seek back to (deferred batches)."""
    poll = _current()
    _local.poll = None
    return ([], {}) if poll is None else (poll.skips, poll.deferred)


# ---------------------------------------------------------------- the patches

_installed = False
_install_lock = threading.Lock()


def install() -> None:
    """Patch kafka-python once per process (idempotent)."""
    global _installed
    with _install_lock:
        if _installed:
            return
        from kafka.consumer.fetcher import Fetcher
        from kafka.record import legacy_records
        from kafka.record.default_records import DefaultRecordBatch

        batch: Any = DefaultRecordBatch
        orig_crc = batch.validate_crc
        orig_take = Fetcher.PartitionRecords.take
        for name in ("_maybe_uncompress", "__next__", "_read_msg", "_buffer", "_pos",
                     "_num_records", "_next_record_index", "_decompressed"):
            if not hasattr(batch, name):  # another kafka-python: leave it alone, loudly
                log.error("kafka-python's DefaultRecordBatch has no %s: compressed batches "
                          "are not bounded", name)
                return

        def take(self: Any, n: int | None = None) -> Any:
            poll = _current()
            if poll is not None:
                poll.tp, poll.fetch_offset = self.topic_partition, self.fetch_offset
            return orig_take(self, n)

        def validate_crc(self: Any) -> bool:
            if orig_crc(self):
                return True
            poll = _current()
            if poll is None:
                return False
            if poll.tp not in poll.deferred:  # deferred: read again next poll
                _skip(self, poll, "bad_batch", "CRC mismatch")
            return True

        Fetcher.PartitionRecords.take = take
        batch.validate_crc = validate_crc
        batch._maybe_uncompress = _maybe_uncompress
        batch.__next__ = batch.next = _next
        for name, codec in (("gzip_decode", GZIP), ("snappy_decode", SNAPPY),
                            ("lz4_decode", LZ4)):
            if hasattr(legacy_records, name):
                setattr(legacy_records, name, _legacy(codec))
        _installed = True


def _legacy(codec: int) -> Any:
    def decode(data: Any) -> bytes:
        from kafka.errors import CorruptRecordError

        try:
            return bytes(inflate(codec, data, BATCH_LIMIT))
        except ValueError as e:
            raise CorruptRecordError(f"legacy message set: {e}") from None
    return decode


def _maybe_uncompress(self: Any) -> None:
    if self._decompressed:
        return
    poll = _current()
    if poll is not None and poll.tp in poll.deferred:
        _empty(self)  # a batch before this one was deferred: so is the rest of the fetch
        return
    codec = self.compression_type
    if codec != 0:
        if poll is not None and poll.inflated >= poll.poll_budget:
            poll.deferred[poll.tp] = max(self.base_offset, poll.fetch_offset)
            _empty(self)
            return
        limit = poll.batch_limit if poll is not None else BATCH_LIMIT
        try:
            data = inflate(codec, memoryview(self._buffer)[self._pos:], limit)
        except ValueError as e:
            if poll is None:
                from kafka.errors import CorruptRecordError

                raise CorruptRecordError(f"batch at offset {self.base_offset}: {e}") from None
            reason = "batch_oversize" if isinstance(e, TooLarge) else "bad_batch"
            _skip(self, poll, reason, str(e))
            return
        if poll is not None:
            poll.inflated += len(data)
        self._buffer = data
        self._pos = 0
    self._decompressed = True


def _next(self: Any) -> Any:
    # DefaultRecordBatch.__next__, with a record that does not parse ending the batch
    # as a skip instead of an exception that the next poll meets again
    if self._next_record_index >= self._num_records:
        if self._pos != len(self._buffer) and _current() is None:
            from kafka.errors import CorruptRecordError

            raise CorruptRecordError(
                f"{len(self._buffer) - self._pos} unconsumed bytes after all records consumed")
        raise StopIteration
    try:
        msg = self._read_msg()
    except (ValueError, IndexError, struct.error, OverflowError) as err:
        poll = _current()
        if poll is None:
            from kafka.errors import CorruptRecordError

            raise CorruptRecordError(f"Found invalid record structure: {err!r}") from None
        _skip(self, poll, "bad_batch", f"invalid record structure: {err!r}",
              first=self.base_offset + self._next_record_index)
        raise StopIteration from None
    self._next_record_index += 1
    return msg


def _empty(self: Any) -> None:
    """No (further) records out of this batch; its header (offsets) stays."""
    self._buffer = bytearray()
    self._pos = 0
    self._num_records = 0
    self._next_record_index = 0
    self._decompressed = True


def _skip(self: Any, poll: _Poll, reason: str, detail: str, first: int | None = None) -> None:
    start = max(self.base_offset if first is None else first, poll.fetch_offset)
    end = self.next_offset
    tp = poll.tp
    if tp is not None and end > start:
        whole = self._buffer if not self._decompressed else None  # as fetched
        keep = bytes(whole) if whole is not None and len(whole) <= poll.keep_bytes else None
        poll.skips.append(Skip(tp.topic, tp.partition, start, end, reason, detail, keep))
    _empty(self)
