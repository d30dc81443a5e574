"""The engine: ``feed(batch)`` in, consistent ``view()`` out, ``snapshot()``/``restore()``.

Pure Python and numpy: no sockets, files, threads or clocks. One lock guards
the state so the consumer loop, scrapes and the scheduler can share it; readers
only ever get copies.

Two kinds of counts are kept. ``counters`` are part of the state (snapshotted,
restored, so exactly-once across restarts; they feed ``/status`` and
``replay``). ``Totals`` are what this process did since it started (Prometheus
``_total`` semantics: a restart resets them) and are never snapshotted.
"""

from __future__ import annotations

import math
import threading
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from calmon.config import Config
from calmon.engine import metrics
from calmon.engine.buffer import Buffers, SampleSet
from calmon.engine.join import Join, Joined
from calmon.engine.metrics import Stats
from calmon.engine.records import Kind, Label, Parser, Prediction, Raw
from calmon.engine.series import SeriesIndex
from calmon.engine.windows import Samples, Windows, bin_index

COUNTER_KEYS = ("predictions", "labels", "joined", "invalid", "expired", "duplicates")
TOPICS = {Kind.PREDICTION: "predictions", Kind.LABEL: "labels"}
# label delay histogram buckets (seconds): 1s .. 7d
DELAY_BUCKETS = (1.0, 5.0, 15.0, 30.0, 60.0, 300.0, 900.0, 1800.0, 3600.0, 7200.0, 21600.0,
                 43200.0, 86400.0, 259200.0, 604800.0)
SNAPSHOT_VERSION = 1


@dataclass(frozen=True, slots=True)
class Rejected:
    """A record that broke the contract: what the dead-letter topic receives."""

    kind: Kind
    value: bytes | None
    source: str
    reason: str


@dataclass
class Totals:
    """What this process did since it started (never snapshotted)."""

    predictions: Counter[str] = field(default_factory=Counter)  # model
    labels: Counter[str] = field(default_factory=Counter)  # model ("" when unknown)
    joined: Counter[str] = field(default_factory=Counter)
    expired: Counter[tuple[str, str]] = field(default_factory=Counter)  # model, reason
    labels_expired: int = 0
    duplicates: Counter[str] = field(default_factory=Counter)  # topic
    invalid: Counter[tuple[str, str]] = field(default_factory=Counter)  # topic, reason
    bins: dict[int, np.ndarray] = field(default_factory=dict)  # series -> (3, B) count/conf/correct
    delay_counts: dict[str, np.ndarray] = field(default_factory=dict)  # model -> per bucket
    delay_sum: Counter[str] = field(default_factory=Counter)

    def copy(self) -> Totals:
        return Totals(Counter(self.predictions), Counter(self.labels), Counter(self.joined),
                      Counter(self.expired), self.labels_expired, Counter(self.duplicates),
                      Counter(self.invalid), {k: v.copy() for k, v in self.bins.items()},
                      {k: v.copy() for k, v in self.delay_counts.items()},
                      Counter(self.delay_sum))


@dataclass(frozen=True)
class Row:
    model: str
    segment: str
    window: str
    binary: bool
    stats: Stats


@dataclass(frozen=True)
class View:
    """A consistent copy of everything readers need, taken under the engine lock."""

    now: float
    rows: list[Row]
    counters: dict[str, int]
    pending: int
    pending_labels: int
    series: list[tuple[str, str]]  # series id -> (model, segment)
    totals: Totals
    version: int


