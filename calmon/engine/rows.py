"""What readers of the statistics get: one ``Row`` per (model, segment, window), and
the immutable ``Snapshot`` of all of them that ``calmon.engine.snapshot.Refresher``
builds and /metrics, /reliability, /status, ``replay`` and its report render."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

from calmon.engine import metrics
from calmon.engine.estimates import Estimates
from calmon.engine.metrics import Stats


@dataclass(frozen=True)
class WorstClass:
    """The class whose one-vs-rest calibration (p_k against [y = k]) is worst in a window."""

    cls: int
    ece: float
    bins: metrics.Bins


@dataclass(frozen=True)
class Row:
    model: str
    segment: str
    window: str
    binary: bool
    stats: Stats
    classwise_ece: float | None = None  # multiclass models, with metrics.classwise
    estimates: Estimates = field(default_factory=Estimates)  # before the labels
    worst_class: WorstClass | None = None  # with classwise_ece: for /reliability


@dataclass(frozen=True)
class Snapshot:
    """The rows and counters as of engine ``version``, with the age of the expensive
    statistics they carry."""

    now: float
    rows: list[Row]
    counters: dict[str, int]
    pending: int
    pending_labels: int
    series: list[tuple[str, str]]  # series id -> (model, segment); ("", "") when free
    version: int
    series_held: int = 0  # (model, segment) series held (limits.max_series)
    built_at: float = 0.0  # wall time it was built
    # wall time the oldest expensive statistics it carries were computed (the start of
    # the last completed refresh round); None when all of them match the counts
    stale_since: float | None = None
    serial: int = 0  # increases with every snapshot a refresher builds (a cache key)
    series_errors: int = 0  # series a refresh skipped because computing them raised

    def age(self, now: float) -> float:
        """How old the expensive statistics served are at wall time ``now``."""
        return 0.0 if self.stale_since is None else max(0.0, now - self.stale_since)

    @cached_property
    def by_series(self) -> dict[tuple[str, str], list[Row]]:
        """(model, segment) -> its rows, one per window."""
        out: dict[tuple[str, str], list[Row]] = {}
        for r in self.rows:
            out.setdefault((r.model, r.segment), []).append(r)
        return out

    @cached_property
    def estimate_bases(self) -> dict[str, dict[str, dict[str, float | int | str | None]]]:
        """/status ``estimates`` (contract section 4): model -> segment -> what its
        label-free estimates are read through (one per series: every window shares it)."""
        out: dict[str, dict[str, dict[str, float | int | str | None]]] = {}
        for r in self.rows:
            e = r.estimates
            out.setdefault(r.model, {}).setdefault(r.segment, {
                "basis": e.estimate_basis, "fit_samples": e.estimate_fit_samples,
                "fit_newest_ts": e.estimate_fit_newest_ts})
        return out


def empty(built_at: float = 0.0) -> Snapshot:
    """The snapshot of an engine nothing was read of yet."""
    return Snapshot(-float("inf"), [], {}, 0, 0, [], -1, built_at=built_at)
