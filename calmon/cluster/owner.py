"""The owner's side, in memory: per joined-topic partition it was assigned, the sample
rings fed by that partition's joined batches, their dedup marks, their models' event
times and the partition's next offset (``PartitionState``); and the one ``Policy``
(``calmon.recal.policy``, exactly what ``replay --recalibrate`` runs) checked per model
on the largest event time its senders reported.

A partition's state is made when the partition is assigned and dropped whole when it
goes (as quix-streams' state manager does on assign and revoke): ``revoke`` sets it
aside until the next assignment says whether it came back (an eager rebalance revokes
everything it hands straight back), ``assign`` drops what did not, and ``drop`` (a
fenced publish) at once; a dropped partition's models leave the policy too, so a
partition that comes back is rebuilt from the joined topic like one never owned.

Re-sent batches (a sender restored a checkpoint written before it heard the broker's
acknowledgement) are dropped by source offset: per (model, input partition) the owner
keeps the end of the input range it has taken, and a batch that advances none is a copy.
The partitions' states, the policy and the joined-topic offsets they reflect are one
snapshot, checkpointed together (its format is the flat one of earlier releases).

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
from dataclasses import dataclass, field
from typing import Any

from calmon.cluster.batch import BatchError, JoinedBatch, decode
from calmon.cluster.checks import BatchChecks, LogOnce, Refused, new_models
from calmon.engine.buffer import Ring, SampleSet
from calmon.names import ALL
from calmon.recal.policy import Event, Policy

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Place:
    """Where a joined-topic record came from, for the checks of its place."""

    key: bytes | None  # its Kafka key
    partitions: int | None  # the joined topic's partition count (None: not known yet)
    # an input partition's end offset as far as it bounds a claimed one (None: unknown)
    end: Callable[[str, int, int], int | None]


@dataclass
class PartitionState:
    """What the owner holds of one joined-topic partition."""

    rings: dict[tuple[str, str], Ring] = field(default_factory=dict)
    # (model, topic, partition) -> (to, part): the newest source range taken, and the
    # last part of it (a batch cut in parts shares its range)
    seen: dict[tuple[str, str, int], tuple[int, int]] = field(default_factory=dict)
    nows: dict[str, float] = field(default_factory=dict)  # model -> largest event time
    models: set[str] = field(default_factory=set)  # the models keyed to this partition
    offset: int | None = None  # the next offset to read (None: from the start)

    def read(self, offset: int) -> None:
        self.offset = max(self.offset or 0, offset + 1)


class Owner:
    def __init__(self, policy: Policy, capacity: int) -> None:
        self.policy = policy
        self.capacity = capacity
        self.checks = BatchChecks(policy.cfg)
        self.parts: dict[int, PartitionState] = {}  # joined-topic partition -> its state
        # revoked, or restored from a checkpoint, and not assigned (again) yet
        self.aside: dict[int, PartitionState] = {}
        self.accepted = 0  # samples taken (process-local counters)
        self.duplicates = 0  # batches dropped as re-sent
        self.bad = 0  # records refused (not joined batches, or failing a check)
        self.refused: Counter[str] = Counter()  # reason -> records refused
        self._log_due = LogOnce()
        self.lock = threading.RLock()  # the owner's thread vs. checkpoints and readers

    # ------------------------------------------------------------ assignment

    def assign(self, partitions: Iterable[int]) -> None:
        """``partitions`` are this owner's now (eager or incremental assignors alike):
        each keeps its state, or takes the one set aside for it, or starts empty; what
        was set aside and not handed back moved to another owner and is dropped."""
        with self.lock:
            for p in partitions:
                if p not in self.parts:
                    self.parts[p] = self.aside.pop(p) if p in self.aside else PartitionState()
            gone, self.aside = self.aside, {}
        self._dropped(gone)

    def revoke(self, partitions: Iterable[int]) -> None:
        """``partitions`` are not this owner's for now: neither read nor checked; their
        state waits for the next assignment."""
        with self.lock:
            for p in partitions:
                st = self.parts.pop(p, None)
                if st is not None:
                    self.aside[p] = st

    def drop(self, partitions: Iterable[int]) -> None:
        """Drop what the owner holds of ``partitions`` (fenced: a newer owner has them),
        so a partition that comes back is read again from its start."""
        with self.lock:
            gone = {p: st for p in set(partitions)
                    for st in (self.parts.pop(p, None), self.aside.pop(p, None))
                    if st is not None}
        self._dropped(gone)

    def _dropped(self, gone: Mapping[int, PartitionState]) -> None:
        models = {m for st in gone.values() for m in st.models}
        self.policy.forget(models)
        if models:
            log.info("recalibration state of %s dropped (joined-topic partitions %s)",
                     sorted(models), sorted(gone))

    def _part(self, partition: int) -> PartitionState:
        """The state of an owned partition (made at its first record when the owner is
        fed directly, without an assignment)."""
        st = self.parts.get(partition)
        if st is None:
            st = self.parts[partition] = (self.aside.pop(partition) if partition in self.aside
                                          else PartitionState())
        return st

    # ------------------------------------------------------------ input

    def accept(self, partition: int, offset: int, value: bytes | None,
               place: Place | None = None) -> bool:
        """One joined-topic record; False when it was a copy or refused."""
        return self.admit(partition, offset, value, place) is True

    def admit(self, partition: int, offset: int, value: bytes | None,
              place: Place | None = None) -> bool | str:
        """True when taken, False for a copy, else the reason it was refused."""
        with self.lock:
            st = self._part(partition)
            st.read(offset)
            try:
                b = decode(value or b"")
                self.checks.fields(b)
                if place is not None:
                    self.checks.place(b, place.key, partition, place.partitions)
                    self.checks.source(b, place.end)
                new_models(b, self._partition_of(), self._series_count(), self.checks,
                           lambda m, s: self._ring(m, s) is not None)
            except (BatchError, Refused) as e:
                self._refuse(partition, offset, e.reason, str(e))
                return e.reason
            self._key(b.model, st)
            return self._take(st, b)

    def reject(self, partition: int, offset: int, why: str,
               reason: str = "bad_signature") -> None:
        """A record refused before decoding (an unauthentic batch): counted, skipped."""
        with self.lock:
            self._part(partition).read(offset)
            self._refuse(partition, offset, reason, why)

    def request(self, partition: int, offset: int, model: str) -> None:
        """A rollback request of ``model`` read at ``offset``: the model is keyed to the
        partition (its producer publishes the rollback)."""
        with self.lock:
            st = self._part(partition)
            st.read(offset)
            if self.partition_of(model) is None:
                self._key(model, st)

    def _refuse(self, partition: int, offset: int, reason: str, why: str) -> None:
        self.bad += 1
        self.refused[reason] += 1
        if self._log_due(reason):
            log.warning("skipping joined-topic record %d/%d (%s): %s; counted in "
                        "calmon_invalid_records_total, not logged again for this reason "
                        "for a minute", partition, offset, reason, why[:300])

    def take(self, b: JoinedBatch, partition: int = 0) -> bool:
        """A checked batch into ``partition``'s state; False for a copy."""
        with self.lock:
            st = self._part(partition)
            self._key(b.model, st)
            return self._take(st, b)

    def _key(self, model: str, st: PartitionState) -> None:
        """``model`` is keyed to ``st``'s partition from now on: what another partition
        held of it moves along (partitions added to the joined topic rehash a key), so a
        series keeps one ring and a model one clock."""
        if model in st.models:
            return
        for _, other in self._held():
            if model in other.models and other is not st:
                other.models.discard(model)
                for k in [k for k in other.rings if k[0] == model]:
                    st.rings[k] = other.rings.pop(k)
                for mark in [k for k in other.seen if k[0] == model]:
                    st.seen[mark] = other.seen.pop(mark)
                if model in other.nows:
                    st.nows[model] = other.nows.pop(model)
        st.models.add(model)

    def _take(self, st: PartitionState, b: JoinedBatch) -> bool:
        part = b.part[0]
        marks = [(tp, (to, part)) for tp, (_f, to) in b.source.items()
                 if (to, part) > st.seen.get((b.model, *tp), (-1, 0))]
        if b.source and not marks:
            self.duplicates += 1
            return False
        for tp, mark in marks:
            st.seen[(b.model, *tp)] = mark
        if math.isfinite(b.now):
            st.nows[b.model] = max(st.nows.get(b.model, -math.inf), b.now)
        for s in b.series:
            ring = st.rings.get((b.model, s.segment))
            if ring is None or ring.classes != s.classes:
                ring = st.rings[(b.model, s.segment)] = Ring(self.capacity, s.classes)
            x = s.samples
            before = ring.total
            ring.extend(x.ts, x.label, x.kind, x.score)
            ring.total = before + s.added  # samples the sender's ring lost count too
            self.accepted += len(x)
        return True

    # ------------------------------------------------------------ readers

    def partition_of(self, model: str) -> int | None:
        """The owned joined-topic partition ``model`` is keyed to (its publishes go
        through that partition's producer); None when no owned partition has it."""
        with self.lock:
            return next((p for p, st in self.parts.items() if model in st.models), None)

    def _partition_of(self) -> dict[str, int]:
        return {m: p for p, st in self._held() for m in st.models}

    def _held(self) -> list[tuple[int, PartitionState]]:
        """Every partition state, owned or set aside (what a checkpoint keeps)."""
        return sorted([*self.parts.items(), *self.aside.items()], key=lambda kv: kv[0])

    def _series_count(self) -> int:
        return sum(len(st.rings) for _, st in self._held())

    @property
    def offsets(self) -> dict[int, int]:
        """Joined-topic partition -> the next offset to read, of the partitions read."""
        with self.lock:
            return {p: st.offset for p, st in self._held() if st.offset is not None}

    def offset(self, partition: int) -> int | None:
        """Where reading ``partition`` goes on (None: from its start)."""
        with self.lock:
            st = self.parts.get(partition) or self.aside.get(partition)
            return None if st is None else st.offset

    def models(self, partitions: Iterable[int] | None = None) -> list[str]:
        """Models keyed to ``partitions`` (all held when None)."""
        with self.lock:
            keep = None if partitions is None else set(partitions)
            return sorted({m for p, st in self._held() if keep is None or p in keep
                           for m in st.models})

    def _ring(self, model: str, segment: str) -> Ring | None:
        for _, st in self._held():
            ring = st.rings.get((model, segment))
            if ring is not None:
                return ring
        return None

    def samples_of(self, model: str, segment: str, last: int | None = None
                   ) -> SampleSet | None:
        with self.lock:
            ring = self._ring(model, segment)
            return None if ring is None else ring.samples(last)

    def series(self, model: str) -> list[tuple[str, str]]:
        with self.lock:
            return sorted(k for _, st in self._held() for k in st.rings if k[0] == model)

    def series_of(self, partitions: Iterable[int] | None = None) -> list[tuple[str, str]]:
        """Every series of the models keyed to ``partitions`` (all: None)."""
        return [k for model in self.models(partitions) for k in self.series(model)]

    def check(self, partitions: Iterable[int] | None = None) -> list[Event]:
        """One policy check of the models of ``partitions`` (the tests' form: the
        running owner checks through its ``recal.driver.Driver``)."""
        return self.policy.check_each(self.now_of, self.series_of(partitions),
                                      self.samples_of)

    def now_of(self, model: str) -> float:
        """The model's event time: the largest its senders reported (-inf if none)."""
        with self.lock:
            return max((st.nows[model] for _, st in self._held() if model in st.nows),
                       default=-math.inf)

    def sample_count(self, model: str) -> int:
        """Samples the owner took for a model (its ``__all__`` ring's total)."""
        with self.lock:
            ring = self._ring(model, ALL)
            return 0 if ring is None else ring.total

    # ------------------------------------------------------------ state

    def snapshot(self) -> dict[str, Any]:
        with self.lock:
            held = self._held()
            return {
                "rings": sorted([m, s, r.snapshot()] for _, st in held
                                for (m, s), r in st.rings.items()),
                "seen": sorted([m, t, p, o, i] for _, st in held
                               for (m, t, p), (o, i) in st.seen.items()),
                "nows": sorted([m, t] for _, st in held for m, t in st.nows.items()
                               if math.isfinite(t)),
                "partition_of": sorted([m, p] for p, st in held for m in st.models),
                "offsets": [[p, st.offset] for p, st in held if st.offset is not None],
                "policy": self.policy.snapshot(),
            }

    def restore(self, snap: Mapping[str, Any]) -> None:
        """The checkpoint's partitions, set aside until the first assignment says which
        are this owner's."""
        with self.lock:
            states: dict[int, PartitionState] = {}
            where: dict[str, int] = {}
            for m, p in snap.get("partition_of", []):
                if self.checks.names_ok(str(m), ALL):
                    where[str(m)] = int(p)
                    states.setdefault(int(p), PartitionState()).models.add(str(m))
            for p, o in snap.get("offsets", []):
                states.setdefault(int(p), PartitionState()).offset = int(o)
            # series a checkpoint of an older release took from a malformed batch
            # are dropped, not served: a restart recovers from one
            dropped = 0
            for m, s, r in snap.get("rings", []):
                if not self.checks.names_ok(str(m), str(s)):
                    dropped += 1
                elif str(m) in where:
                    states[where[str(m)]].rings[(str(m), str(s))] = Ring.restore(
                        self.capacity, r)
            if dropped:
                log.warning("dropping %d series of the checkpoint whose names the batch "
                            "checks refuse", dropped)
            for e in snap.get("seen", []):  # [m, t, p, to] before parts were numbered
                at = states.get(where.get(str(e[0]), -1))
                if at is not None:
                    at.seen[(str(e[0]), str(e[1]), int(e[2]))] = (
                        int(e[3]), int(e[4]) if len(e) > 4 else 0)
            for m, t in snap.get("nows", []):
                at = states.get(where.get(str(m), -1))
                if at is not None:
                    at.nows[str(m)] = float(t)
            self.parts, self.aside = {}, states
            if isinstance(snap.get("policy"), dict):
                self.policy.restore(snap["policy"])
