"""Prometheus exposition: custom collectors that read immutable state at scrape time.

Every metric name calmon exports is spelt here and only here, as in CONTRACT.md §5
(counters with their ``_total``, which prometheus-client keeps in the exposition).
Nothing on the hot path calls a metric, and a scrape computes no statistic: the
window families are rendered from the latest ``Snapshot`` (built off the request
path, see ``calmon.engine.snapshot``), so a series disappears as soon as its segment
has left every window. ``metrics.export`` (the series budget) chooses the windows,
the per-bin counters and the per-window families of ``__all__`` and segment series.
"""

from __future__ import annotations

import platform
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from calmon import __version__
from calmon.config import Config
from calmon.engine.engine import Engine
from calmon.engine.records import REASONS
from calmon.engine.rows import Row, Snapshot, empty
from calmon.engine.snapshot import Refresher
from calmon.io.totals import DELAY_BUCKETS, ProcessTotals
from calmon.names import ALL
from calmon.names import FAMILIES as FAMILIES  # re-exported: older imports
from calmon.names import FIT_METHODS as FIT_METHODS
from calmon.names import SERIES_FAMILIES as SERIES_FAMILIES
from calmon.names import SERIES_GAUGES as SERIES_GAUGES
from calmon.names import UNFILTERED_FAMILIES as UNFILTERED_FAMILIES
from calmon.recal.readmodel import RecalState

ROW_GAUGES = (
    ("calmon_ece", "ece", "Expected calibration error over equal-width bins"),
    ("calmon_mce", "mce", "Maximum calibration error over non-empty bins"),
    ("calmon_ace", "ace", "Adaptive (equal-mass) calibration error"),
    ("calmon_brier", "brier", "Brier score"),
    ("calmon_nll", "nll", "Negative log-likelihood"),
    ("calmon_accuracy", "accuracy", "Accuracy"),
    ("calmon_mean_confidence", "mean_confidence",
     "Mean confidence (binary: mean P(y=1); multiclass: mean top-label probability)"),
    ("calmon_observed_rate", "observed_rate", "Observed positive rate (binary models)"),
    ("calmon_observed_over_expected", "observed_over_expected",
     "Observed over expected positives, sum(y)/sum(p) (binary models)"),
    ("calmon_ece_noise_floor", "noise_floor",
     "Expected ECE of a perfectly calibrated model with the same bins"),
    ("calmon_ece_l2_debiased", "ece_l2_debiased",
     "Debiased l2 calibration error over the equal-width bins (Kumar et al. 2019)"),
    ("calmon_smece", "smece", "Smooth ECE (Blasiok and Nakkiran 2023) from the fine bins"),
    ("calmon_ece_lower", "ece_lower",
     "Lower end of the metrics.interval_level interval for the population ECE"),
    ("calmon_ece_upper", "ece_upper",
     "Upper end of the metrics.interval_level interval for the population ECE"),
)
# before the labels: read from Row.estimates
ESTIMATE_GAUGES = (
    ("calmon_pending_samples", "pending_samples",
     "Predictions in the window still waiting for their label"),
    ("calmon_estimated_accuracy", "estimated_accuracy",
     "Accuracy the pending predictions will show if P(y | score), as learned from the "
     "labelled samples (or the live calibrator), holds (CBPE)"),
    ("calmon_estimated_positive_rate", "estimated_positive_rate",
     "Expected P(y=1) of the pending predictions, read as calmon_estimated_accuracy "
     "(binary models)"),
    ("calmon_score_psi", "score_psi",
     "Population stability index of the raw confidences against the reference histogram"),
    ("calmon_estimated_accuracy_lower", "estimated_accuracy_lower",
     "Lower end of the metrics.interval_level band for the accuracy the pending "
     "predictions will realize (their finite number and the estimation map's fit error)"),
    ("calmon_estimated_accuracy_upper", "estimated_accuracy_upper",
     "Upper end of the metrics.interval_level band for the accuracy the pending "
     "predictions will realize"),
    ("calmon_estimated_correct", "estimated_correct",
     "Expected number of pending predictions that will prove right: sum over instances "
     "and divide by the summed calmon_pending_samples"),
    ("calmon_estimated_correct_variance", "estimated_correct_variance",
     "Variance of calmon_estimated_correct: summed over instances, its square root over "
     "the summed pending samples is the combined band's standard error"),
)
ROW_LABELS = ("model", "segment", "window")
CLASSWISE_DOC = ("Mean over classes of the ECE of p_k against [y = k] (multiclass models, "
                 "with metrics.classwise)")


