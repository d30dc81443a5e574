"""The engine's state (``EngineState``: what ``Engine.__init__`` sets up) and the small
reads every part of the engine shares: model and series maps, each model's now, the
changed-series record, what a rejected record is."""

from __future__ import annotations

import logging
import math
import threading
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from calmon.config import Config
from calmon.engine.buffer import Buffers
from calmon.engine.classes import ClassCounts
from calmon.engine.decisions import ClassNames
from calmon.engine.delta import Delta
from calmon.engine.estimates import LiveCalibrators, ScoreHist
from calmon.engine.estimating import Maps
from calmon.engine.fastparse import BatchParser
from calmon.engine.join import Join
from calmon.engine.parsed import LABEL, Parsed
from calmon.engine.rawbatch import RawBatch
from calmon.engine.records import Kind
from calmon.engine.series import ALL, SeriesIndex
from calmon.engine.windows import Windows

log = logging.getLogger(__name__)

COUNTER_KEYS = ("predictions", "labels", "joined", "invalid", "expired", "duplicates")
TOPICS = {Kind.PREDICTION: "predictions", Kind.LABEL: "labels"}


@dataclass(frozen=True, slots=True)
class Rejected:
    """A record that broke the contract: what the dead-letter topic receives."""

    kind: Kind
    value: bytes | None
    source: str
    reason: str


def _take(now: float | np.ndarray, rows: np.ndarray) -> float | np.ndarray:
    """``now`` of these rows: a number stays one."""
    return now[rows] if isinstance(now, np.ndarray) else now


