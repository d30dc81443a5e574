"""One poll's records, decoded and validated, as columns: what the engine consumes.

The engine's per-record loop reads plain Python lists by position (the cheapest
read there is) and hands whole columns to numpy; no object per record is built
for the common case. ``kinds`` keeps the batch order: record i of the batch is
the next prediction, the next label or the next rejected record, so the join
still sees predictions and labels interleaved exactly as they arrived.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field

import numpy as np

from calmon.engine.decisions import NAMED
from calmon.engine.records import MULTICLASS, SCORE_KINDS, Label, Prediction, Reject

PRED, LABEL, REJECT = 0, 1, 2  # the values of Parsed.kinds
KIND_CODE = {k: i for i, k in enumerate(SCORE_KINDS)}  # field name -> int(ScoreKind)


@dataclass(slots=True, eq=False)
class Parsed:
    kinds: list[int] = field(default_factory=list)  # per record: PRED, LABEL or REJECT
    reasons: list[str] = field(default_factory=list)  # of the REJECT records, in order
    # predictions, in batch order
    p_id: list[str] = field(default_factory=list)
    p_model: list[str] = field(default_factory=list)
    p_ts: list[float] = field(default_factory=list)
    p_segment: list[dict[str, str]] = field(default_factory=list)
    # a hashable spelling of the segment: equal keys always mean equal segments (the
    # engine memoises segment -> combo on it; the raw JSON bytes do, or the items)
    p_segkey: list[Hashable] = field(default_factory=list)
    p_kind: list[int] = field(default_factory=list)  # int(ScoreKind)
    p_classes: list[int] = field(default_factory=list)  # 0 binary, K for K-class
    p_score: list[float] = field(default_factory=list)  # binary score as given; 0.0 for K-class
    p_vec: dict[int, np.ndarray] = field(default_factory=dict)  # ordinal -> K-class row
    p_decision: list[int] = field(default_factory=list)  # v5: class index, or NONE (-1)
    # labels, in batch order
    l_id: list[str] = field(default_factory=list)
    l_label: list[int] = field(default_factory=list)  # NAMED (-1) for a class name:
    l_name: dict[int, str] = field(default_factory=dict)  # v5: ordinal -> that name
    l_ts: list[float | None] = field(default_factory=list)
    l_model: list[str | None] = field(default_factory=list)
    l_raw: list[bytes | None] = field(default_factory=list)
    l_source: list[str | None] = field(default_factory=list)  # None: ask source_of
    # the source of record i of the batch, for labels whose source was not made up front
    source_of: Callable[[int], str] | None = None
    _label_index: list[int] | None = None  # batch index of each label, made when needed

    def __len__(self) -> int:
        return len(self.kinds)

    def add(self, rec: Prediction | Label | Reject) -> None:
        """Append one record parsed the slow way (``Parser.parse``)."""
        if type(rec) is Prediction:
            self.kinds.append(PRED)
            self.p_id.append(rec.id)
            self.p_model.append(rec.model)
            self.p_ts.append(rec.ts)
            self.p_segment.append(rec.segment)
            self.p_segkey.append(tuple(rec.segment.items()))
            code = KIND_CODE[rec.kind]
            self.p_kind.append(code)
            if code < MULTICLASS:
                self.p_classes.append(0)
                self.p_score.append(rec.score)
            else:
                self.p_vec[len(self.p_score)] = np.asarray(rec.score, np.float64)
                self.p_classes.append(len(rec.score))
                self.p_score.append(0.0)
            self.p_decision.append(rec.decision)
        elif type(rec) is Label:
            self.kinds.append(LABEL)
            self.l_id.append(rec.id)
            if isinstance(rec.label, str):
                self.l_name[len(self.l_label)] = rec.label
                self.l_label.append(NAMED)
            else:
                self.l_label.append(rec.label)
            self.l_ts.append(rec.ts)
            self.l_model.append(rec.model)
            self.l_raw.append(rec.raw)
            self.l_source.append(rec.source)
        else:
            assert type(rec) is Reject
            self.kinds.append(REJECT)
            self.reasons.append(rec.reason)

    @classmethod
    def from_records(cls, records: Iterable[Prediction | Label | Reject]) -> Parsed:
        out = cls()
        for rec in records:
            out.add(rec)
        return out

    def label(self, q: int) -> Label:
        """Label ``q`` as an object (built only for labels that wait or are rejected)."""
        source = self.l_source[q]
        if source is None:
            source = self.source_of(self._label_at(q)) if self.source_of is not None else ""
        return Label(self.l_id[q], self.l_name.get(q, self.l_label[q]), self.l_ts[q],
                     self.l_model[q], self.l_raw[q], source)

    def _label_at(self, q: int) -> int:
        """The batch index of label ``q``."""
        if self._label_index is None:
            self._label_index = [i for i, k in enumerate(self.kinds) if k == LABEL]
        return self._label_index[q]

    def same(self, other: Parsed) -> bool:
        """Equal records (segment keys aside: two parsers may spell them differently,
        each consistently). For tests of one parser against another."""
        plain = ("kinds", "reasons", "p_id", "p_model", "p_ts", "p_segment", "p_kind",
                 "p_classes", "p_score", "p_decision", "l_id", "l_label", "l_name", "l_ts",
                 "l_model", "l_raw", "l_source")
        if any(getattr(self, f) != getattr(other, f) for f in plain):
            return False
        return (self.p_vec.keys() == other.p_vec.keys()
                and all(np.array_equal(v, other.p_vec[k]) for k, v in self.p_vec.items()))