def _stat(attr: str) -> Callable[[Row], Any]:
    return lambda row: getattr(row.stats, attr)


def _estimate(attr: str) -> Callable[[Row], Any]:
    return lambda row: getattr(row.estimates, attr)


# (metric name, family name, the value of a row or None) of every per-window family
_GETTERS: tuple[tuple[str, str, Callable[[Row], Any]], ...] = (
    ("calmon_window_samples", "window_samples", lambda row: row.stats.samples),
    *((n, n[len("calmon_"):], _stat(a)) for n, a, _ in ROW_GAUGES),
    *((n, n[len("calmon_"):], _estimate(a)) for n, a, _ in ESTIMATE_GAUGES),
    ("calmon_classwise_ece", "classwise_ece", lambda row: row.classwise_ece),
)
OUTCOMES = ("published", "rejected", "failed", "held")
_NO_ROWS = empty()  # what describe() renders: the families of no rows


class ExportPolicy:
    """``metrics.export``: which windows, per-bin counters and per-series families."""

    def __init__(self, cfg: Config) -> None:
        ex = cfg.metrics.export
        self.windows = frozenset(ex.windows if ex.windows is not None
                                 else (w.name for w in cfg.metrics.windows))
        self.bins = ex.bins
        self.families = None if ex.families is None else frozenset(ex.families)
        seg = ex.segment_families if ex.segment_families is not None else ex.families
        self.segment_families = None if seg is None else frozenset(seg)

    def keep(self, family: str, segment: str) -> bool:
        """Whether a series of this segment carries ``family`` (a name without calmon_)."""
        allowed = self.families if segment == ALL else self.segment_families
        return allowed is None or family in allowed

    def keep_bins(self, segment: str) -> bool:
        return self.bins == "all" or (self.bins == "models" and segment == ALL)


class WindowCollector(Collector):
    """The per-window families of the latest snapshot, as ``metrics.export`` allows: the
    bulk of the exposition, rendered once per snapshot (see ``calmon.io.exposition``)."""

    def __init__(self, snapshot: Callable[[], Snapshot], cfg: Config) -> None:
        self.snapshot = snapshot
        self.policy = ExportPolicy(cfg)

    def describe(self) -> list[Metric]:
        return list(window_metrics(_NO_ROWS, self.policy))  # the families of no rows

    def collect(self) -> Iterator[Metric]:
        yield from window_metrics(self.snapshot(), self.policy)

    def render(self, openmetrics: bool) -> bytes:
        """What prometheus-client's encoder writes for ``collect()`` (text 0.0.4, or
        OpenMetrics without its end marker), written directly: the label string of a
        row once for all its families, no sample objects (about 5x faster)."""
        return render_windows(self.snapshot(), self.policy, openmetrics)


def _escape(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r'\"')


