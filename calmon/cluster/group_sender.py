"""Group mode's joined samples (contract §8, recalibration as in §7): each task's new
joined samples, per model, as batches produced to ``kafka.joined_topic`` inside the
task's checkpoint transaction (``Changelog.commit(extra=...)``).

No outbox: the batches, the task's state and the group's offsets commit or abort
together, so a fenced zombie's batches abort with its state, and the task's next owner
restores the committed state and goes on from the positions that state reflects. A
batch's identity for the owner is what the static mode's is (``owner.Owner._take``):
its source range per input partition, here ``[from, to)`` of both input topics of the
task's partition, ``from`` the positions of the task's last committed checkpoint. A
commit that failed leaves the marks where they were, so the next attempt's batches
cover what the refused one did.

The records are sent after the group's offsets are in the transaction, where Apache
Kafka checks the member's generation: a member the group has moved on from does not
even write them as aborted records. Tansu serves aborted records and checks no
generation there, so on it a member killed between sending them and the end of its
transaction (milliseconds a checkpoint), or a zombie, can have its batches counted
beside its successor's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from calmon.calibrators.signing import Signer
from calmon.cluster.batch import JoinedBatch, Series, encode, split
from calmon.cluster.kafka import SIGNATURE_HEADER, signed_bytes
from calmon.cluster.sender import SampleSource

# (topic, key, value, headers): one record for the checkpoint transaction
Record = tuple[str, bytes, bytes, list[tuple[str, bytes]]]


@dataclass
class Marks:
    """What a task's committed checkpoints already carried to the joined topic."""

    sent: dict[tuple[str, str], int] = field(default_factory=dict)  # series -> ring total
    since: dict[str, int] = field(default_factory=dict)  # input topic -> next offset


class GroupSender:
    def __init__(self, topic: str, max_bytes: int, signer: Signer | None = None) -> None:
        self.topic = topic
        self.max_bytes = max_bytes
        self.signer = signer
        self.marks: dict[int, Marks] = {}  # input partition -> its task's marks
        self._next: dict[int, Marks] = {}  # what the transaction under way carries
        self._counts = (0, 0)  # its batches and samples
        self.batches = 0  # batches committed (process-local)
        self.samples = 0  # samples in them

    def restored(self, partition: int, engine: SampleSource,
                 positions: Mapping[str, int]) -> None:
        """Task ``partition`` restored (or new): every sample its engine holds came with
        a committed checkpoint, which carried it already."""
        sent = {}
        for model, segment, _k in engine.buffered_series():
            head = engine.samples(model, segment, 0)
            if head is not None:
                sent[(model, segment)] = head.total
        self.marks[partition] = Marks(sent, dict(positions))

    def drop(self, partition: int) -> None:
        self.marks.pop(partition, None)
        self._next.pop(partition, None)

    def collect(self, tasks: Mapping[int, tuple[SampleSource, Mapping[str, int]]]
                ) -> list[Record]:
        """The records of each task's samples since its marks (engine, positions the
        checkpoint writes): one batch per model (in parts when large), keyed by it."""
        self._next, self._counts = {}, (0, 0)
        out: list[Record] = []
        for p, (engine, positions) in sorted(tasks.items()):
            marks = self.marks.get(p)
            if marks is None:  # not restored here: nothing it holds is known to be new
                continue
            nxt = Marks(dict(marks.sent), dict(positions))
            by_model: dict[str, list[Series]] = {}
            for model, segment, classes in engine.buffered_series():
                head = engine.samples(model, segment, 0)
                added = 0 if head is None else head.total - marks.sent.get((model, segment), 0)
                fresh = engine.samples(model, segment, added) if added > 0 else None
                if head is None or fresh is None:
                    continue
                nxt.sent[(model, segment)] = head.total
                by_model.setdefault(model, []).append(Series(segment, classes, added, fresh))
            source = {(t, p): (marks.since.get(t, 0), to) for t, to in positions.items()
                      if to > marks.since.get(t, 0)}
            for model, series in sorted(by_model.items()):
                b = JoinedBatch(model, engine.now_of(model), 0, source, series)
                out += [self._record(model, part) for part in split(b, self.max_bytes)]
            self._next[p] = nxt
        return out

    def _record(self, model: str, b: JoinedBatch) -> Record:
        key, value = model.encode(), encode(b)
        headers = [] if self.signer is None else [
            (SIGNATURE_HEADER, self.signer.sign_bytes(signed_bytes(key, value)).encode())]
        self._counts = (self._counts[0] + 1, self._counts[1] + len(b))
        return (self.topic, key, value, headers)

    def committed(self) -> None:
        """The transaction that carried the last ``collect`` committed."""
        for p, nxt in self._next.items():
            if p in self.marks:
                self.marks[p] = nxt
        self.batches += self._counts[0]
        self.samples += self._counts[1]
        self._next, self._counts = {}, (0, 0)
