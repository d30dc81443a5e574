"""What an owner checks of a joined batch before any of it reaches a ring, a clock, a
mark or a checkpoint (contract §1 and §7): the joined topic is an input too.

Every field is held to the rules and ``limits.*`` an input record is held to, under the
same reasons (``calmon_invalid_records_total{topic=<joined topic>, reason}``):
names (a model, a segment) as safe names, class counts, score kinds, scores, labels and
event times per sample (vectorised: a batch of 50,000 samples is a few numpy passes).
Then the record's place: its Kafka key is its model, the model hashes to the partition
it came on (a signed batch replayed onto another partition is refused), and its source
lies on an input partition its sender reads, below that partition's end (one forged
offset of 2**62 would mark every later batch of the model as a copy).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from typing import Final

import numpy as np

from calmon.cluster.batch import JoinedBatch, Series
from calmon.config import Config
from calmon.engine.records import PROBS_TOLERANCE, TS_MAX, TS_MIN
from calmon.names import ALL, ScoreKind

# the reasons a joined-topic record is refused under: an input record's where they
# mean the same, and the ones only the joined topic has
JOINED_REASONS: Final = (
    "bad_batch",  # not a joined batch: magic, lengths, header, types
    "not_utf8", "bad_model", "bad_segment", "too_many_models", "too_many_classes",
    "bad_score", "not_finite", "prob_out_of_range", "probs_not_normalized",
    "label_out_of_range", "bad_ts",
    "bad_source",  # a source range no sender of this fleet could have read
    "bad_key",  # the Kafka key is not the model, or the model is not this partition's
    "bad_signature",  # unsigned, forged, or signed by an unknown key (signing on)
)
NAME_CONTROL = str.maketrans("", "", "".join(
    [chr(c) for c in range(0x20)] + [chr(c) for c in range(0x7f, 0xa0)] + ["\u2028",
                                                                           "\u2029"]))


LOG_INTERVAL_S = 60.0


class LogOnce:
    """Whether a refusal is logged: at most once per reason a minute (contract §1), so a
    flood of hostile records is counted, not written out line by line."""

    def __init__(self) -> None:
        self._last: dict[str, float] = {}

    def __call__(self, reason: str) -> bool:
        now = time.monotonic()
        if now - self._last.get(reason, -math.inf) < LOG_INTERVAL_S:
            return False
        self._last[reason] = now
        return True


class Refused(ValueError):
    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def _name(v: str, max_bytes: int, reason: str) -> None:
    try:
        raw = v.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate from a \udXXX escape
        raise Refused("not_utf8", f"{reason}: a lone surrogate") from None
    if not raw or len(raw) > max_bytes:
        raise Refused(reason, f"{reason}: empty or over {max_bytes} bytes")
    if len(v.translate(NAME_CONTROL)) != len(v):
        raise Refused(reason, f"{reason}: control characters")


class BatchChecks:
    """The checks of one owner, from its config (limits, slices, the fleet's shape)."""

    def __init__(self, cfg: Config) -> None:
        lim = cfg.limits
        self.max_name = lim.max_name_bytes
        self.max_classes = lim.max_classes
        count = cfg.kafka.static.count if cfg.kafka.static is not None else 1
        self.count = count
        # an owner holds models and series of every instance: each admits up to the limit
        self.max_models = lim.max_models * count
        self.max_series = lim.max_series * count
        # a segment series is "k1=v1,k2=v2" over one configured slice
        self.max_segment = max((sum(len(k.encode()) + 2 + self.max_name for k in sl)
                                for sl in cfg.segments.slices if sl), default=0)
        self.inputs = {cfg.kafka.predictions_topic, cfg.kafka.labels_topic}

    def fields(self, b: JoinedBatch) -> None:
        """Refused unless every field of ``b`` is one an instance could have sent."""
        _name(b.model, self.max_name, "bad_model")
        if not (math.isfinite(b.now) and TS_MIN <= b.now <= TS_MAX) and b.now != -math.inf:
            raise Refused("bad_ts", "now out of range")
        i, n = b.part
        if not 0 <= i < n:
            raise Refused("bad_batch", f"part {i} of {n}")
        seen: set[str] = set()
        for s in b.series:
            if s.segment in seen:
                raise Refused("bad_segment", "a segment twice in one batch")
            seen.add(s.segment)
            self.series(s)

    def names_ok(self, model: str, segment: str) -> bool:
        """Whether a (model, segment) a checkpoint holds is one the checks admit (a
        checkpoint written before them may hold any)."""
        try:
            _name(model, self.max_name, "bad_model")
            if segment != ALL:
                _name(segment, self.max_segment, "bad_segment")
        except Refused:
            return False
        return True

    def series(self, s: Series) -> None:
        if s.segment != ALL:
            _name(s.segment, self.max_segment, "bad_segment")
            if "=" not in s.segment:
                raise Refused("bad_segment", "a segment series is key=value")
        k, x = s.classes, s.samples
        if k > self.max_classes:
            raise Refused("too_many_classes", f"{k} classes")
        if not len(x):
            return
        if not (np.isfinite(x.ts).all() and x.ts.min() >= TS_MIN and x.ts.max() <= TS_MAX):
            raise Refused("bad_ts", "a sample time out of range")
        kinds = ((int(ScoreKind.PROB), int(ScoreKind.LOGIT)) if k == 0 else
                 (int(ScoreKind.PROBS), int(ScoreKind.LOGITS)))
        if not np.isin(x.kind, kinds).all():
            raise Refused("bad_score", "a score kind that does not fit the series")
        if x.label.min() < 0 or x.label.max() >= max(k, 2):
            raise Refused("label_out_of_range", "a label out of range")
        if not np.isfinite(x.score).all():
            raise Refused("not_finite", "a score is not finite")
        probs = x.kind == (int(ScoreKind.PROB) if k == 0 else int(ScoreKind.PROBS))
        p = x.score[probs]
        if p.size and (p.min() < 0.0 or p.max() > 1.0):
            raise Refused("prob_out_of_range", "a probability outside [0, 1]")
        if k and p.size and (np.abs(p.sum(axis=1) - 1.0) > PROBS_TOLERANCE).any():
            raise Refused("probs_not_normalized", "class probabilities do not sum to 1")

    def place(self, b: JoinedBatch, key: bytes | None, partition: int,
              partitions: int | None) -> None:
        """The record's key is its model, and the model is this partition's."""
        if key != b.model.encode("utf-8"):
            raise Refused("bad_key", "the Kafka key is not the batch's model")
        if partitions and partition_of(key, partitions) != partition:
            raise Refused("bad_key", f"model {b.model!r} does not hash to partition "
                                     f"{partition} (a record replayed onto another one)")

    def source(self, b: JoinedBatch, end: Callable[[str, int, int], int | None]) -> None:
        """Each source range lies on an input partition the sender reads, and ends at
        most at that partition's end (``end``: None when it cannot be told)."""
        if not 0 <= b.sender < self.count:
            raise Refused("bad_source", f"sender {b.sender} is not an instance")
        for (topic, part), (lo, hi) in b.source.items():
            if topic not in self.inputs or part < 0 or part % self.count != b.sender:
                raise Refused("bad_source", f"{topic}/{part} is not read by sender "
                                            f"{b.sender}")
            if not 0 <= lo <= hi:
                raise Refused("bad_source", f"range [{lo}, {hi}) of {topic}/{part}")
            top = end(topic, part, hi)
            if top is not None and hi > top:
                raise Refused("bad_source", f"offset {hi} of {topic}/{part} is past its "
                                            f"end {top}")


def partition_of(key: bytes, partitions: int) -> int:
    """The partition kafka-python's default partitioner gives ``key`` (what the
    sender's ``JoinedProducer`` and ``calibrators rollback`` use)."""
    from kafka.partitioner.default import murmur2

    return int(murmur2(key) & 0x7FFFFFFF) % partitions


def new_models(b: JoinedBatch, known: Mapping[str, object], series: int,
               checks: BatchChecks, has: Callable[[str, str], bool]) -> None:
    """Past the owner's bounds a new model or series is refused (memory stays bounded)."""
    if b.model not in known and len(known) >= checks.max_models:
        raise Refused("too_many_models", f"model {b.model!r} past {checks.max_models}")
    fresh = sum(not has(b.model, s.segment) for s in b.series)
    if fresh and series + fresh > checks.max_series:
        raise Refused("bad_segment", f"series past {checks.max_series}")
