"""What the join hands over and is handed, as columns: ``Joined`` (samples that met their
label), ``BatchColumns`` (a batch's predictions), ``JoinEvents`` (what one batch did)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from calmon.engine.records import Label


class Joined(NamedTuple):
    """Samples that met their label (or implicit negative), as columns."""

    combo: np.ndarray  # int64
    ts: np.ndarray
    kind: np.ndarray  # int64, int(ScoreKind)
    score: np.ndarray  # binary score as given; 0 for K-class rows
    label: np.ndarray  # int64
    label_ts: np.ndarray  # NaN where the label had no time
    decision: np.ndarray  # v5: int64, the prediction's decision (-1: none given)
    vectors: dict[int, tuple[np.ndarray, np.ndarray]]  # K -> (rows, (m, K) scores as given)

    def __len__(self) -> int:
        return len(self.ts)

    def take(self, rows: np.ndarray) -> Joined:
        """The samples ``rows`` (sorted indices), in order."""
        vectors = {}
        for k, (idx, mat) in self.vectors.items():
            keep = np.isin(idx, rows)
            if keep.any():
                vectors[k] = (np.searchsorted(rows, idx[keep]), mat[keep])
        return Joined(self.combo[rows], self.ts[rows], self.kind[rows], self.score[rows],
                      self.label[rows], self.label_ts[rows], self.decision[rows], vectors)


def concat(parts: list[Joined]) -> Joined:
    parts = [p for p in parts if len(p)]
    if not parts:
        return EMPTY
    if len(parts) == 1:
        return parts[0]
    vectors: dict[int, list[tuple[np.ndarray, np.ndarray]]] = {}
    at = 0
    for p in parts:
        for k, (idx, mat) in p.vectors.items():
            vectors.setdefault(k, []).append((idx + at, mat))
        at += len(p)
    cols = [np.concatenate([getattr(p, f) for p in parts]) for f in Joined._fields[:-1]]
    return Joined(cols[0], cols[1], cols[2], cols[3], cols[4], cols[5], cols[6],
                  {k: (np.concatenate([i for i, _ in v]), np.concatenate([m for _, m in v]))
                   for k, v in vectors.items()})


_E = np.zeros(0)


_EI = np.zeros(0, np.int64)


EMPTY = Joined(_EI, _E, _EI, _E, _EI, _E, _EI, {})


class BatchColumns(NamedTuple):
    """The batch's predictions as numpy columns, by prediction ordinal."""

    ts: np.ndarray
    kind: np.ndarray  # int64
    score: np.ndarray
    combo: np.ndarray  # int64; -1 where the prediction was not admitted
    vectors: dict[int, np.ndarray]  # ordinal -> K-class row
    decision: np.ndarray = _EI  # v5: int64, -1 where the prediction gave none


@dataclass
class JoinEvents:
    """What one batch did, for the engine's counters. Sources (``src``) name a
    prediction: a slot (>= 0) or ``-(p + 1)`` for prediction ``p`` of this batch."""

    joined: Joined = EMPTY
    met: np.ndarray = field(default_factory=lambda: _EI)  # combos of labels that met one
    waiting: list[int] = field(default_factory=list)  # ordinals of labels that did not
    out_of_range: list[int] = field(default_factory=list)  # ordinals of such labels
    rejected_labels: list[Label] = field(default_factory=list)  # out of range at the meeting
    duplicate_predictions: int = 0
    duplicate_labels: int = 0
    expired: Counter[tuple[int, str]] = field(default_factory=Counter)  # (combo, reason)
    labels_expired: int = 0
    dups: list[int] = field(default_factory=list)  # ordinals of duplicate predictions
    # ordinals of admitted predictions that were not duplicates (set by ``finish``)
    arrivals: np.ndarray = field(default_factory=lambda: _EI)


_NO_BATCH = BatchColumns(_E, _EI, _E, _EI, {})
