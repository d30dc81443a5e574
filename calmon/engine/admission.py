"""Admission: a parsed batch's models and class counts admitted (or the record rejected
with the reason), the common batch through one columnar ``Join.run_all``, any other
record by record (``Admission._consume``), then the batch settled. A batch whose new
models would all be admitted record by record, rejecting nothing, admits them first and
is a common batch (``Admission._admit_new``)."""

from __future__ import annotations

import numpy as np

from calmon.engine.enginestate import Rejected
from calmon.engine.join import BatchColumns
from calmon.engine.parsed import LABEL, PRED, REJECT, Parsed
from calmon.engine.rawbatch import RawBatch
from calmon.engine.records import Kind
from calmon.engine.settling import Settling


def _int_column(values: list[int]) -> np.ndarray:
    """Class indices as int64. One past int64 cannot join (it is out of range for every
    prediction) and is kept as the largest int64."""
    try:
        return np.array(values, np.int64)
    except OverflowError:
        return np.array([min(v, 2**63 - 1) for v in values], np.int64)


class Admission(Settling):
    """Models and class counts admitted, and the batch through the join."""

    def _consume(self, b: Parsed, raws: RawBatch | None) -> list[Rejected]:
        """One batch through admission and the join. The common batch (every model
        known, every class count as its model's) is one ``Join.run_all`` over all records;
        a batch that admits a model or meets another class count goes record by
        record, since each decision changes the next."""
        n_pred = len(b.p_id)
        get = self._model_idx.get
        if n_pred and not all(map(self._model_idx.__contains__, set(b.p_model))):
            self._admit_new(b)
        classes = self.class_counts.classes
        models = b.p_model
        one = get(models[0]) if models and models.count(models[0]) == n_pred else None
        if one is not None:  # one known model: the common batch
            pm: list[int | None] = [one] * n_pred
            plain = b.p_classes.count(classes[one]) == n_pred
        else:
            pm = list(map(get, models))
            plain = None not in pm and [classes[m] for m in pm] == b.p_classes  # type: ignore[index]
        cols = BatchColumns(np.array(b.p_ts, np.float64), np.array(b.p_kind, np.int64),
                            np.array(b.p_score, np.float64), np.full(n_pred, -1, np.int64),
                            b.p_vec, np.array(b.p_decision, np.int64))
        self.join.prepare(cols, b.p_id, b.l_id, _int_column(b.l_label),
                          np.array(b.l_ts, np.float64), pm)  # None -> NaN
        self.join.combo_model = self._combo_models()  # every pending slot's combo
        rejected: list[tuple[int, Rejected]] = []
        if plain:
            combos = self.index.combo_ids(b.p_model, b.p_segkey, b.p_segment)
            cols.combo[:] = combos
            self.join.run_all(b)
            self._count_waiting(b)
            keep = np.ones(n_pred, bool)
            keep[np.asarray(self.join.events.dups, np.int64)] = False
            arrivals = np.flatnonzero(keep)
        else:
            arrivals = np.asarray(self._one_by_one(b, raws, pm, cols.combo, rejected), np.int64)
        if b.reasons:
            r = 0
            for i, k in enumerate(b.kinds):
                if k == REJECT:
                    rejected.append((i, self._rejected(b, raws, i, b.reasons[r])))
                    r += 1
        admitted = (np.full(n_pred, one, np.int64) if one is not None and plain else
                    np.array([m for m in pm if m is not None], np.int64))
        return self._settle(b, raws, cols, admitted, arrivals, pm, rejected)

    def _admit_new(self, b: Parsed) -> None:
        """The batch's new models admitted up front, in the order of their first
        predictions (the record-by-record path's order), when that path would admit
        them all and reject nothing: they fit in ``limits.max_models`` and every
        prediction has its model's class count (a new model's: its first prediction's).
        The batch is then a common one: one columnar join, not a join a record (each
        task's first batch in group mode). Not when a label names a new model: record
        by record, one ahead of that model's first prediction counts under "unknown"."""
        get = self._model_idx.get
        classes = self.class_counts.classes
        new: dict[str, int] = {}
        for model, k in zip(b.p_model, b.p_classes):
            midx = get(model)
            if midx is None:
                if new.setdefault(model, k) != k:
                    return
            elif classes[midx] != k:
                return
        held = len(self.models) - len(self._free_models)
        if held + len(new) > self.max_models or not new.keys().isdisjoint(b.l_model):
            return
        for model, k in new.items():
            self._new_model(model, k)

    def _one_by_one(self, b: Parsed, raws: RawBatch | None, pm: list[int | None],
                    combos: np.ndarray, rejected: list[tuple[int, Rejected]]) -> list[int]:
        """The batch record by record: admission decided with the state as it is.
        Returns the ordinals of the predictions admitted and not duplicates."""
        p = q = 0
        arrivals = self._arrivals = []
        dups = self.join.events.dups
        for i, k in enumerate(b.kinds):
            if k == PRED:
                reason = self._admit(b, p, pm)
                if reason is None:
                    combos[p] = self.index.combo(b.p_model[p], b.p_segment[p], b.p_segkey[p])
                    seen = len(dups)
                    p_next, q = self.join.run(b, i, i + 1, p, q)
                    if len(dups) == seen:
                        arrivals.append(p)
                    p = p_next
                else:
                    pm[p] = None
                    rejected.append((i, self._rejected(b, raws, i, reason, Kind.PREDICTION)))
                    p += 1
            elif k == LABEL:
                p, q = self.join.run(b, i, i + 1, p, q)
                self._count_waiting(b)
        return arrivals

    def _admit(self, b: Parsed, p: int, pm: list[int | None]) -> str | None:
        """Admit prediction p's model and class count, or say why not."""
        model, classes = b.p_model[p], b.p_classes[p]
        midx = self._model_idx.get(model)
        if midx is None:
            if len(self.models) - len(self._free_models) >= self.max_models:
                return "too_many_models"
            midx = self._new_model(model, classes)
        pm[p] = midx
        if self.class_counts.classes[midx] != classes:
            now = max(self.join.nows[midx], b.p_ts[p])
            if self.class_counts.live(midx, now, self._arrivals, pm, b.p_ts):
                return "classes_mismatch"  # its live series have another K
            self._reset_classes(midx, classes, pm, b.p_ts)
        return None

    def _count_waiting(self, b: Parsed) -> None:
        """Labels that met no prediction count under the model they name, once that
        model is admitted (a label never creates a model), else under "unknown"."""
        ev = self.join.events
        if not ev.waiting:
            return
        get = self._model_idx.get
        mine: dict[str, str] | None = None
        for q in ev.waiting:
            hint = b.l_model[q]
            midx = None if hint is None else get(hint)
            if midx is None:
                # a label ahead of its prediction in the same batch (partitions come in
                # any order within a poll) is that prediction's model's
                if mine is None:
                    mine = dict(zip(b.p_id, b.p_model))
                model = mine.get(b.l_id[q])
                if model is not None:  # resolved at the batch's end, once it is admitted
                    self._batch_label_models[model] += 1
                    continue
            self._batch_labels[-1 if midx is None else midx] += 1
        ev.waiting.clear()

    def _reset_classes(self, midx: int, classes: int, pm: list[int | None],
                       p_ts: list[float]) -> None:
        """A model that is not live changes its class count: counted, and what it kept
        under the old count (window counts, score histograms, sample buffers) is
        forgotten. Old-count samples that join later count as joined, and nowhere else:
        the same state whichever of a prediction and its label came first."""
        self.class_counts.reset(midx, classes, self.join.joined_so_far(), self._arrivals,
                                pm, p_ts, self.models[midx])
        self._stale_classes = True
        self.counters["class_resets"] += 1
        self.last_delta.class_resets[self.models[midx]] += 1
        model = self.models[midx]
        sids = [sid for sid, (m, _seg) in enumerate(self.index.series) if m == model]
        self._mark_changed(np.asarray(sids, np.int64))
        self._forget_series(sids)

    def _new_model(self, model: str, classes: int) -> int:
        if self._free_models:  # a dropped model's index
            midx = self._free_models.pop()
            self.models[midx] = model
            self.class_counts.set_model(midx, classes)
        else:
            midx = len(self.models)
            self.models.append(model)
            self.class_counts.add_model(classes)
            self._batch_labels.insert(midx, 0)  # keeps [-1], "model unknown", last
        self._model_idx[model] = midx
        self.join.add_model(midx)
        return midx