def render_windows(view: Snapshot, policy: ExportPolicy, openmetrics: bool) -> bytes:
    """``window_metrics`` of a snapshot in the exposition format (see WindowCollector)."""
    names = ["calmon_window_samples", *(n for n, _, _ in ROW_GAUGES),
             *(n for n, _, _ in ESTIMATE_GAUGES), "calmon_classwise_ece"]
    docs = {n: d for n, _, d in (*ROW_GAUGES, *ESTIMATE_GAUGES)}
    docs["calmon_window_samples"] = "Joined samples in the window"
    docs["calmon_classwise_ece"] = CLASSWISE_DOC
    lines: dict[str, list[str]] = {n: [] for n in names}
    keep_cache: dict[str, list[tuple[str, Callable[[Row], Any]]]] = {}
    for row in view.rows:
        if row.window not in policy.windows:
            continue
        kind = ALL if row.segment == ALL else ""
        getters = keep_cache.get(kind)
        if getters is None:
            getters = keep_cache[kind] = [
                (n, g) for n, fam, g in _GETTERS if policy.keep(fam, row.segment)]
        labels = (f'{{model="{_escape(row.model)}",segment="{_escape(row.segment)}",'
                  f'window="{_escape(row.window)}"}} ')
        for name, get in getters:
            v = get(row)
            if v is not None:
                lines[name].append(name + labels + floatToGoString(v) + "\n")  # type: ignore[no-untyped-call]
    out = []
    for name in names:
        doc = docs[name].replace("\\", r"\\").replace("\n", r"\n")
        if openmetrics:
            doc = doc.replace('"', r'\"')
        out.append(f"# HELP {name} {doc}\n# TYPE {name} gauge\n")
        out.extend(lines[name])
    return "".join(out).encode()


def _refreshed(refresher: Refresher) -> Callable[[], Snapshot]:
    """The refresher's snapshot brought up to date, every statistic fresh."""
    return lambda: refresher.update(full=True)


