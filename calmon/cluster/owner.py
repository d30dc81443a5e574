"""The owner's side, in memory: per-series sample rings fed by joined batches of the
models whose joined-topic partitions this instance was assigned, and the one ``Policy``
(``calmon.recal.policy``, exactly what ``replay --recalibrate`` runs) checked per model
on the largest event time its senders reported.

Re-sent batches (a sender restored a checkpoint written before it heard the broker's
acknowledgement) are dropped by source offset: per (model, input partition) the owner
keeps the end of the input range it has taken, and a batch that advances none is a copy.
The rings, the dedup marks, the clocks, the policy and the joined-topic offsets they
reflect are one snapshot, checkpointed together.

Nothing of a batch is taken before all of it passed ``cluster.checks``: its fields (as
an input record's), and, given a ``Place`` (the running owner), its key, partition and
source range; a refused one is counted by reason (``refused``) and skipped.
"""

from __future__ import annotations

import logging
import math
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from calmon.cluster.batch import BatchError, JoinedBatch, decode
from calmon.cluster.checks import BatchChecks, LogOnce, Refused, new_models
from calmon.engine.buffer import Ring, SampleSet
from calmon.names import ALL
from calmon.recal.policy import CalibratedWindow, Event, Policy

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Place:
    """Where a joined-topic record came from, for the checks of its place."""

    key: bytes | None  # its Kafka key
    partitions: int | None  # the joined topic's partition count (None: not known yet)
    # an input partition's end offset as far as it bounds a claimed one (None: unknown)
    end: Callable[[str, int, int], int | None]


