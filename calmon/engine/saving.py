"""The engine's state saved and restored (``Saving``): ``snapshot()`` as plain data, and
``restore()``, which cross-checks what it reads (a checksum-valid checkpoint may still
be hostile) and reads the checkpoints of earlier versions."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from typing import Any

import numpy as np

from calmon.engine.classes import RESET_GUARD
from calmon.engine.enginestate import COUNTER_KEYS, EngineState
from calmon.engine.join import Join
from calmon.engine.records import SCORE_KINDS

SNAPSHOT_VERSION = 1


class Saving(EngineState):
    """The engine's checkpoint: its state as plain data, and back."""

    def snapshot(self) -> dict[str, Any]:
        """The whole state as plain data (dicts, lists, numpy arrays, bytes)."""
        with self.lock:
            out = self.snapshot_head()
            out.update(self.snapshot_series(None))
            out["series"] = self.index.snapshot()
            if out["classwise"] is not None:
                out["classwise"]["series"] = out.pop("classwise_series")
            else:
                out.pop("classwise_series")
            return out

    def snapshot_head(self) -> dict[str, Any]:
        """What is not kept per series: clocks, models, counters, the join's state (and
        the classwise pseudo-series' ids). With ``series`` (``index.snapshot()``) and
        ``snapshot_series``, the whole of ``snapshot`` (group mode's changelog keeps
        them as sections of their own)."""
        with self.lock:
            return {
                "version": SNAPSHOT_VERSION,
                "layout": self._layout(),
                "now": self.now,
                "model_now": list(self.join.nows),  # event time per model (v3)
                "combo_last": self._combo_last.tolist(),  # v3: idle segments are dropped
                "models": [[m, *row] for m, row in zip(self.models,
                                                       self.class_counts.snapshot())],
                "counters": dict(self.counters),
                "join": self.join.snapshot(),
                "classwise_series": (None if self.classwise is None else
                                     [[s, c, i] for (s, c), i in self._class_series.items()]),
            }

    def snapshot_series(self, only: Iterable[int] | None) -> dict[str, Any]:
        """The per-series state of ``only`` (None: every series): window buckets, score
        histograms, estimation maps, refit buffers, classwise buckets."""
        with self.lock:
            cw = None
            if self.classwise is not None:
                cids = None if only is None else [
                    i for s in only for i in self._classes_of.get(s, ())]
                cw = {"windows": self.classwise.pack(cids)}
            return {
                "windows": self.windows.pack(only),
                "scores": self.scores.pack(only),
                "maps": self.maps.snapshot(only),  # v5: the estimation maps
                "buffers": None if self.buffers is None else self.buffers.snapshot(only),
                "classwise": cw,
            }

    def take_touched(self) -> set[int]:
        """The series whose own state may have changed since the last call (every
        per-series table notes the series it writes), and forget them."""
        with self.lock:
            out = self.windows.touched | self.scores.touched | self.maps.touched
            self.windows.touched, self.scores.touched = set(), set()
            self.maps.touched = set()
            if self.buffers is not None:
                out |= self.buffers.touched
                self.buffers.touched = set()
            if self.classwise is not None and self.classwise.touched:
                owner = {i: s for (s, _c), i in self._class_series.items()}
                out |= {owner[i] for i in self.classwise.touched if i in owner}
                self.classwise.touched = set()
            return out

    def index_mark(self) -> tuple[int, ...]:
        """Changes whenever the series index does (its snapshot, without making it)."""
        with self.lock:
            ix = self.index
            return (ix.generation, len(ix.series), len(ix.combos),
                    sum(len(v) for v in ix._admitted.values()))

    def _layout(self) -> dict[str, Any]:
        m = self.cfg.metrics
        return {"bins": m.bins, "fine_bins": m.fine_bins, "classwise": m.classwise,
                "windows": [[w.name, w.seconds] for w in m.windows]}

    def restore(self, snap: dict[str, Any]) -> None:
        """Replace the state by a snapshot. Raises ValueError for an unknown version."""
        if snap.get("version") != SNAPSHOT_VERSION:
            raise ValueError(f"unsupported snapshot version {snap.get('version')!r}")
        if snap.get("layout") != self._layout():
            raise ValueError(f"the state was kept with metrics {snap.get('layout')}, but the "
                             f"config now says {self._layout()}; use a new state.dir")
        with self.lock:
            self.models = [row[0] for row in snap["models"]]
            # a snapshot from before v2 has no admission counts: its models count as live
            now = float(snap["now"])
            guard = ([[math.floor(now / self.class_counts.width), RESET_GUARD]]
                     if math.isfinite(now) else [])
            self.class_counts.restore([[row[1], row[2] if len(row) > 2 else guard]
                                       for row in snap["models"]])
            self._maps_at = (-1, -1)
            self._batch_labels = [0] * (len(self.models) + 1)
            self._batch_label_models.clear()
            self._model_idx = {m: i for i, m in enumerate(self.models) if m}
            self._free_models = [i for i, m in enumerate(self.models) if not m][::-1]
            self.counters = Counter({k: 0 for k in COUNTER_KEYS})
            self.counters.update(snap["counters"])
            self._stale_classes = self.counters["class_resets"] > 0
            self.index = self._new_index()
            self.index.restore(snap["series"])
            self._folded_seen = 0
            self.join = Join(self.cfg.join)
            self.join.class_index = self._class_index
            nows = snap.get("model_now")
            self.join.nows = ([float(x) for x in nows] if nows is not None
                              else [now] * len(self.models))
            self.join.clock = now
            self.join.restore(snap["join"])
            self.windows.restore(snap["windows"])
            self.scores.restore(snap.get("scores") or [])
            self.maps.restore(snap.get("maps") or [], len(self.index.series))
            if self.buffers is not None and snap.get("buffers"):
                self.buffers.restore(snap["buffers"])
            if self.classwise is not None and snap.get("classwise"):
                self.classwise.restore(snap["classwise"]["windows"])
                self._class_series = {(int(s), int(c)): int(i)
                                      for s, c, i in snap["classwise"]["series"]}
                self._classes_of = {}
                for (s, _c), i in sorted(self._class_series.items(), key=lambda kv: kv[1]):
                    self._classes_of.setdefault(s, []).append(i)
            self._check_restored(snap)
            if nows is None:
                self.join.nows = self._recorded_nows(snap["join"], now)
            last = snap.get("combo_last")
            if last is None:  # before v3: every combo as recent as its model
                last = [self.join.nows[m] for m in self._combo_models().tolist()]
            self._combo_last = np.array(last, np.float64)
            if len(self._combo_last) > len(self.index.combos):
                raise ValueError("combo_last: more values than combos")
            self.version += 1
            self._changed_at = np.full(0, -1, np.int64)
            self._all_changed_at = self.version

    def _check_restored(self, snap: dict[str, Any]) -> None:
        """Cross-checks of a restored state (a checksum-valid checkpoint may still be
        hostile): every id one section holds points into another that has it. Raises
        ValueError; the caller restores an empty state then."""
        n_series, n_combos = len(self.index.series), len(self.index.combos)
        if len(self.join.nows) != len(self.models):
            raise ValueError(f"model_now: {len(self.join.nows)} values for "
                             f"{len(self.models)} models")
        flat = [sid for t in self.index.combo_series for sid in t]
        if flat and (min(flat) < 0 or max(flat) >= n_series):
            raise ValueError(f"series: a combo's series is not one of {n_series}")
        self.windows.check(n_series)
        self.scores.check(n_series)
        if self.classwise is not None:
            self.classwise.check(max(self._class_series.values(), default=-1) + 1)
        join = snap["join"]
        combo = np.asarray(join["combo"], np.int64)
        kind = np.asarray(join["kind"], np.int64)
        if len(combo) and (combo.min() < 0 or combo.max() >= n_combos):
            raise ValueError(f"join: a pending prediction's combo is not one of {n_combos}")
        if len(kind) and (kind.min() < 0 or kind.max() >= len(SCORE_KINDS)):
            raise ValueError("join: a pending prediction has an unknown score kind")

    def _recorded_nows(self, join: dict[str, Any], now: float) -> list[float]:
        """Each model's now, for a checkpoint from before v3 (one "now" for all): the
        latest prediction ts it still holds (pending, or joined in a refit buffer, which
        holds a model's latest predictions as a rule), else the one now."""
        out = [-math.inf] * len(self.models)
        ts = np.asarray(join["ts"], np.float64)
        if len(ts):
            models = self._models_of(np.asarray(join["combo"], np.int64))
            for m, t in zip(models.tolist(), ts.tolist()):
                out[m] = max(out[m], t)
        if self.buffers is not None:
            self._maps()
            for sid, ring in self.buffers.rings.items():
                held = ring.samples().ts
                if len(held):
                    m = int(self._series_model[sid])
                    out[m] = max(out[m], float(held.max()))
        return [min(t, now) if math.isfinite(t) else now for t in out]