class CalmonCollector(Collector):
    def __init__(self, engine: Engine,
                 last_checkpoint: Callable[[], float | None] = lambda: None,
                 recal: Callable[[], RecalState] | None = None, *,
                 lag: Callable[[], dict[tuple[str, int], int]] | None = None,
                 heartbeat: Callable[[], float | None] | None = None,
                 totals: ProcessTotals | None = None,
                 dead_letters_failed: Callable[[], int] | None = None,
                 snapshot: Callable[[], Snapshot] | None = None,
                 windows: bool = True,
                 statistics_age: Callable[[], float | None] | None = None) -> None:
        """``snapshot``: where the rows come from (the daemon passes its refresher's
        latest snapshot; default: a refresher of this collector's own, brought up to
        date by each collect). ``windows``: False
        when a ``WindowCollector`` exports the window families instead."""
        self.engine = engine
        self.snapshot: Callable[[], Snapshot] = (
            snapshot if snapshot is not None else _refreshed(Refresher(engine)))
        self.windows = windows
        self.policy = ExportPolicy(engine.cfg)
        self.statistics_age = statistics_age
        # the process counters; the daemon adds each feed's delta to them
        self.totals = totals if totals is not None else ProcessTotals()
        self.last_checkpoint = last_checkpoint
        self.recal = recal
        self.lag = lag
        self.heartbeat = heartbeat
        self.dead_letters_failed = dead_letters_failed

    def describe(self) -> list[Metric]:
        """Every family ``collect`` may yield, of empty readings: nothing is read
        (registration checks the names, and refuses a family already registered)."""
        recal = None if self.recal is None else RecalState(owned_models=0)
        return list(self._families(_NO_ROWS, ProcessTotals(), recal, live=False))

    def collect(self) -> Iterator[Metric]:
        recal = None if self.recal is None else self.recal()
        yield from self._families(self.snapshot(), self.totals.copy(), recal, live=True)

    def _families(self, view: Snapshot, totals: ProcessTotals, recal: RecalState | None, *,
                  live: bool) -> Iterator[Metric]:
        """The families of these readings; ``live``: read the callables' values too."""
        if self.windows:
            yield from window_metrics(view, self.policy)
        yield from self._bins(totals, self.policy)
        yield from self._flow(view, totals, {} if recal is None else recal.invalid)
        if recal is not None:
            yield from recal_metrics(recal, self.policy)
        if self.statistics_age is not None:
            age = self.statistics_age() if live else None
            g = GaugeMetricFamily("calmon_statistics_age_seconds",
                                  "Age of the expensive statistics being served (intervals, "
                                  "debiased and smooth ECE, estimates, PSI)")
            if age is not None:
                g.add_metric([], age)
            yield g
        yield _series_errors(view, recal)
        ts = self.last_checkpoint() if live else None
        g = GaugeMetricFamily("calmon_last_checkpoint_timestamp_seconds",
                              "Unix time of the last checkpoint written")
        if ts is not None:
            g.add_metric([], ts)
        yield g
        if self.dead_letters_failed is not None:
            yield CounterMetricFamily(
                "calmon_dead_letters_failed_total",
                "Invalid records that could not be forwarded to the dead-letter topic",
                value=self.dead_letters_failed() if live else 0)
        yield from self._process(live)

    def _process(self, live: bool) -> Iterator[Metric]:
        info = GaugeMetricFamily("calmon_build_info", "Always 1; the running calmon's version",
                                 labels=("version", "python"))
        info.add_metric([__version__, platform.python_version()], 1)
        yield info
        g = GaugeMetricFamily("calmon_consumer_lag_records",
                              "Records in the partition after calmon's position (end offset "
                              "minus next offset), refreshed every few seconds",
                              labels=("topic", "partition"))
        for (topic, partition), v in sorted((self.lag() if self.lag and live else {}).items()):
            g.add_metric([topic, str(partition)], v)
        yield g
        g = GaugeMetricFamily("calmon_loop_heartbeat_timestamp_seconds",
                              "Unix time the main loop last made progress (polled or waited)")
        beat = self.heartbeat() if self.heartbeat and live else None
        if beat is not None:
            g.add_metric([], beat)
        yield g

    @staticmethod
    def _bins(totals: ProcessTotals, policy: ExportPolicy) -> Iterator[Metric]:
        labels = ("model", "segment", "bin")
        n = CounterMetricFamily("calmon_bin_samples_total", "Joined samples per bin since start",
                                labels=labels)
        conf = CounterMetricFamily("calmon_bin_confidence_total",
                                   "Summed confidence per bin since start", labels=labels)
        corr = CounterMetricFamily("calmon_bin_correct_total",
                                   "Summed correct outcomes per bin since start", labels=labels)
        for (model, segment), arr in sorted(totals.bins.items()):
            if not policy.keep_bins(segment):
                continue
            for b in range(arr.shape[1]):
                key = [model, segment, str(b)]
                n.add_metric(key, arr[0, b])
                conf.add_metric(key, arr[1, b])
                corr.add_metric(key, arr[2, b])
        yield from (n, conf, corr)

    @staticmethod
    def _flow(view: Snapshot, t: ProcessTotals,
              internal: Mapping[tuple[str, str], int]) -> Iterator[Metric]:
        for name, doc, counts in (
            ("calmon_predictions_total", "Valid predictions received", t.predictions),
            ("calmon_labels_total", "Valid labels received (model empty when not yet known)",
             t.labels),
            ("calmon_joined_total", "Predictions joined with a label", t.joined),
            ("calmon_class_resets_total",
             "Class-count changes of a model that was not live (see README)", t.class_resets),
        ):
            fam = CounterMetricFamily(name, doc, labels=("model",))
            for model, v in sorted(counts.items()):
                fam.add_metric([model], v)
            yield fam
        fam = CounterMetricFamily("calmon_join_expired_total", "Predictions expired unjoined",
                                  labels=("model", "reason"))
        # both reasons from a model's first prediction on, so rate() sees the first expiry
        expired = dict.fromkeys(((m, r) for m in t.predictions for r in ("ttl", "capacity")), 0)
        expired.update(t.expired)
        for (model, reason), v in sorted(expired.items()):
            fam.add_metric([model, reason], v)
        yield fam
        yield CounterMetricFamily("calmon_labels_expired_total", "Unmatched labels dropped",
                                  value=t.labels_expired)
        fam = CounterMetricFamily("calmon_duplicates_total", "Duplicate records ignored",
                                  labels=("topic",))
        for topic in ("predictions", "labels"):
            fam.add_metric([topic], t.duplicates.get(topic, 0))
        yield fam
        fam = CounterMetricFamily(
            "calmon_key_mismatch_total",
            "Records whose Kafka key is not their id (they cannot co-partition)",
            labels=("topic",))
        for topic in ("predictions", "labels"):
            fam.add_metric([topic], t.key_mismatch.get(topic, 0))
        yield fam
        fam = CounterMetricFamily("calmon_invalid_records_total", "Records that broke the contract",
                                  labels=("topic", "reason"))
        for topic in ("predictions", "labels"):
            for reason in REASONS:  # all present from the start, so rate() alerts work
                fam.add_metric([topic, reason], t.invalid.get((topic, reason), 0))
        for (topic, reason), n in sorted(internal.items()):  # scaled out: joined, calibrators
            fam.add_metric([topic, reason], n)
        yield fam
        yield GaugeMetricFamily("calmon_join_pending", "Predictions waiting for labels",
                                value=view.pending)
        yield GaugeMetricFamily("calmon_series", "(model, segment) series held",
                                value=view.series_held)
        yield CounterMetricFamily("calmon_series_folded_total",
                                  "New segments folded into __other__ by limits.max_series",
                                  value=t.series_folded)
        hist = HistogramMetricFamily("calmon_label_delay_seconds",
                                     "Label ts minus prediction ts", labels=("model",))
        for model, delays in sorted(t.delay_counts.items()):
            cum = delays.cumsum()
            buckets: list[tuple[str, float]] = [
                (_le(b), float(c)) for b, c in zip(DELAY_BUCKETS, cum[:-1])]
            buckets.append(("+Inf", float(cum[-1])))
            hist.add_metric([model], buckets, t.delay_sum[model])
        yield hist