class Engine:
    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.parser = Parser(cfg.fields, cfg.kafka.max_record_bytes)
        self.index = SeriesIndex(cfg.segments.slices, cfg.segments.max_values)
        self.join = Join(cfg.join)
        self.windows = Windows(cfg.metrics.windows, cfg.metrics.bins, cfg.metrics.fine_bins)
        rc = cfg.recalibration
        self.buffers = Buffers(rc.buffer) if rc.enabled else None
        self.models: list[str] = []
        self._model_idx: dict[str, int] = {}
        self._classes: list[int] = []  # per model: 0 binary, K multiclass
        self.now = -math.inf
        self.counters: Counter[str] = Counter({k: 0 for k in COUNTER_KEYS})
        self.totals = Totals()
        self.lock = threading.RLock()
        self.version = 0  # bumped by every feed; lets readers cache views
        self._evicted_at = -math.inf
        self._view_cache: View | None = None

    # ------------------------------------------------------------ writing

    def feed(self, batch: Iterable[Raw]) -> list[Rejected]:
        """Parse, join and count one batch. Returns the records that broke the
        contract (already counted), for the dead-letter topic. Never raises on data."""
        rejected: list[Rejected] = []
        with self.lock:
            parse = self.parser.parse
            for raw in batch:
                rec = parse(raw)
                if type(rec) is Prediction:
                    reason = self._prediction(rec)
                elif type(rec) is Label:
                    reason = self._label(rec)
                else:
                    reason = rec.reason  # type: ignore[union-attr]
                if reason is not None:
                    self._invalid(raw.kind, reason)
                    rejected.append(Rejected(raw.kind, raw.value, raw.source, reason))
            self._settle(rejected)
        return rejected

    def feed_parsed(self, records: Iterable[Prediction | Label]) -> list[Rejected]:
        """``feed`` for records parsed elsewhere (benchmarks, tests)."""
        rejected: list[Rejected] = []
        with self.lock:
            for rec in records:
                if type(rec) is Prediction:
                    reason = self._prediction(rec)
                    kind = Kind.PREDICTION
                else:
                    reason = self._label(rec)  # type: ignore[arg-type]
                    kind = Kind.LABEL
                if reason is not None:
                    self._invalid(kind, reason)
                    rejected.append(Rejected(kind, None, rec.source, reason))
            self._settle(rejected)
        return rejected

    def _invalid(self, kind: Kind, reason: str) -> None:
        self.counters["invalid"] += 1
        self.totals.invalid[(TOPICS[kind], reason)] += 1

    def _prediction(self, pred: Prediction) -> str | None:
        midx = self._model_idx.get(pred.model)
        classes = 0 if pred.kind in ("prob", "logit") else len(pred.score)
        if midx is None:
            midx = len(self.models)
            self.models.append(pred.model)
            self._model_idx[pred.model] = midx
            self._classes.append(classes)
        elif self._classes[midx] != classes:
            return "classes_mismatch"  # a model is binary or K-class, never both
        self.counters["predictions"] += 1
        self.totals.predictions[pred.model] += 1
        if pred.ts > self.now:
            self.now = pred.ts
        combo = self.index.combo(pred.model, pred.segment)
        self.join.add_prediction(pred, midx, combo, self.now)
        return None

    def _label(self, lab: Label) -> str | None:
        model = lab.model
        if model is None:
            midx = self.join.model_of(lab.id)
            model = "" if midx is None else self.models[midx]
        if not self.join.add_label(lab, self.now):
            return "label_out_of_range"
        self.counters["labels"] += 1
        self.totals.labels[model] += 1
        return None

    def _settle(self, rejected: list[Rejected]) -> None:
        self.join.sweep(self.now)
        ev = self.join.drain()
        dup = ev.duplicate_predictions + ev.duplicate_labels
        if dup:
            self.counters["duplicates"] += dup
            self.totals.duplicates["predictions"] += ev.duplicate_predictions
            self.totals.duplicates["labels"] += ev.duplicate_labels
        for (midx, reason), n in ev.expired.items():
            self.counters["expired"] += n
            self.totals.expired[(self.models[midx], reason)] += n
        if ev.labels_expired:
            self.counters["labels_expired"] += ev.labels_expired
            self.totals.labels_expired += ev.labels_expired
        for lab in ev.rejected_labels:
            # it waited for its prediction as a valid label: now it is not one. The state
            # counter moves; the process counter cannot go down (Prometheus semantics)
            self.counters["labels"] -= 1
            self._invalid(Kind.LABEL, "label_out_of_range")
            rejected.append(Rejected(Kind.LABEL, lab.raw, lab.source, "label_out_of_range"))
        if ev.joined:
            self._add_joined(ev.joined)
        self.version += 1
        smallest = min(self.windows.widths)
        if self.now - self._evicted_at >= smallest:
            self.windows.evict(self.now)
            self._evicted_at = self.now

    def _add_joined(self, joined: list[Joined]) -> None:
        n = len(joined)
        self.counters["joined"] += n
        models = np.fromiter((j.model for j in joined), np.int64, n)
        for midx, c in zip(*np.unique(models, return_counts=True)):
            self.totals.joined[self.models[midx]] += int(c)
        ts = np.fromiter((j.ts for j in joined), np.float64, n)
        label = np.fromiter((j.label for j in joined), np.int64, n)
        conf = np.empty(n)
        correct = np.empty(n, np.int64)
        acc = np.empty(n, np.int64)
        brier = np.empty(n)
        nll = np.empty(n)
        kinds = np.fromiter((j.kind for j in joined), np.int8, n)
        binary = np.flatnonzero(kinds < 2)
        if len(binary):
            score = np.fromiter((joined[i].score for i in binary.tolist()), np.float64,
                                len(binary))
            is_logit = kinds[binary] == 1
            p = np.where(is_logit, _sigmoid(score), score)
            y = label[binary]
            conf[binary] = p
            correct[binary] = y
            acc[binary] = (p >= 0.5).astype(np.int64) == y
            brier[binary] = (p - y) ** 2
            nll[binary] = -np.log(np.clip(np.where(y == 1, p, 1.0 - p), 1e-15, 1.0))
        multi = np.flatnonzero(kinds >= 2)
        if len(multi):
            by_k: dict[int, list[int]] = {}
            for i in multi.tolist():
                by_k.setdefault(len(joined[i].score), []).append(i)  # type: ignore[arg-type]
            for k, idx in by_k.items():
                ii = np.asarray(idx)
                probs = np.array([joined[i].score for i in idx], dtype=np.float64).reshape(-1, k)
                logits = kinds[ii] == 3
                probs[logits] = _softmax(probs[logits])
                probs[~logits] /= probs[~logits].sum(axis=1, keepdims=True)
                y = label[ii]
                top = probs.max(axis=1)
                pred = probs.argmax(axis=1)
                conf[ii] = top
                correct[ii] = pred == y
                acc[ii] = pred == y
                onehot = np.zeros_like(probs)
                onehot[np.arange(len(ii)), y] = 1.0
                brier[ii] = ((probs - onehot) ** 2).sum(axis=1)
                nll[ii] = -np.log(np.clip(probs[np.arange(len(ii)), y], 1e-15, 1.0))
        # fan out: every sample counts in its model's __all__ series and each slice
        fan = [self.index.combo_series[j.combo] for j in joined]
        reps = np.fromiter((len(f) for f in fan), np.int64, n)
        sid = np.fromiter((s for f in fan for s in f), np.int64, int(reps.sum()))
        samples = Samples(sid, np.repeat(ts, reps), np.repeat(conf, reps),
                          np.repeat(correct, reps), np.repeat(acc, reps),
                          np.repeat(brier, reps), np.repeat(nll, reps))
        self.windows.add(samples, self.now)
        self._count_bins(samples)
        self._count_delays(joined, ts, models)
        if self.buffers is not None:
            self._buffer(joined, fan, ts, label, kinds)

    def _buffer(self, joined: list[Joined], fan: list[tuple[int, ...]], ts: np.ndarray,
                label: np.ndarray, kinds: np.ndarray) -> None:
        assert self.buffers is not None
        per_segment = self.cfg.recalibration.per_segment
        targets: dict[int, list[int]] = {}
        for i, f in enumerate(fan):
            for sid in (f if per_segment else f[:1]):  # f[0] is the model's __all__
                targets.setdefault(sid, []).append(i)
        for sid, idx in targets.items():
            classes = self._classes[self._model_idx[self.index.series[sid][0]]]
            ii = np.asarray(idx)
            if classes == 0:
                score = np.fromiter((joined[i].score for i in idx), np.float64, len(idx))
            else:
                score = np.array([joined[i].score for i in idx], np.float64).reshape(-1, classes)
            self.buffers.add(sid, classes, ts[ii], label[ii], kinds[ii], score)

    def _count_bins(self, s: Samples) -> None:
        bins = self.cfg.metrics.bins
        key = s.sid * bins + bin_index(s.conf, bins)
        uniq, inv = np.unique(key, return_inverse=True)
        count = np.bincount(inv)
        conf = np.bincount(inv, s.conf)
        corr = np.bincount(inv, s.correct.astype(np.float64))
        for k, c, cf, cr in zip(uniq.tolist(), count.tolist(), conf.tolist(), corr.tolist()):
            sid, b = divmod(k, bins)
            arr = self.totals.bins.get(sid)
            if arr is None:
                arr = self.totals.bins[sid] = np.zeros((3, bins))
            arr[0, b] += c
            arr[1, b] += cf
            arr[2, b] += cr

    def _count_delays(self, joined: list[Joined], ts: np.ndarray, models: np.ndarray) -> None:
        lts = np.fromiter((np.nan if j.label_ts is None else j.label_ts for j in joined),
                          np.float64, len(joined))
        known = np.isfinite(lts)
        if not known.any():
            return
        delay = lts[known] - ts[known]
        bucket = np.searchsorted(DELAY_BUCKETS, delay, side="left")  # le-buckets, +Inf last
        for midx in np.unique(models[known]).tolist():
            mine = models[known] == midx
            name = self.models[midx]
            arr = self.totals.delay_counts.get(name)
            if arr is None:
                arr = self.totals.delay_counts[name] = np.zeros(len(DELAY_BUCKETS) + 1)
            arr += np.bincount(bucket[mine], minlength=len(DELAY_BUCKETS) + 1)
            self.totals.delay_sum[name] += float(delay[mine].sum())

    # ------------------------------------------------------------ reading

    def view(self) -> View:
        """Every (model, segment, window) row plus counters, computed under the lock.
        Cached until the next feed, so several readers share one computation."""
        with self.lock:
            cached = self._view_cache
            if cached is not None and cached.version == self.version:
                return cached
            self.windows.evict(self.now)
            rows: list[Row] = []
            for sid in sorted(self.windows.series(), key=lambda s: self.index.series[s]):
                model, segment = self.index.series[sid]
                binary = self._classes[self._model_idx[model]] == 0
                for w, win in enumerate(self.cfg.metrics.windows):
                    vec = self.windows.totals(sid, w, self.now)
                    if vec is None:
                        vec = np.zeros(self.windows.layout.size)
                    rows.append(Row(model, segment, win.name, binary,
                                    metrics.from_vector(vec, self.windows.layout, binary)))
            view = View(self.now, rows, dict(self.counters), self.join.pending,
                        self.join.pending_labels, list(self.index.series), self.totals.copy(),
                        self.version)
            self._view_cache = view
            return view

    def samples(self, model: str, segment: str) -> SampleSet | None:
        """A copy of the recent joined samples of one series (None without a buffer)."""
        with self.lock:
            sid = self.index.find(model, segment)
            if self.buffers is None or sid is None:
                return None
            return self.buffers.samples(sid)

    def buffered_series(self) -> list[tuple[str, str, int]]:
        """(model, segment, classes) of every series with a sample buffer."""
        with self.lock:
            if self.buffers is None:
                return []
            out = []
            for sid in sorted(self.buffers.rings):
                model, segment = self.index.series[sid]
                out.append((model, segment, self._classes[self._model_idx[model]]))
            return out

    def status_counters(self) -> dict[str, int]:
        with self.lock:
            return dict(self.counters)

    # ------------------------------------------------------------ checkpoints

    def snapshot(self) -> dict[str, Any]:
        """The whole state as plain data (dicts, lists, numpy arrays, bytes)."""
        with self.lock:
            return {
                "version": SNAPSHOT_VERSION,
                "layout": self._layout(),
                "now": self.now,
                "models": [[m, c] for m, c in zip(self.models, self._classes)],
                "counters": dict(self.counters),
                "series": self.index.snapshot(),
                "join": self.join.snapshot(),
                "windows": self.windows.snapshot(),
                "buffers": None if self.buffers is None else self.buffers.snapshot(),
            }

    def _layout(self) -> dict[str, Any]:
        m = self.cfg.metrics
        return {"bins": m.bins, "fine_bins": m.fine_bins,
                "windows": [[w.name, w.seconds] for w in m.windows]}

    def restore(self, snap: dict[str, Any]) -> None:
        """Replace the state by a snapshot. Raises ValueError for an unknown version."""
        if snap.get("version") != SNAPSHOT_VERSION:
            raise ValueError(f"unsupported snapshot version {snap.get('version')!r}")
        if snap.get("layout") != self._layout():
            raise ValueError(f"the state was kept with metrics {snap.get('layout')}, but the "
                             f"config now says {self._layout()}; use a new state.dir")
        with self.lock:
            self.now = float(snap["now"])
            self.models = [m for m, _ in snap["models"]]
            self._classes = [int(c) for _, c in snap["models"]]
            self._model_idx = {m: i for i, m in enumerate(self.models)}
            self.counters = Counter({k: 0 for k in COUNTER_KEYS})
            self.counters.update(snap["counters"])
            self.index = SeriesIndex(self.cfg.segments.slices, self.cfg.segments.max_values)
            self.index.restore(snap["series"])
            self.join = Join(self.cfg.join)
            self.join.restore(snap["join"])
            self.windows.restore(snap["windows"])
            if self.buffers is not None and snap.get("buffers"):
                self.buffers.restore(snap["buffers"])
            self.version += 1


def _sigmoid(z: np.ndarray) -> np.ndarray:
    out = np.empty_like(z)
    pos = z >= 0
    out[pos] = 1.0 / (1.0 + np.exp(-z[pos]))
    e = np.exp(z[~pos])
    out[~pos] = e / (1.0 + e)
    return out


def _softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)
