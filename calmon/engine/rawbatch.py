"""One poll's records as they came off the topics, as columns, not yet decoded.

Building a ``Raw`` (and its ``topic/partition/offset`` string) per record costs
as much as parsing it; the engine needs the bytes, the kind and the Kafka time of
every record, but the source only of the few it rejects. So a poll stays in
columns, with its partitions' offsets, and a ``Raw`` is made only on demand.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterator

from calmon.engine.records import UNKEYED, Kind, Raw, Unkeyed


class RawBatch:
    __slots__ = ("_parts", "_starts", "keys", "kinds", "stamps", "values")

    def __init__(self) -> None:
        self.kinds: list[Kind] = []
        self.values: list[bytes | None] = []
        self.stamps: list[float | None] = []  # Kafka timestamps in seconds, if any
        # Kafka record keys (None: a null key; UNKEYED: not from Kafka), or None
        # while no record of the batch has one
        self.keys: list[bytes | Unkeyed | None] | None = None
        self._starts: list[int] = []  # first record index of each part
        # each part: ("topic/partition/", its offsets), (None, the records' sources), or
        # (None, a function of a record's index in the part to its source)
        self._parts: list[tuple[str | None, list[int] | list[str] | Callable[[int], str]]] = []

    def add_partition(self, kind: Kind, topic: str, partition: int,
                      values: list[bytes | None], stamps_ms: list[int | None],
                      offsets: list[int], keys: list[bytes | None] | None = None) -> None:
        """One partition's records of a poll, offsets ascending, with their keys."""
        self._add_keys(keys, len(values))
        self._starts.append(len(self.values))
        self._parts.append((f"{topic}/{partition}/", offsets))
        self.kinds.extend([kind] * len(values))
        self.values.extend(values)
        self.stamps.extend([ts / 1000.0 if ts is not None and ts >= 0 else None
                            for ts in stamps_ms])

    def add_raws(self, raws: list[Raw]) -> None:
        keys = [r.key for r in raws]
        self._add_keys(None if keys.count(UNKEYED) == len(keys) else keys, len(raws))
        self._starts.append(len(self.values))
        self._parts.append((None, [r.source for r in raws]))
        self.kinds.extend([r.kind for r in raws])
        self.values.extend([r.value for r in raws])
        self.stamps.extend([r.timestamp for r in raws])

    def add_lines(self, kinds: list[Kind], values: list[bytes | None],
                  source: Callable[[int], str]) -> None:
        """Records of either kind, in the order given (``replay`` reads files so), with no
        Kafka time or key; ``source(j)`` names the part's j-th record, asked only for the
        records the engine rejects or keeps waiting."""
        self._add_keys(None, len(values))
        self._starts.append(len(self.values))
        self._parts.append((None, source))
        self.kinds.extend(kinds)
        self.values.extend(values)
        self.stamps.extend([None] * len(values))

    def _add_keys(self, keys: list[bytes | None] | list[bytes | Unkeyed | None] | None,
                  n: int) -> None:
        """Before the part's values are added: its keys, or UNKEYED for each record."""
        if keys is None:
            if self.keys is not None:
                self.keys.extend([UNKEYED] * n)
            return
        if self.keys is None:
            self.keys = [UNKEYED] * len(self.values)
        self.keys.extend(keys)

    def indices(self, kind: Kind) -> list[int]:
        """The batch indices of the records of one kind, in order."""
        if all(prefix is not None for prefix, _ in self._parts):  # a part per partition
            out: list[int] = []
            ends = [*self._starts[1:], len(self.values)]
            for start, end in zip(self._starts, ends):
                if end > start and self.kinds[start] is kind:
                    out.extend(range(start, end))
            return out
        return [i for i, k in enumerate(self.kinds) if k is kind]

    def keys_of(self, kind: Kind) -> list[bytes | Unkeyed | None]:
        """The keys of the records of one kind, in order (``keys`` must be set)."""
        keys = self.keys
        assert keys is not None
        if all(prefix is not None for prefix, _ in self._parts):  # a part per partition
            out: list[bytes | Unkeyed | None] = []
            ends = [*self._starts[1:], len(self.values)]
            for start, end in zip(self._starts, ends):
                if end > start and self.kinds[start] is kind:
                    out.extend(keys[start:end])
            return out
        return [k for k, kd in zip(keys, self.kinds) if kd is kind]

    @classmethod
    def of(cls, raws: list[Raw]) -> RawBatch:
        out = cls()
        out.add_raws(raws)
        return out

    def __len__(self) -> int:
        return len(self.values)

    def source(self, i: int) -> str:
        """``topic/partition/offset`` (or a file and line) of record i."""
        part = bisect.bisect_right(self._starts, i) - 1
        prefix, rest = self._parts[part]
        j = i - self._starts[part]
        if callable(rest):
            return rest(j)
        at = rest[j]
        return at if prefix is None else f"{prefix}{at}"  # type: ignore[return-value]

    def __getitem__(self, i: int) -> Raw:
        return self.raw(i)

    def raw(self, i: int) -> Raw:
        key = UNKEYED if self.keys is None else self.keys[i]
        return Raw(self.kinds[i], self.values[i], self.stamps[i], self.source(i), key)

    def __iter__(self) -> Iterator[Raw]:
        return (self.raw(i) for i in range(len(self.values)))