def window_metrics(view: Snapshot, policy: ExportPolicy) -> Iterator[Metric]:
    """The per (model, segment, window) families of a snapshot."""
    samples = GaugeMetricFamily("calmon_window_samples", "Joined samples in the window",
                                labels=ROW_LABELS)
    fams = [(GaugeMetricFamily(name, doc, labels=ROW_LABELS), attr, name[len("calmon_"):])
            for name, attr, doc in ROW_GAUGES]
    ests = [(GaugeMetricFamily(name, doc, labels=ROW_LABELS), attr, name[len("calmon_"):])
            for name, attr, doc in ESTIMATE_GAUGES]
    classwise = GaugeMetricFamily("calmon_classwise_ece", CLASSWISE_DOC, labels=ROW_LABELS)
    keep_cache: dict[str, tuple[list[tuple[GaugeMetricFamily, str, str]],
                                list[tuple[GaugeMetricFamily, str, str]], bool, bool]] = {}
    for row in view.rows:
        if row.window not in policy.windows:
            continue
        kind = ALL if row.segment == ALL else ""
        hit = keep_cache.get(kind)
        if hit is None:
            hit = keep_cache[kind] = (
                [f for f in fams if policy.keep(f[2], row.segment)],
                [f for f in ests if policy.keep(f[2], row.segment)],
                policy.keep("window_samples", row.segment),
                policy.keep("classwise_ece", row.segment))
        my_fams, my_ests, keep_samples, keep_cw = hit
        key = [row.model, row.segment, row.window]
        if keep_samples:
            samples.add_metric(key, row.stats.samples)
        for fam, attr, _ in my_fams:
            v = getattr(row.stats, attr)
            if v is not None:
                fam.add_metric(key, v)
        for fam, attr, _ in my_ests:
            v = getattr(row.estimates, attr)
            if v is not None:
                fam.add_metric(key, v)
        if keep_cw and row.classwise_ece is not None:
            classwise.add_metric(key, row.classwise_ece)
    yield samples
    for fam, _, _ in fams + ests:
        yield fam
    yield classwise


