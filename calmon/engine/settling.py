"""A batch's end (``Settling._settle``): the counters, the join's sweep, the joined samples
and arrivals counted, and capacity freeing itself: idle models and segments dropped
(contract v3 §2), buckets that slid out of their windows evicted."""

from __future__ import annotations

import logging
import math

import numpy as np

from calmon.engine.counting import Counting
from calmon.engine.enginestate import Rejected
from calmon.engine.joined import BatchColumns, Joined, JoinEvents
from calmon.engine.parsed import LABEL, Parsed
from calmon.engine.rawbatch import RawBatch
from calmon.engine.records import Kind

log = logging.getLogger(__name__)


class Settling(Counting):
    """The end of a batch, and what an idle model or segment frees."""

    def _settle(self, b: Parsed, raws: RawBatch | None, cols: BatchColumns,
                admitted: np.ndarray, arrivals: np.ndarray, pm: list[int | None],
                pairs: list[tuple[int, Rejected]]) -> list[Rejected]:
        """Counters, the sweep, and the batch's joined samples and arrivals into the
        windows, histograms and buffers. Returns the rejected records, in batch order
        (then labels found out of range when their prediction came)."""
        self.counters["predictions"] += self._count_models(
            self.last_delta.predictions, np.bincount(admitted, minlength=len(self.models)))
        seen = cols.combo >= 0  # every admitted prediction, duplicates too
        self._seen(cols.combo[seen], cols.ts[seen])
        marks = self.class_counts.marks  # before settle() clears them
        self.join.combo_model = self._combo_models()  # the batch's new combos too
        ev = self.join.finish(arrivals)
        rejected = self._count_events(b, raws, ev, pairs)
        self._settle_arrivals(cols, arrivals, pm, marks)
        self._settle_joined(ev.joined, marks)
        folded = self.index.folded - self._folded_seen
        if folded:
            self.last_delta.series_folded += folded
            self._folded_seen = self.index.folded
        self._drop_idle()
        self.version += 1
        smallest = min(self.windows.widths)
        if self.now - self._evicted_at >= smallest:
            self._evict()
            self._evicted_at = self.now
        return rejected

    def _count_events(self, b: Parsed, raws: RawBatch | None, ev: JoinEvents,
                      pairs: list[tuple[int, Rejected]]) -> list[Rejected]:
        """What the join did, counted: labels, duplicates, expiries, labels found out of
        range. Returns the rejected records, in batch order (then labels found out of
        range when their prediction came)."""
        met = np.bincount(self._models_of(ev.met), minlength=len(self.models))
        self.counters["labels"] += self._count_models(self.last_delta.labels, met)
        for midx, c in enumerate(self._batch_labels):
            if c:
                self.counters["labels"] += c
                self.last_delta.labels[self.models[midx] if midx < len(self.models) else ""] += c
                self._batch_labels[midx] = 0
        for model, c in self._batch_label_models.items():
            self.counters["labels"] += c
            self.last_delta.labels[model if model in self._model_idx else ""] += c
        self._batch_label_models.clear()
        if ev.out_of_range:
            at = [i for i, k in enumerate(b.kinds) if k == LABEL]
            pairs += [(at[q], self._rejected(b, raws, at[q], "label_out_of_range"))
                      for q in ev.out_of_range]
        pairs.sort(key=lambda r: r[0])
        rejected = [r for _, r in pairs]
        dup = ev.duplicate_predictions + ev.duplicate_labels
        if dup:
            self.counters["duplicates"] += dup
            self.last_delta.duplicates["predictions"] += ev.duplicate_predictions
            self.last_delta.duplicates["labels"] += ev.duplicate_labels
        if ev.expired:
            expired = list(ev.expired.items())
            models = self._models_of(np.array([combo for (combo, _), _ in expired])).tolist()
            for ((_, reason), n), midx in zip(expired, models):
                self.counters["expired"] += n
                self.last_delta.expired[(self.models[midx], reason)] += n
        if ev.labels_expired:
            self.counters["labels_expired"] += ev.labels_expired
            self.last_delta.labels_expired += ev.labels_expired
        for lab in ev.rejected_labels:
            # it waited for its prediction as a valid label: now it is not one. The state
            # counter moves; the process counter cannot go down (Prometheus semantics)
            self.counters["labels"] -= 1
            self._invalid(Kind.LABEL, "label_out_of_range")
            rejected.append(Rejected(Kind.LABEL, lab.dead_letter_value(), lab.source,
                                     "label_out_of_range"))
        return rejected

    def _settle_arrivals(self, cols: BatchColumns, arrivals: np.ndarray,
                         pm: list[int | None], marks: dict[int, tuple[int, int]]) -> None:
        """The arrivals into the class counts and the score histograms."""
        if marks:  # admitted before their model's reset in this batch: forgotten with it
            pm_arr = np.array([-1 if m is None else m for m in pm], np.int64)
            keep = np.ones(len(arrivals), bool)
            for m, (_, at_arrival) in marks.items():
                keep[:at_arrival] &= pm_arr[arrivals[:at_arrival]] != m
            arrivals = arrivals[keep]
        if len(arrivals):  # as columns, once, for the class counts and the score histograms
            ts_col = cols.ts[arrivals]
            self.class_counts.settle(self._models_of(cols.combo[arrivals]), ts_col,
                                     self.join.nows)
            try:
                self._add_arrivals(cols, arrivals)
            except Exception:  # the score histograms must never stop the joins
                log.exception("counting %d arrivals for score_psi raised", len(arrivals))
        else:
            self.class_counts.settle(np.zeros(0, np.int64), np.zeros(0), self.join.nows)

    def _settle_joined(self, joined: Joined, marks: dict[int, tuple[int, int]]) -> None:
        """The joined samples into the windows and buffers (less stale-class ones)."""
        if len(joined) and (self._stale_classes or marks):
            joined = self._drop_stale(joined, marks)
        if len(joined):
            try:
                self._add_joined(joined)
            except Exception:
                log.exception("adding %d joined samples raised; retrying one by one",
                              len(joined))
                for i in range(len(joined)):  # _add_joined computes first and writes last
                    try:
                        self._add_joined(joined.take(np.array([i])))
                    except Exception:
                        self._invalid(Kind.PREDICTION, "internal")


    def _seen(self, combos: np.ndarray, ts: np.ndarray) -> None:
        """The latest prediction ts of each combo (a segment is idle when its combos are)."""
        n = len(self.index.combos)
        if len(self._combo_last) < n:
            self._combo_last = np.concatenate(
                [self._combo_last, np.full(n - len(self._combo_last), -math.inf)])
        np.maximum.at(self._combo_last, combos, ts)

    def _drop_idle(self) -> None:
        """Capacity frees itself (contract v3 §2): a model whose latest prediction is
        more than its largest window and join.ttl behind the instance's clock is dropped
        with its pending predictions (counted as expired by ttl), its series and its
        slots in limits.max_models and limits.max_series, which new names reuse."""
        limit = self.join.clock - self._idle_after
        if not math.isfinite(limit):
            return
        nows = self.join.nows
        idle = [m for m, name in enumerate(self.models) if name and nows[m] < limit]
        if not idle:
            self._drop_idle_segments(limit)
            return
        self.join.combo_model = self._combo_models()
        combos = self.join.drop_models(idle)
        if len(combos):
            models, counts = np.unique(self._combo_model[combos], return_counts=True)
            for m, n in zip(models.tolist(), counts.tolist()):
                self.counters["expired"] += n
                self.last_delta.expired[(self.models[m], "ttl")] += n
        for m in idle:
            name = self.models[m]
            self._forget_series(self.index.drop_model(name))
            self.models[m] = ""
            del self._model_idx[name]
            self.class_counts.set_model(m, 0, dropped=name)
        self._free_models = sorted(self._free_models + idle, reverse=True)
        self._combo_last[[c for c in range(min(len(self._combo_last), len(self.index.combos)))
                          if not self.index.combos[c][0]]] = -math.inf
        self._drop_idle_segments(limit)
        log.info("dropped %d idle model(s): their slots are free", len(idle))

    def _drop_idle_segments(self, limit: float) -> None:
        """A live model's combos idle as long (no prediction of that segment
        combination), and the series only they fed, go the same way."""
        last = self._combo_last
        n = min(len(last), len(self.index.combos))
        idle = np.flatnonzero(last[:n] < limit)
        if not len(idle):
            return
        cids = [c for c in idle.tolist() if self.index.combos[c][0]]
        if not cids:
            return
        self.join.combo_model = self._combo_models()
        combos = self.join.drop_models([], np.asarray(cids, np.int64))
        if len(combos):
            models, counts = np.unique(self._combo_model[combos], return_counts=True)
            for m, k in zip(models.tolist(), counts.tolist()):
                self.counters["expired"] += k
                self.last_delta.expired[(self.models[m], "ttl")] += k
        sids = self.index.drop_combos(cids)
        last[cids] = -math.inf
        self._forget_series(sids)