class Owner:
    def __init__(self, policy: Policy, capacity: int) -> None:
        self.policy = policy
        self.capacity = capacity
        self.checks = BatchChecks(policy.cfg)
        self.rings: dict[tuple[str, str], Ring] = {}
        # (model, topic, partition) -> (to, part): the newest source range taken, and
        # the last part of it (a batch cut in parts shares its range)
        self.seen: dict[tuple[str, str, int], tuple[int, int]] = {}
        self.nows: dict[str, float] = {}  # model -> largest event time reported
        self.partition_of: dict[str, int] = {}  # model -> its joined-topic partition
        self.offsets: dict[int, int] = {}  # joined-topic partition -> next offset
        self.accepted = 0  # samples taken (process-local counters)
        self.duplicates = 0  # batches dropped as re-sent
        self.bad = 0  # records refused (not joined batches, or failing a check)
        self.refused: Counter[str] = Counter()  # reason -> records refused
        self._log_due = LogOnce()
        self.lock = threading.RLock()  # the owner's thread vs. checkpoints and readers

    # ------------------------------------------------------------ input

    def accept(self, partition: int, offset: int, value: bytes | None,
               place: Place | None = None) -> bool:
        """One joined-topic record; False when it was a copy or refused."""
        return self.admit(partition, offset, value, place) is True

    def admit(self, partition: int, offset: int, value: bytes | None,
              place: Place | None = None) -> bool | str:
        """True when taken, False for a copy, else the reason it was refused."""
        with self.lock:
            self.offsets[partition] = max(self.offsets.get(partition, 0), offset + 1)
            try:
                b = decode(value or b"")
                self.checks.fields(b)
                if place is not None:
                    self.checks.place(b, place.key, partition, place.partitions)
                    self.checks.source(b, place.end)
                new_models(b, self.partition_of, len(self.rings), self.checks,
                           lambda m, s: (m, s) in self.rings)
            except (BatchError, Refused) as e:
                self._refuse(partition, offset, e.reason, str(e))
                return e.reason
            self.partition_of[b.model] = partition
            return self.take(b)

    def reject(self, partition: int, offset: int, why: str,
               reason: str = "bad_signature") -> None:
        """A record refused before decoding (an unauthentic batch): counted, skipped."""
        with self.lock:
            self.offsets[partition] = max(self.offsets.get(partition, 0), offset + 1)
            self._refuse(partition, offset, reason, why)

    def _refuse(self, partition: int, offset: int, reason: str, why: str) -> None:
        self.bad += 1
        self.refused[reason] += 1
        if self._log_due(reason):
            log.warning("skipping joined-topic record %d/%d (%s): %s; counted in "
                        "calmon_invalid_records_total, not logged again for this reason "
                        "for a minute", partition, offset, reason, why[:300])

    def take(self, b: JoinedBatch) -> bool:
        with self.lock:
            part = b.part[0]
            marks = [(tp, (to, part)) for tp, (_f, to) in b.source.items()
                     if (to, part) > self.seen.get((b.model, *tp), (-1, 0))]
            if b.source and not marks:
                self.duplicates += 1
                return False
            for tp, mark in marks:
                self.seen[(b.model, *tp)] = mark
            if math.isfinite(b.now):
                self.nows[b.model] = max(self.nows.get(b.model, -math.inf), b.now)
            for s in b.series:
                ring = self.rings.get((b.model, s.segment))
                if ring is None or ring.classes != s.classes:
                    ring = self.rings[(b.model, s.segment)] = Ring(self.capacity, s.classes)
                x = s.samples
                before = ring.total
                ring.extend(x.ts, x.label, x.kind, x.score)
                ring.total = before + s.added  # samples the sender's ring lost count too
                self.accepted += len(x)
            return True

    # ------------------------------------------------------------ the policy

    def models(self, partitions: Iterable[int] | None = None) -> list[str]:
        """Models whose batches came on ``partitions`` (all when None)."""
        with self.lock:
            keep = None if partitions is None else set(partitions)
            return sorted(m for m, p in self.partition_of.items()
                          if keep is None or p in keep)

    def samples_of(self, model: str, segment: str, last: int | None = None
                   ) -> SampleSet | None:
        with self.lock:
            ring = self.rings.get((model, segment))
            return None if ring is None else ring.samples(last)

    def series(self, model: str) -> list[tuple[str, str]]:
        with self.lock:
            return sorted(k for k in self.rings if k[0] == model)

    def series_of(self, partitions: Iterable[int] | None = None) -> list[tuple[str, str]]:
        """Every series of the models whose batches came on ``partitions`` (all: None)."""
        return [k for model in self.models(partitions) for k in self.series(model)]

    def check(self, partitions: Iterable[int] | None = None) -> list[Event]:
        """One policy check of every owned model, each on its own clock."""
        return self.policy.check_each(self.now_of, self.series_of(partitions),
                                      self.samples_of)

    def now_of(self, model: str) -> float:
        """The model's event time: the largest its senders reported (-inf if none)."""
        with self.lock:
            return self.nows.get(model, -math.inf)

    def calibrated(self, partitions: Iterable[int] | None = None) -> list[CalibratedWindow]:
        """The calibrated windows of every owned model's series, on the samples of all
        its senders and its own clock: after the live calibrator on what was predicted
        after its ``fitted_at``; a series without one as given (its cluster-wide raw
        window, as far as the buffer holds it: no instance's own window is)."""
        return self.policy.calibrated_windows(self.now_of, self.series_of(partitions),
                                              self.samples_of, identity=True)

    def sample_count(self, model: str) -> int:
        """Samples the owner took for a model (its ``__all__`` ring's total)."""
        with self.lock:
            ring = self.rings.get((model, "__all__"))
            return 0 if ring is None else ring.total

    def forget(self, partitions: Iterable[int]) -> None:
        """Drop what the owner holds of ``partitions`` (moved to another owner, or
        fenced): their models' rings, marks, clocks and policy state, and the input
        offsets, so a partition that comes back is read again from its start."""
        gone = set(partitions)
        if not gone:
            return
        with self.lock:
            models = {m for m, p in self.partition_of.items() if p in gone}
            self.rings = {k: r for k, r in self.rings.items() if k[0] not in models}
            self.seen = {k: o for k, o in self.seen.items() if k[0] not in models}
            self.nows = {m: t for m, t in self.nows.items() if m not in models}
            for m in models:
                del self.partition_of[m]  # in place: the publisher holds this mapping
            self.offsets = {p: o for p, o in self.offsets.items() if p not in gone}
        self.policy.forget(models)
        if models:
            log.info("recalibration state of %s dropped (joined-topic partitions %s)",
                     sorted(models), sorted(gone))

    # ------------------------------------------------------------ state

    def snapshot(self) -> dict[str, Any]:
        with self.lock:
            return {
                "rings": [[m, s, r.snapshot()] for (m, s), r in sorted(self.rings.items())],
                "seen": [[m, t, p, o, i] for (m, t, p), (o, i) in sorted(self.seen.items())],
                "nows": [[m, t] for m, t in sorted(self.nows.items()) if math.isfinite(t)],
                "partition_of": [[m, p] for m, p in sorted(self.partition_of.items())],
                "offsets": [[p, o] for p, o in sorted(self.offsets.items())],
                "policy": self.policy.snapshot(),
            }

    def restore(self, snap: Mapping[str, Any]) -> None:
        with self.lock:
            # series a checkpoint of an older release took from a malformed batch
            # are dropped, not served: a restart recovers from one
            self.rings = {(str(m), str(s)): Ring.restore(self.capacity, r)
                          for m, s, r in snap.get("rings", [])
                          if self.checks.names_ok(str(m), str(s))}
            dropped = len(snap.get("rings", [])) - len(self.rings)
            if dropped:
                log.warning("dropping %d series of the checkpoint whose names the batch "
                            "checks refuse", dropped)
            # [m, t, p, to] before parts were numbered (part 0)
            self.seen = {(str(e[0]), str(e[1]), int(e[2])):
                         (int(e[3]), int(e[4]) if len(e) > 4 else 0)
                         for e in snap.get("seen", [])}
            self.nows = {str(m): float(t) for m, t in snap.get("nows", [])}
            # in place: the publisher holds this very mapping (model -> its producer)
            self.partition_of.clear()
            self.partition_of.update({str(m): int(p) for m, p in snap.get("partition_of", [])
                                      if self.checks.names_ok(str(m), ALL)})
            self.offsets = {int(p): int(o) for p, o in snap.get("offsets", [])}
            if isinstance(snap.get("policy"), dict):
                self.policy.restore(snap["policy"])
