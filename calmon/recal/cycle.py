"""Cycles (issue 34 point 5): a series whose calibration swings with a seasonal cycle
of its inputs (calibrated at night, over-confident in the afternoon, say) must not be
refitted on one phase and rolled back on the other, day after day.

Alternation is what shows it: a rollback to the calibrator that was live two publishes
before (the identity at night, then the afternoon fit again the next morning). Once
``ALTERNATIONS`` of the series' last ``HISTORY`` publishes are such rollbacks, the series
is cyclic: its refits fit, and its rollback candidates are judged on, every labelled
sample predicted in the last ``recalibration.window`` (which should cover one seasonal
cycle: the README says so), the union of the phases, not the post-change samples of
one phase. The gate's folds and holdout are then blocks of ``window / BLOCKS`` dealt
round-robin (calmon.recal.refit ``interleave``), so no fit on the night is judged on
the afternoon; and a refit is not held for a moved score distribution (the cycle moves
it by design). A calibrator fitted on the whole cycle then stays: a fit on the next
cycle is no better, and the phases' own calibrators lose to it over a cycle.

Derived from the registry's documents each time (a restart, or a rollback by the CLI,
sees the same history), read only when a refit or rollback is due, cached by the
series' newest version.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from calmon.engine.buffer import SampleSet
from calmon.errors import CalibratorError
from calmon.recal.registry import Registry

ALTERNATIONS = 2  # rollbacks to the calibrator live two publishes before: "more than once"
HISTORY = 8  # publishes looked back over
BLOCKS = 24  # interleaved blocks a cycle is cut in for the gate (an hour of a day)


def _content(doc: dict[str, Any] | None) -> str:
    """What a document serves (method, input and parameters); the identity for none."""
    if doc is None or doc.get("method") == "identity":
        return "identity"
    return json.dumps([doc.get("method"), doc.get("input"), doc.get("params")],
                      sort_keys=True)


def alternations(docs: dict[int, dict[str, Any] | None], versions: list[int]) -> int:
    """How many of ``versions`` are rollbacks to the calibrator live two publishes
    before them (version v - 2; the identity before version 1). ``docs``: version ->
    document (None: unreadable, matching nothing)."""
    count = 0
    for v in versions:
        doc = docs.get(v)
        if doc is None or doc.get("trigger") != "rollback":
            continue
        if v - 2 < 1:
            before: dict[str, Any] | None = None  # nothing live yet: the identity
        elif docs.get(v - 2) is None:
            continue
        else:
            before = docs[v - 2]
        if _content(doc) == _content(before):
            count += 1
    return count


class Cycles:
    """Which series alternate, per the registry (cached by newest version)."""

    def __init__(self, registry: Registry) -> None:
        self.registry = registry
        self._cache: dict[tuple[str, str], tuple[int, bool]] = {}

    def cyclic(self, model: str, segment: str) -> bool:
        versions = sorted(self.registry.versions(model, segment))[-HISTORY:]
        if len(versions) < 2 * ALTERNATIONS - 1:
            return False
        cached = self._cache.get((model, segment))
        if cached is not None and cached[0] == versions[-1]:
            return cached[1]
        docs: dict[int, dict[str, Any] | None] = {}
        for v in range(max(1, versions[0] - 2), versions[-1] + 1):
            try:
                docs[v] = self.registry.read(model, segment, v)
            except (CalibratorError, OSError, ValueError):
                docs[v] = None
        out = alternations(docs, versions) >= ALTERNATIONS
        self._cache[(model, segment)] = (versions[-1], out)
        return out


def cycle_samples(every: SampleSet, until: float, span: float) -> SampleSet:
    """The labelled samples predicted in the ``span`` before ``until`` (one cycle)."""
    return every.select((every.ts > until - span) & (every.ts <= until))


def block(span: float) -> float:
    """The gate's interleaved block for a cycle of ``span`` seconds."""
    return float(np.float64(span) / BLOCKS)
