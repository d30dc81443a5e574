"""The read interface the engine publishes (``Reading``): copies and immutable values
only, under the engine's lock: ``read_state``, ``window_sums``, ``pending_counts``,
``estimates`` (what ``calmon.engine.snapshot`` builds its ``Snapshot`` from),
``changes_since``, and ``samples`` / ``buffered_series`` for the recalibration."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np

from calmon.engine import metrics
from calmon.engine.buffer import SampleSet
from calmon.engine.enginestate import EngineState
from calmon.engine.estimates import Estimates
from calmon.engine.estimating import PendingCounts, estimate, pending_sums, score_psi
from calmon.engine.rows import WorstClass
from calmon.engine.series import ALL
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
                        cw = self._classwise_ece(sid, w, now)
                        worst = self._worst_class(sid, w, now) if cw is not None else None
                out.append(WindowSums(vec, cw, worst))
            return tuple(out)

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
            out: dict[tuple[int, int], Estimates] = {}
            labelled = self.cfg.estimates.calibration == "labelled"
            level = self.cfg.metrics.interval_level
            for sid in sids:
                model, segment = self.index.series[sid]
                live = self._calibrator(model, segment)
                binary = self._binary(sid)
                chosen = None
                if labelled and model:
                    key = (model, segment, self.class_counts.classes[self._model_idx[model]])
                    since = self.changes.get((model, ALL))
                    chosen = self.maps.choose(sid, key, self.changes.get((model, segment), since),
                                              self.index.find(model, ALL), since, nows)
                for w in range(len(self.windows.widths)):
                    psi_ = score_psi(self.scores, sid, w, None if live is None else live[1],
                                     float(nows[sid]))
                    out[(sid, w)] = estimate(pending.get((sid, w)), psi_, chosen,
                                             "raw" if live is None else "live", binary, level)
            return MappingProxyType(out)

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

    def _classwise_ece(self, sid: int, w: int, now: float) -> float | None:
        """Mean over classes of the ECE of p_k against [y = k] (Kull et al. 2019)."""
        assert self.classwise is not None
        lay = self.classwise.layout
        values = []
        for cid in self._classes_of.get(sid, ()):
            vec = self.classwise.totals(cid, w, now)
            if vec is None:
                continue
            count = vec[lay.count:lay.count + lay.bins]
            if count.sum() > 0:
                values.append(metrics.ece(count, vec[lay.conf:lay.conf + lay.bins] / CONF_SCALE,
                                          vec[lay.correct:lay.correct + lay.bins]))
        return float(np.mean(values)) if values else None

    def _worst_class(self, sid: int, w: int, now: float) -> WorstClass | None:
        """The class of largest one-vs-rest ECE in window w, with its bins."""
        assert self.classwise is not None
        lay = self.classwise.layout
        worst: WorstClass | None = None
        for c in range(len(self._classes_of.get(sid, ()))):
            cid = self._class_series.get((sid, c))
            vec = None if cid is None else self.classwise.totals(cid, w, now)
            if vec is None:
                continue
            b = metrics.Bins(vec[lay.count:lay.count + lay.bins],
                             vec[lay.conf:lay.conf + lay.bins] / CONF_SCALE,
                             vec[lay.correct:lay.correct + lay.bins])
            if b.count.sum() > 0:
                value = metrics.ece(b.count, b.conf, b.correct)
                if worst is None or value > worst.ece:
                    worst = WorstClass(c, value, b)
        return worst
