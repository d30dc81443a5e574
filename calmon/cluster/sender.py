"""What an instance writes to ``kafka.joined_topic``: its engine's new joined samples,
per model, once per checkpoint.

Exactly once with the checkpoint, as an outbox: at each checkpoint the samples the
engine's rings took since the last one become batches *in the checkpoint itself*
(``pending``), and are produced right after it is written. A crash before the write
re-reads the input and joins those samples again (nothing was sent); a crash after it
sends the same bytes again from the restored checkpoint, and the owner drops the copy
by its source offsets (``owner.Owner.accept``). A batch is only forgotten once the
broker acknowledged it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

from calmon.cluster.batch import JoinedBatch, Series, encode
from calmon.engine.buffer import SampleSet


class SampleSource(Protocol):
    """What the sender reads of the engine (``calmon.engine.engine.Engine``)."""

    def buffered_series(self) -> list[tuple[str, str, int]]: ...
    def samples(self, model: str, segment: str, last: int | None = None
                ) -> SampleSet | None: ...
    def now_of(self, model: str) -> float: ...


# (key: the model's UTF-8 name, value: an encoded batch) -> True once acknowledged
Send = Callable[[list[tuple[bytes, bytes]]], bool]


class JoinedSender:
    def __init__(self, index: int) -> None:
        self.index = index
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
            self.pending.append((model.encode(), encode(b)))
        return len(by_model)

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