class EngineState:
    """The state of an ``Engine`` (see ``calmon.engine.engine``) and its shared reads."""

    def __init__(self, cfg: Config, calibrators: LiveCalibrators | None = None) -> None:
        self.cfg = cfg
        # live calibrators for the label-free estimates; set_calibrators() replaces them
        self.calibrators: LiveCalibrators = calibrators or {}
        self.max_models = cfg.limits.max_models
        self.index = self._new_index()
        self.join = Join(cfg.join)
        self.join.class_index = self._class_index  # v5: labels given as class names
        # a model idle this long on the instance's clock is dropped (contract v3 §2)
        self._idle_after = max(w.seconds for w in cfg.metrics.windows) + cfg.join.ttl
        self._combo_last = np.zeros(0)  # combo -> latest prediction ts (idle segments)
        self._folded_seen = 0
        self.windows = Windows(cfg.metrics.windows, cfg.metrics.bins, cfg.metrics.fine_bins)
        # classwise ECE (metrics.classwise): per (series, class) bins of p_k against [y = k],
        # kept like any series, with a single fine bin since ACE is not asked of them
        self.classwise: Windows | None = (
            Windows(cfg.metrics.windows, cfg.metrics.bins, 1) if cfg.metrics.classwise else None)
        # raw-confidence histograms of every admitted prediction, for score_psi
        self.scores = ScoreHist(cfg.metrics.windows, cfg.metrics.bins)
        self.maps = Maps(cfg.estimates, self.windows)  # v5: the estimation maps
        self.changes: Mapping[tuple[str, str], float] = {}  # set_changes()
        self._class_series: dict[tuple[int, int], int] = {}  # (series, class) -> id
        self._classes_of: dict[int, list[int]] = {}  # series -> its class pseudo-series
        rc = cfg.recalibration
        self.buffers = Buffers(rc.buffer) if rc.enabled else None
        self.models: list[str] = []  # model index -> name ("" while the index is free)
        self._model_idx: dict[str, int] = {}
        self._free_models: list[int] = []  # indices of dropped models, reused first
        self.batch_parser = BatchParser(cfg.fields, cfg.kafka.max_record_bytes, cfg.limits,
                                        cfg.kafka.max_clock_skew, ClassNames.of(cfg))
        # per model counts of this batch's labels that met no prediction, with one more
        # slot at the end, [-1], for "model not known yet"
        self._batch_labels: list[int] = [0]
        # waiting labels whose prediction came later in the same batch, by its model
        self._batch_label_models: Counter[str] = Counter()
        self._combo_model = np.zeros(0, np.int64)  # combo -> model index
        self._series_model = np.zeros(0, np.int64)  # series id -> model index
        self._maps_at = (-1, -1)  # the index generation they were built at
        self._maps_rw = -1  # and its rewrites (SeriesIndex.rewrites; a restore resets _maps_at)
        self._arrivals: list[int] = []  # a batch fed one by one: its arrivals so far
        self.counters: Counter[str] = Counter({k: 0 for k in COUNTER_KEYS})
        self.last_delta = Delta()  # what the last feed did (process counters add it up)
        self.lock = threading.RLock()
        self.version = 0  # bumped by every feed; lets readers cache views
        self._evicted_at = -math.inf
        # the version whose feed last changed each series' window sums (-1: none since
        # the last restore), and the version every series counts as changed from: what
        # a reader asks ``changes_since`` (calmon.engine.snapshot)
        self._changed_at = np.full(0, -1, np.int64)
        self._all_changed_at = 0
        self._stale_classes = False  # a class reset happened: check joins for the old K
        self.class_counts = ClassCounts(max(w.seconds for w in cfg.metrics.windows))

    @property
    def now(self) -> float:
        """The instance's event time: the largest prediction ts of any model."""
        return self.join.clock

    def now_of(self, model: str) -> float:
        """The model's event time: its largest prediction ts (-inf if unknown)."""
        with self.lock:
            midx = self._model_idx.get(model)
            return -math.inf if midx is None else self.join.nows[midx]

    def _new_index(self) -> SeriesIndex:
        return SeriesIndex(self.cfg.segments.slices, self.cfg.segments.max_values,
                           self.cfg.limits.max_series)

    def _rejected(self, b: Parsed, raws: RawBatch | None, i: int, reason: str,
                  kind: Kind | None = None) -> Rejected:
        """Record i of the batch as rejected: counted, and what the dead-letter topic
        receives."""
        if raws is not None:
            raw = raws[i]
            kind_, value, source = raw.kind, raw.value, raw.source
        else:
            kind_ = kind if kind is not None else (
                Kind.LABEL if b.kinds[i] == LABEL else Kind.PREDICTION)
            value, source = None, ""
        self._invalid(kind_, reason)
        return Rejected(kind_, value, source, reason)

    def _invalid(self, kind: Kind, reason: str) -> None:
        self.counters["invalid"] += 1
        self.last_delta.invalid[(TOPICS[kind], reason)] += 1

    def _mark_changed(self, sids: np.ndarray) -> None:
        """These series' window sums change in the feed being run (the next version)."""
        if not len(sids):
            return
        top = int(sids.max()) + 1
        if top > len(self._changed_at):
            grown = np.full(max(top, 2 * len(self._changed_at)), -1, np.int64)
            grown[:len(self._changed_at)] = self._changed_at
            self._changed_at = grown
        self._changed_at[sids] = self.version + 1

    def _maps(self) -> None:
        """combo -> model and series -> model, brought up to date when the index changed:
        the ids added since, or all of them when one was dropped or reused (a model's
        name leaves ``_model_idx`` only with its ids, ``index.drop_model``)."""
        ix = self.index
        at = (ix.generation, len(ix.combos))
        if self._maps_at == at:
            return
        get = self._model_idx.get
        same = self._maps_at != (-1, -1) and self._maps_rw == ix.rewrites
        nc, ns = (len(self._combo_model), len(self._series_model)) if same else (0, 0)
        self._combo_model = np.concatenate((self._combo_model[:nc], np.fromiter(
            (get(m, 0) for m, _ in ix.combos[nc:]), np.int64, len(ix.combos) - nc)))
        self._series_model = np.concatenate((self._series_model[:ns], np.fromiter(
            (get(m, 0) for m, _ in ix.series[ns:]), np.int64, len(ix.series) - ns)))
        self._maps_at, self._maps_rw = at, ix.rewrites

    def _combo_models(self) -> np.ndarray:
        self._maps()
        return self._combo_model

    def _models_of(self, combos: np.ndarray) -> np.ndarray:
        """The model index of each combo."""
        out: np.ndarray = self._combo_models()[combos]
        return out

    def _nows(self) -> np.ndarray:
        """Each model's now, by model index."""
        return np.asarray(self.join.nows, np.float64)

    def _now_per(self, models: np.ndarray) -> float | np.ndarray:
        """The now of each of these models' rows: one number when they are one model
        (the common batch), else an array."""
        nows = self.join.nows
        if len(models) and int(models.min()) == int(models.max()):
            return float(nows[int(models[0])])
        out: np.ndarray = self._nows()[models]
        return out

    def _series_nows(self) -> np.ndarray:
        """Each series' model's now, by series id."""
        self._maps()
        nows = self._nows()
        out: np.ndarray = nows[self._series_model] if len(nows) else np.full(
            len(self._series_model), -math.inf)
        return out

    def _count_models(self, counter: Counter[str], counts: np.ndarray) -> int:
        total = 0
        for midx, c in enumerate(counts.tolist()):
            if c:
                counter[self.models[midx]] += c
                total += c
        return total

    def _binary(self, sid: int) -> bool:
        midx = self._model_idx.get(self.index.series[sid][0])
        return midx is None or self.class_counts.classes[midx] == 0

    def _class_index(self, midx: int, name: str) -> int:
        return self.batch_parser.names.index(self.models[midx], name)

    def _threshold(self, model: str) -> float:
        """A binary model's decision threshold (``models.<m>.threshold``)."""
        return self.cfg.model(model).threshold or 0.5

    def _calibrator(self, model: str, segment: str) -> tuple[Any, np.ndarray | None] | None:
        """The segment's own calibrator, else the model's."""
        live = self.calibrators.get((model, segment))
        return live if live is not None else self.calibrators.get((model, ALL))

    def _forget_series(self, sids: list[int]) -> None:
        self.windows.forget(sids)
        self.scores.forget(sids)
        if self.classwise is not None:
            self.classwise.forget([c for sid in sids for c in self._classes_of.get(sid, ())])
        if self.buffers is not None:
            for sid in sids:
                self.buffers.drop(sid)

    def _evict(self) -> None:
        """Buckets that slid out of their series' windows (on their model's clock) go."""
        nows = self._series_nows()
        self.windows.evict(nows)
        self.scores.evict(nows)
        if self.classwise is not None:
            self.classwise.evict(self._class_nows(nows))

    def _class_nows(self, series_nows: np.ndarray) -> np.ndarray:
        """Each classwise pseudo-series' model's now, by its id."""
        out = np.full(len(self._class_series), -math.inf)
        for (sid, _c), cid in self._class_series.items():
            out[cid] = series_nows[sid]
        return out
