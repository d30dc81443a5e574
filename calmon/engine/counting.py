"""Joined samples and arrivals counted: scored once (``Counting._add_joined`` computes
everything before its first write), then into the windows, the classwise windows, the
score histograms, the refit buffers and the feed's ``Delta``."""

from __future__ import annotations

import numpy as np

from calmon.engine.decisions import binary_decided, multi_decided, thresholds
from calmon.engine.enginestate import EngineState, _take
from calmon.engine.join import BatchColumns, Joined
from calmon.engine.records import MULTICLASS, ScoreKind
from calmon.engine.scoring import probs_of as _probs
from calmon.engine.windows import Samples, bin_index
from calmon.names import sigmoid


def _by_classes(vectors: dict[int, np.ndarray], ordinals: np.ndarray,
                at: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    """For the positions ``at`` of ``ordinals`` (K-class predictions of a batch):
    (positions, (m, K) scores as given) per class count K."""
    by_k: dict[int, list[int]] = {}
    rows = ordinals[at].tolist()
    for pos, p in zip(at.tolist(), rows):
        by_k.setdefault(len(vectors[p]), []).append(pos)
    out = []
    for group in by_k.values():
        idx = np.asarray(group, np.int64)
        out.append((idx, np.array([vectors[p] for p in ordinals[idx].tolist()], np.float64)))
    return out


class Counting(EngineState):
    """The engine's counting of what a batch joined and admitted."""

    def _add_arrivals(self, cols: BatchColumns, rows: np.ndarray) -> None:
        """Raw confidences of admitted predictions into the score histograms."""
        kind = cols.kind[rows]
        conf = np.empty(len(rows))
        binary = kind < MULTICLASS
        x = cols.score[rows[binary]]
        conf[binary] = np.where(kind[binary] == ScoreKind.LOGIT, sigmoid(x), x)
        if not binary.all():
            for at, given in _by_classes(cols.vectors, rows, np.flatnonzero(~binary)):
                conf[at] = _probs(given, kind[at]).max(axis=1)
        sample, sid = self.index.fan_out(cols.combo[rows])
        now = self._now_per(self._models_of(cols.combo[rows]))  # each one's model's now
        self.scores.add(sid, cols.ts[rows][sample], conf[sample], _take(now, sample))

    def _sample_classes(self, j: Joined) -> np.ndarray:
        out = np.zeros(len(j), np.int64)
        for k, (rows, _) in j.vectors.items():
            out[rows] = k
        return out

    def _drop_stale(self, joined: Joined, marks: dict[int, tuple[int, int]]) -> Joined:
        """Samples of a class count their model no longer has (they joined before its
        reset in this batch, or were pending across it) count as joined, and nowhere
        else: exactly as if they had been counted and then forgotten by the reset."""
        models = self._models_of(joined.combo)
        classes = np.asarray(self.class_counts.classes, np.int64)
        keep = self._sample_classes(joined) == classes[models]
        idx = np.arange(len(joined))
        for m, (at_joined, _) in marks.items():
            keep &= ~((models == m) & (idx < at_joined))
        if keep.all():
            return joined
        dropped = np.bincount(models[~keep], minlength=len(self.models))
        self.counters["joined"] += self._count_models(self.last_delta.joined, dropped)
        return joined.take(np.flatnonzero(keep))

    def _add_joined(self, j: Joined) -> None:
        """Score the joined samples, then count them. Everything that can raise comes
        before the first write, so a failure leaves the state as it was."""
        n = len(j)
        models = self._models_of(j.combo)
        ts, label, kinds, combos = j.ts, j.label, j.kind, j.combo
        conf = np.empty(n)
        correct = np.empty(n, np.int64)
        acc = np.empty(n, np.int64)
        brier = np.empty(n)
        nll = np.empty(n)
        binary = np.flatnonzero(kinds < MULTICLASS)
        scores: dict[int, np.ndarray] = {}  # classes (0 binary) -> scores as given
        rows: dict[int, np.ndarray] = {}  # classes -> the sample rows they belong to
        classwise: list[tuple[np.ndarray, np.ndarray]] = []  # (rows, probs) per K
        if len(binary):
            score = j.score if len(binary) == n else j.score[binary]
            scores[0], rows[0] = score, binary
            p = np.where(kinds[binary] == ScoreKind.LOGIT, sigmoid(score), score)
            y = label[binary]
            conf[binary] = p
            correct[binary] = y
            acc[binary] = binary_decided(p, thresholds(self.cfg, self.models)[models[binary]],
                                         j.decision[binary]) == y
            brier[binary] = (p - y) ** 2
            nll[binary] = -np.log(np.clip(np.where(y == 1, p, 1.0 - p), 1e-15, 1.0))
        for k, (ii, given) in j.vectors.items():
            scores[k], rows[k] = given, ii
            probs = _probs(given, kinds[ii])
            y = label[ii]
            top = probs.max(axis=1)
            pred = probs.argmax(axis=1)
            conf[ii] = top
            correct[ii] = pred == y
            acc[ii] = multi_decided(probs, j.decision[ii]) == y
            onehot = np.zeros_like(probs)
            onehot[np.arange(len(ii)), y] = 1.0
            brier[ii] = ((probs - onehot) ** 2).sum(axis=1)
            nll[ii] = -np.log(np.clip(probs[np.arange(len(ii)), y], 1e-15, 1.0))
            if self.classwise is not None:
                classwise.append((ii, probs))
        # fan out: every sample counts in its model's __all__ series and each slice
        sample, sid = self.index.fan_out(combos)
        samples = Samples(sid, ts[sample], conf[sample], correct[sample], acc[sample],
                          brier[sample], nll[sample])
        # the writes
        self.counters["joined"] += self._count_models(
            self.last_delta.joined, np.bincount(models, minlength=len(self.models)))
        now = self._now_per(models)  # each sample's model's now
        for ii, probs in classwise:
            onehot = np.zeros_like(probs)
            onehot[np.arange(len(ii)), label[ii]] = 1.0
            self._add_classwise(combos[ii], ts[ii], probs, onehot, _take(now, ii))
        self.windows.add(samples, _take(now, sample))
        self._mark_changed(sid)
        self._count_bins(samples)
        self._count_delays(j.label_ts - ts, models)
        if self.buffers is not None:
            self._buffer(combos, ts, label, kinds, scores, rows)

    def _add_classwise(self, combos: np.ndarray, ts: np.ndarray, probs: np.ndarray,
                       onehot: np.ndarray, now: float | np.ndarray) -> None:
        """Every class k of every sample, as a sample of the (series, k) pseudo-series."""
        assert self.classwise is not None
        sample, sid = self.index.fan_out(combos)
        k = probs.shape[1]
        ids = []
        for s in sid.tolist():
            for c in range(k):
                cid = self._class_series.get((s, c))
                if cid is None:
                    cid = self._class_series[(s, c)] = len(self._class_series)
                    self._classes_of.setdefault(s, []).append(cid)
                ids.append(cid)
        rows = np.repeat(sample, k)
        cls = np.tile(np.arange(k), len(sample))
        zeros = np.zeros(len(rows))
        self.classwise.add(Samples(np.array(ids, np.int64), ts[rows], probs[rows, cls],
                                   onehot[rows, cls].astype(np.int64),
                                   zeros.astype(np.int64), zeros, zeros), _take(now, rows))

    def _buffer(self, combos: np.ndarray, ts: np.ndarray, label: np.ndarray,
                kinds: np.ndarray, scores: dict[int, np.ndarray],
                rows: dict[int, np.ndarray]) -> None:
        assert self.buffers is not None
        for classes, idx in rows.items():
            if self.cfg.recalibration.per_segment:
                sample, sid = self.index.fan_out(combos[idx])
            else:  # the model's __all__ series only
                sample, sid = np.arange(len(idx)), self.index.all_series(combos[idx])
            order = np.argsort(sid, kind="stable")
            uniq, starts = np.unique(sid[order], return_index=True)
            for s, part in zip(uniq.tolist(), np.split(order, starts[1:])):
                take = sample[part]
                self.buffers.add(s, classes, ts[idx][take], label[idx][take],
                                 kinds[idx][take], scores[classes][take])

    def _count_bins(self, s: Samples) -> None:
        bins = self.cfg.metrics.bins
        key = s.sid * bins + bin_index(s.conf, bins)
        top = int(s.sid.max()) + 1
        count = np.bincount(key, minlength=top * bins).reshape(top, bins)
        conf = np.bincount(key, s.conf, minlength=top * bins).reshape(top, bins)
        corr = np.bincount(key, s.correct.astype(np.float64),
                           minlength=top * bins).reshape(top, bins)
        out = self.last_delta.bins
        held = np.flatnonzero(count.any(axis=1))  # series, not (series, bin)
        trio = np.empty((len(held), 3, bins))  # each series' (3, bins), made at once
        trio[:, 0], trio[:, 1], trio[:, 2] = count[held], conf[held], corr[held]
        series = self.index.series
        for sid, arr in zip(held.tolist(), trio):
            key = series[sid]
            mine = out.get(key)
            if mine is None:
                out[key] = arr
            else:  # a feed's samples added in parts (the one-by-one retry)
                mine += arr

    def _count_delays(self, delays: np.ndarray, models: np.ndarray) -> None:
        known = np.isfinite(delays)  # NaN where the label had no time
        if not known.any():
            return
        delay, models = delays[known], models[known]
        lo, hi = int(models.min()), int(models.max())
        if lo == hi:  # one model: the common batch
            self.last_delta.delays.append((self.models[lo], delay))
            return
        for midx in np.flatnonzero(np.bincount(models - lo)).tolist():
            self.last_delta.delays.append((self.models[midx + lo], delay[models == midx + lo]))
