"""The read interface the engine publishes (``Reading``): copies and immutable values
only, under the engine's lock: ``read_state``, ``window_sums``, ``pending_counts``,
``estimates`` (what ``calmon.engine.snapshot`` builds its ``Snapshot`` from: ``Reads``,
which ``summed.SummedEngine`` also implements over several engines, from the smaller
reads below them: ``class_sums``, ``bucket_samples``, ``totals``, ``score_counts``,
the series, class counts and live calibrators), ``changes_since``, and ``samples`` /
``buffered_series`` for the recalibration."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Protocol

import numpy as np

from calmon.config import Config
from calmon.engine import metrics
from calmon.engine.buffer import SampleSet
from calmon.engine.enginestate import EngineState
from calmon.engine.estimates import Estimates
from calmon.engine.estimating import Live, PendingCounts, pending_sums, series_estimates
from calmon.engine.forgotten import Cursor, Taking
from calmon.engine.rows import WorstClass
from calmon.engine.windows import CONF_SCALE, Layout


@dataclass(frozen=True)
class ReadState:
    """What a reader of the statistics needs of the engine as of one ``version``
    (``Engine.read_state``): plain values and read-only arrays, never the engine's own."""

    version: int
    now: float
    counters: Mapping[str, int]
    pending: int
    pending_labels: int
    series: tuple[tuple[str, str], ...]  # series id -> (model, segment); ("", "") when free
    with_data: frozenset[int]  # series holding window sums or score histograms
    binary: tuple[bool, ...]  # by series id: its model is binary (free series: True)
    nows: np.ndarray  # each series' model's now, by series id (the windows slide on it)
    current: np.ndarray  # (windows, series): the bucket holding each series' now
    changed: frozenset[int] | None  # series whose sums changed after ``since``; None: all

    @property
    def windows(self) -> int:
        return len(self.current)


@dataclass(frozen=True)
class WindowSums:
    """One (series, window) row's summed bucket vector (see ``windows.Layout``; None when
    the window holds nothing), and for a multiclass model's row with samples its
    classwise ECE and worst class (with ``metrics.classwise``)."""

    vec: np.ndarray | None
    classwise_ece: float | None = None
    worst_class: WorstClass | None = None


class Reads(Protocol):
    """The read interface ``snapshot.Refresher`` builds its snapshots from: an engine's
    (``Reading``), or several engines' read as one (``summed.SummedEngine``)."""

    @property
    def cfg(self) -> Config: ...

    @property
    def version(self) -> int: ...

    @property
    def layout(self) -> Layout: ...

    def forgotten_cursor(self) -> Taking: ...

    def read_state(self, since: int) -> ReadState: ...

    def window_sums(self, keys: Sequence[tuple[int, int]], nows: np.ndarray | None = None,
                    *, classwise: bool = True) -> tuple[WindowSums, ...]: ...

    def pending_counts(self, nows: np.ndarray) -> PendingCounts: ...

    def estimates(self, sids: Sequence[int], pending: PendingCounts,
                  nows: np.ndarray) -> Mapping[tuple[int, int], Estimates]: ...