def recal_metrics(r: RecalState, policy: ExportPolicy | None = None) -> Iterator[Metric]:
    def keep(family: str, segment: str) -> bool:
        return policy is None or policy.keep(family, segment)

    def win(window: str) -> bool:
        return policy is None or window in policy.windows

    g = GaugeMetricFamily("calmon_calibrated_ece",
                          "ECE of the same window after the live calibrator", labels=ROW_LABELS)
    for model, segment, window, v in r.calibrated_ece:
        if keep("calibrated_ece", segment) and win(window):
            g.add_metric([model, segment, window], v)
    yield g
    c = CounterMetricFamily("calmon_recalibrations_total", "Refits by outcome",
                            labels=("model", "segment", "method", "outcome"))
    refits = dict.fromkeys(((m, s, method, outcome) for m, s in r.series
                            for method in r.methods for outcome in OUTCOMES), 0)
    refits.update(r.recalibrations)
    for labels, n in sorted(refits.items()):
        c.add_metric(list(labels), n)
    yield c
    series = ("model", "segment")
    yield _gauge("calmon_calibrator_version", "Live calibrator version", series, r.versions)
    yield _gauge("calmon_calibrator_temperature",
                 "Temperature of the live calibrator, when temperature scaling", series,
                 {k: v for k, v in r.temperatures.items() if keep("calibrator_temperature", k[1])})
    yield _gauge("calmon_drift", "1 while a drift trigger fires",
                 ("model", "segment", "trigger"), r.drift)
    yield _gauge("calmon_calibrated_samples",
                 "Samples behind calmon_calibrated_ece (predicted after the fit)", ROW_LABELS,
                 {(m, s, w): n for m, s, w, n in r.calibrated_samples
                  if keep("calibrated_samples", s) and win(w)})
    yield _gauge("calmon_drift_evidence",
                 "Drift detector statistic over its threshold (>= 1 alarms)", series,
                 {k: v for k, v in r.drift_evidence.items() if keep("drift_evidence", k[1])})
    yield _gauge("calmon_drift_change_timestamp_seconds",
                 "Estimated start of the current change, while alarming", series,
                 {k: v for k, v in r.drift_change_ts.items()
                  if keep("drift_change_timestamp_seconds", k[1])})
    c = CounterMetricFamily("calmon_alerts_failed_total",
                            "Webhook alerts not delivered after retries")
    c.add_metric([], r.alerts_failed)
    yield c
    c = CounterMetricFamily("calmon_recalibration_overruns_total",
                            "Scheduled checks skipped because the previous one was still running "
                            "(recalibration.interval shorter than a check)")
    c.add_metric([], r.overruns)
    yield c
    if r.owned_models is not None:
        g = GaugeMetricFamily("calmon_recalibration_owned_models",
                              "Models whose recalibration this instance owns (its "
                              "partitions of kafka.joined_topic)")
        g.add_metric([], r.owned_models)
        yield g


def _series_errors(view: Snapshot, recal: RecalState | None) -> Metric:
    """Series a statistics refresh or a recalibration run skipped because computing
    them raised (each logged once): the others went on."""
    c = CounterMetricFamily("calmon_series_errors_total",
                            "Series skipped because computing them raised", labels=("stage",))
    c.add_metric(["statistics"], view.series_errors)
    if recal is not None:
        c.add_metric(["calibrated"], recal.series_errors)
    return c


def _gauge(name: str, doc: str, labels: tuple[str, ...],
           values: Mapping[Any, float]) -> GaugeMetricFamily:  # key: a label tuple
    g = GaugeMetricFamily(name, doc, labels=labels)
    for key, v in sorted(values.items()):
        g.add_metric(list(key), v)
    return g


def _le(b: float) -> str:
    return f"{b:g}" if b != int(b) else f"{int(b)}.0"
