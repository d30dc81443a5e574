"""What an instance writes to ``kafka.joined_topic``: its engine's new joined samples,
per model, once per checkpoint.

Exactly once with the checkpoint, as an outbox: at each checkpoint the samples the
engine's rings took since the last one become batches *in the checkpoint itself*
(``pending``), and are produced right after it is written. A crash before the write
re-reads the input and joins those samples again (nothing was sent); a crash after it
sends the same bytes again from the restored checkpoint, and the owner drops the copy
by its source offsets (``owner.Owner.accept``). A batch is only forgotten once the
broker acknowledged it. While the broker does not acknowledge, a model's older pending
batches are dropped once its newer ones hold ``capacity`` samples of every series (what
the owner's ring keeps), so an outage of ``joined_topic`` never grows the checkpoint
past about the size of the engine's own rings. A batch larger than ``max_bytes`` (what
one Kafka record may hold: the producer's ``max_request_size`` and the broker's limit)
is cut in parts (``batch.split``), so a catch-up never stops the joined topic.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

from calmon.cluster.batch import JoinedBatch, Series, decode, encode, split
from calmon.engine.buffer import SampleSet


class SampleSource(Protocol):
    """What the sender reads of the engine (``calmon.engine.engine.Engine``)."""

    def buffered_series(self) -> list[tuple[str, str, int]]: ...
    def samples(self, model: str, segment: str, last: int | None = None
                ) -> SampleSet | None: ...
    def now_of(self, model: str) -> float: ...


DEFAULT_MAX_BYTES = (1 << 20) - (16 << 10)  # 1 MiB records, less the record's own overhead

# (key: the model's UTF-8 name, value: an encoded batch) -> True once acknowledged
Send = Callable[[list[tuple[bytes, bytes]]], bool]


class JoinedSender:
    def __init__(self, index: int, capacity: int | None = None,
                 max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        """``capacity``: the samples a series' batch keeps while unacknowledged
        (``recalibration.buffer``; None keeps all); ``max_bytes``: the largest batch
        (encoded) one record carries."""
        self.index = index
        self.capacity = capacity
        self.max_bytes = max_bytes
        self.sent: dict[tuple[str, str], int] = {}  # series -> its ring total already taken
        self.since: dict[tuple[str, int], int] = {}  # input positions at the last collect
        self.pending: list[tuple[bytes, bytes]] = []  # batches not yet acknowledged
        self.batches = 0  # acknowledged batches (process-local)
        self.samples = 0  # samples in them

    def collect(self, engine: SampleSource, positions: Mapping[tuple[str, int], int]) -> int:
        """New samples of every buffered series into pending batches (one per model),
        with the input range they came from. Returns how many batches were added."""
        by_model: dict[str, list[Series]] = {}
        for model, segment, classes in engine.buffered_series():
            head = engine.samples(model, segment, 0)
            if head is None:
                continue
            added = head.total - self.sent.get((model, segment), 0)
            if added <= 0:
                continue
            fresh = engine.samples(model, segment, added)
            if fresh is None:
                continue
            self.sent[(model, segment)] = head.total
            by_model.setdefault(model, []).append(Series(segment, classes, added, fresh))
        now_pos = dict(positions)
        source = {tp: (self.since.get(tp, 0), to) for tp, to in now_pos.items()
                  if to > self.since.get(tp, 0)}
        self.since = now_pos
        for model, series in sorted(by_model.items()):
            b = JoinedBatch(model, engine.now_of(model), self.index, source, series)
            self.pending += [(model.encode(), encode(p)) for p in split(b, self.max_bytes)]
        if self.capacity is not None and len(self.pending) > len(by_model):
            self._bound()
        return len(by_model)

    def _bound(self) -> None:
        """Unacknowledged for long (``joined_topic`` down): drop a model's older pending
        batch once its newer ones hold ``capacity`` samples of each of its series (the
        owner's ring would evict it anyway), handing its ``added`` count on to the next,
        so the owner's totals stay exact. Never merged: a batch the broker may have
        stored is re-sent as it was or not at all, so a copy is always dropped whole."""
        cap = self.capacity
        assert cap is not None
        batches = [decode(v) for _k, v in self.pending]
        keep = [True] * len(batches)
        newer: dict[tuple[str, str], int] = {}  # samples the newer batches hold
        carry: dict[int, dict[str, int]] = {}  # batch index -> added to hand on
        nearest: dict[tuple[str, str], int] = {}  # series -> its nearest newer kept batch
        for i in range(len(batches) - 1, -1, -1):
            b = batches[i]
            if b.series and all(newer.get((b.model, s.segment), 0) >= cap for s in b.series):
                keep[i] = False
                for s in b.series:
                    to = carry.setdefault(nearest[(b.model, s.segment)], {})
                    to[s.segment] = to.get(s.segment, 0) + s.added
                continue
            for s in b.series:
                key = (b.model, s.segment)
                newer[key] = newer.get(key, 0) + len(s.samples)
                nearest[key] = i
        if all(keep):
            return
        pending = []
        for i, (k, v) in enumerate(self.pending):
            if not keep[i]:
                continue
            more = carry.get(i)
            if more:
                b = batches[i]
                v = encode(JoinedBatch(b.model, b.now, b.sender, b.source, [
                    Series(s.segment, s.classes, s.added + more.get(s.segment, 0), s.samples)
                    for s in b.series], b.part))
            pending.append((k, v))
        self.pending = pending

    def flush(self, send: Send) -> bool:
        """Produce the pending batches; forgotten only once all are acknowledged."""
        if not self.pending:
            return True
        if not send(list(self.pending)):
            return False
        self.batches += len(self.pending)
        self.pending = []
        return True

    def snapshot(self) -> dict[str, Any]:
        return {"sent": [[m, s, n] for (m, s), n in sorted(self.sent.items())],
                "since": [[t, p, o] for (t, p), o in sorted(self.since.items())],
                "pending": [[k, v] for k, v in self.pending]}

    def restore(self, snap: Mapping[str, Any]) -> None:
        self.sent = {(str(m), str(s)): int(n) for m, s, n in snap.get("sent", [])}
        self.since = {(str(t), int(p)): int(o) for t, p, o in snap.get("since", [])}
        self.pending = [(bytes(k), bytes(v)) for k, v in snap.get("pending", [])]