class Reading(EngineState):
    """What readers of the engine call."""

    @property
    def layout(self) -> Layout:
        """How a window's summed vector is laid out."""
        return self.windows.layout

    def changes_since(self, version: int) -> frozenset[int] | None:
        """The series whose window sums changed in a feed after ``version`` (None: all of
        them may have, the state was restored since). The engine keeps this record; any
        number of readers may ask it, each from the version it last read."""
        with self.lock:
            if version < self._all_changed_at:
                return None
            return frozenset(np.flatnonzero(self._changed_at > version).tolist())

    def read_state(self, since: int) -> ReadState:
        """The counters, series and clocks of the current version, with the series
        changed after version ``since``. Buckets that slid out of their windows go first."""
        with self.lock:
            self._evict()
            nows = self._series_nows()
            nows.flags.writeable = False
            widths = self.windows.widths
            current = (np.stack([self.windows.current(w, nows) for w in range(len(widths))])
                       if len(nows) else np.zeros((len(widths), 0), np.int64))
            current.flags.writeable = False
            classes, idx = self.class_counts.classes, self._model_idx
            binary = tuple(m not in idx or classes[idx[m]] == 0 for m, _ in self.index.series)
            return ReadState(self.version, self.now, MappingProxyType(dict(self.counters)),
                             self.join.pending, self.join.pending_labels,
                             tuple(self.index.series),
                             frozenset(self.windows.series() | self.scores.series()),
                             binary, nows, current, self.changes_since(since))

    def window_sums(self, keys: Sequence[tuple[int, int]], nows: np.ndarray | None = None,
                    *, classwise: bool = True) -> tuple[WindowSums, ...]:
        """The sums of these (series id, window index) rows at their series' ``nows``
        (default: as they are now). The caller picks how many rows one call reads: the
        loop thread waits for the lock while they are read."""
        with self.lock:
            if nows is None:
                nows = self._series_nows()
            bins = self.windows.layout.bins
            cw_of = self.classwise is not None and classwise
            out = []
            for sid, w in keys:
                now = float(nows[sid])
                vec = self.windows.totals(sid, w, now)
                cw = worst = None
                if vec is not None:
                    vec.flags.writeable = False
                    if cw_of and not self._binary(sid) and vec[:bins].sum() > 0:
                        assert self.classwise is not None
                        cw, worst = classwise_of(self._class_vectors(sid, w, now),
                                                 self.classwise.layout)
                out.append(WindowSums(vec, cw, worst))
            return tuple(out)

    def class_sums(self, keys: Sequence[tuple[int, int]], nows: np.ndarray
                   ) -> tuple[tuple[np.ndarray | None, ...], ...]:
        """Each (series, window) row's classwise vectors (``metrics.classwise``) at its
        series' ``nows``, by class (None for a class the window holds nothing of):
        what a multiclass row's classwise ECE and worst class are computed from."""
        with self.lock:
            return tuple(self._class_vectors(sid, w, float(nows[sid])) for sid, w in keys)

    def _class_vectors(self, sid: int, w: int, now: float) -> tuple[np.ndarray | None, ...]:
        if self.classwise is None:
            return ()
        cids = (self._class_series.get((sid, c)) for c in range(len(self._classes_of.get(sid, ()))))
        return tuple(None if cid is None else self.classwise.totals(cid, w, now) for cid in cids)

    def pending_counts(self, nows: np.ndarray) -> PendingCounts:
        """(series, window) -> its pending predictions' sums (``estimating.Pending``), the
        windows sliding on ``nows``: one pass over the pending predictions, and a new
        round of the estimation maps."""
        with self.lock:
            self.maps.new_round()
            waiting = self.join.waiting()
            return MappingProxyType(pending_sums(
                waiting, self._models_of(waiting[0]), self.index.fan_out, self.index.series,
                self._model_idx, self._calibrator, self._threshold, self.windows, nows))

    def estimates(self, sids: Sequence[int], pending: PendingCounts,
                  nows: np.ndarray) -> Mapping[tuple[int, int], Estimates]:
        """The label-free estimates and score PSI of every window of these series, from
        ``pending_counts``, the estimation maps and the live calibrators."""
        with self.lock:
            return MappingProxyType(series_estimates(
                self, sids, pending, nows, len(self.windows.widths),
                self.cfg.estimates.calibration == "labelled", self.cfg.metrics.interval_level))

    # ------------------------------------------------------------ what those read

    def forgotten_cursor(self) -> Cursor:
        """A cursor on the journal of the models this engine forgot (``forgotten``)."""
        return self.class_counts.forgotten.cursor()

    def series_name(self, sid: int) -> tuple[str, str]:
        with self.lock:
            return self.index.series[sid]

    def find(self, model: str, segment: str) -> int | None:
        with self.lock:
            return self.index.find(model, segment)

    def is_binary(self, sid: int) -> bool:
        with self.lock:
            return self._binary(sid)

    def class_count(self, model: str) -> int:
        """The model's class count (0: binary), -1 for a model not held."""
        with self.lock:
            midx = self._model_idx.get(model)
            return -1 if midx is None else self.class_counts.classes[midx]

    def calibrator_of(self, model: str, segment: str) -> Live | None:
        """The live calibrator the series' estimates read through: its own, else the
        model's."""
        with self.lock:
            return self._calibrator(model, segment)

    def score_counts(self, sid: int, w: int, now: float, previous: bool) -> np.ndarray:
        """The series' raw-confidence histogram in window ``w`` at ``now`` (``previous``:
        the window just before)."""
        with self.lock:
            return self.scores.counts(sid, w, now, previous)

    def bucket_samples(self, sid: int, w: int, now: float, since: float = -math.inf
                       ) -> tuple[np.ndarray, np.ndarray]:
        """``windows.Windows.bucket_samples`` of one series."""
        with self.lock:
            return self.windows.bucket_samples(sid, w, now, since)

    def totals(self, sid: int, w: int, now: float, first: int | None = None
               ) -> np.ndarray | None:
        """``windows.Windows.totals`` of one series (a copy)."""
        with self.lock:
            return self.windows.totals(sid, w, now, first)

    def samples(self, model: str, segment: str, last: int | None = None) -> SampleSet | None:
        """A copy of the recent joined samples of one series (None without a buffer);
        only the newest ``last`` when given."""
        with self.lock:
            sid = self.index.find(model, segment)
            if self.buffers is None or sid is None:
                return None
            return self.buffers.samples(sid, last)

    def buffered_generation(self) -> int:
        """Moves whenever a series gains or loses its sample buffer (what
        ``buffered_series`` lists), so a caller may keep that list until it does."""
        with self.lock:
            return -1 if self.buffers is None else self.buffers.generation

    def buffered_series(self) -> list[tuple[str, str, int]]:
        """(model, segment, classes) of every series with a sample buffer."""
        with self.lock:
            if self.buffers is None:
                return []
            out = []
            for sid in sorted(self.buffers.rings):
                model, segment = self.index.series[sid]
                if model in self._model_idx:  # a freed series has no model
                    out.append((model, segment, self.class_counts.classes[self._model_idx[model]]))
            return out


def classwise_of(vecs: Sequence[np.ndarray | None], lay: Layout
                 ) -> tuple[float | None, WorstClass | None]:
    """A multiclass row's classwise ECE, the mean over classes of the ECE of p_k against
    [y = k] (Kull et al. 2019), and its worst class (largest such ECE), from each
    class's window vector (``Reading.class_sums``)."""
    values = []
    worst: WorstClass | None = None
    for c, vec in enumerate(vecs):
        if vec is None:
            continue
        b = metrics.Bins(vec[lay.count:lay.count + lay.bins],
                         vec[lay.conf:lay.conf + lay.bins] / CONF_SCALE,
                         vec[lay.correct:lay.correct + lay.bins])
        if b.count.sum() > 0:
            value = metrics.ece(b.count, b.conf, b.correct)
            values.append(value)
            if worst is None or value > worst.ece:
                worst = WorstClass(c, value, b)
    return (float(np.mean(values)) if values else None), worst
