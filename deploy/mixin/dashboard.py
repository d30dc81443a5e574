"""The calmon Grafana dashboard, built as data (written by generate.py).

Layout: an overview of the worst segments across every model (drill down with
its data links), then one model and one segment at a time: ECE with its band,
debiased and smooth ECE, the cluster reliability diagram as an XY chart, the
label-free estimates, data flow, the process, recalibration. Every query goes
through ``sel()`` so the job selector and the variables are never forgotten.
"""

from __future__ import annotations

from typing import Any

DS = {"type": "prometheus", "uid": "${datasource}"}
PCT = "percentunit"


class Layout:
    """Places panels left to right in rows of 24 columns, never overlapping."""

    def __init__(self) -> None:
        self.x, self.y, self.row_h = 0, 0, 0
        self.next_id = 1
        self.panels: list[dict[str, Any]] = []

    def row(self, title: str) -> None:
        self._newline()
        self.panels.append({"id": self._id(), "type": "row", "title": title, "collapsed": False,
                            "gridPos": {"h": 1, "w": 24, "x": 0, "y": self.y}, "panels": []})
        self.y += 1

    def add(self, panel: dict[str, Any], w: int = 12, h: int = 8) -> None:
        if self.x + w > 24:
            self._newline()
        panel = {"id": self._id(), **panel, "gridPos": {"h": h, "w": w, "x": self.x, "y": self.y}}
        self.panels.append(panel)
        self.x += w
        self.row_h = max(self.row_h, h)

    def _newline(self) -> None:
        self.y += self.row_h
        self.x, self.row_h = 0, 0

    def _id(self) -> int:
        self.next_id += 1
        return self.next_id - 1


def build(cfg: dict[str, Any]) -> dict[str, Any]:
    job = cfg["selector"]

    def sel(*extra: str, model: bool = True, segment: bool = True,
            window: bool = False) -> str:
        parts = [job, 'namespace=~"$namespace"']
        if model:
            parts.append('model="$model"')
        if segment:
            parts.append('segment="$segment"')
        if window:
            parts.append('window="$window"')
        return "{" + ", ".join([*parts, *extra]) + "}"

    def target(expr: str, legend: str, ref: str, **kw: Any) -> dict[str, Any]:
        return {"datasource": DS, "expr": expr, "legendFormat": legend, "refId": ref, **kw}

    def timeseries(title: str, description: str, unit: str, targets: list[dict[str, Any]],
                   axis_label: str = "", overrides: list[dict[str, Any]] | None = None,
                   minimum: float | None = None) -> dict[str, Any]:
        defaults: dict[str, Any] = {"unit": unit, "custom": {"axisLabel": axis_label,
                                                             "fillOpacity": 0,
                                                             "showPoints": "never"}}
        if minimum is not None:
            defaults["min"] = minimum
        return {"type": "timeseries", "title": title, "description": description,
                "datasource": DS, "targets": targets,
                "fieldConfig": {"defaults": defaults, "overrides": overrides or []},
                "options": {"legend": {"displayMode": "list", "placement": "bottom",
                                       "showLegend": True},
                            "tooltip": {"mode": "multi", "sort": "desc"}}}

    rec = "job_model_segment"
    rec_bin = "job_model_segment_bin"
    lay = Layout()

    # ---------------------------------------------------------------- overview
    lay.row("Overview: worst segments of every model")
    worst = (f"topk(20,\n  {rec}:calmon_ece:window$window{sel(model=False, segment=False)}\n"
             f"  - on (namespace, job, model, segment, window)\n"
             f"  max without (instance, pod) (calmon_ece_noise_floor"
             f"{sel(model=False, segment=False, window=True)})\n)")
    link = ("/d/calmon/calmon?${__url_time_range}&var-datasource=${datasource}"
            "&var-namespace=${__data.fields.namespace}&var-model=${__data.fields.model}"
            "&var-segment=${__data.fields.segment}&var-window=$window")
    lay.add({
        "type": "table", "title": "Worst segments: cluster ECE minus noise floor ($window)",
        "description": "The 20 model/segment series whose cluster-wide ECE is furthest above "
                       "what a perfectly calibrated model would show by chance. Click a row "
                       "to open that model and segment.",
        "datasource": DS,
        "targets": [target(worst, "", "A", instant=True, format="table")],
        "fieldConfig": {"defaults": {"unit": PCT, "links": [
            {"title": "Open ${__data.fields.model} / ${__data.fields.segment}", "url": link}]},
            "overrides": []},
        "options": {"showHeader": True, "sortBy": [{"displayName": "Value", "desc": True}]},
        "transformations": [{"id": "organize", "options": {
            "excludeByName": {"Time": True, "__name__": True, "job": True, "window": True},
            "renameByName": {"Value": "ECE - noise floor"}}}],
    }, w=24, h=9)

    # ---------------------------------------------------------------- calibration
    lay.row("Calibration: $model / $segment ($window)")
    lay.add(timeseries(
        "ECE with its interval", "calmon_ece per instance with the interval "
        "[calmon_ece_lower, calmon_ece_upper] at metrics.interval_level for the population "
        "ECE, and the noise floor: an ECE whose band reaches the floor may be noise.", PCT, [
            target(f"calmon_ece{sel(window=True)}", "ECE {{instance}}", "A"),
            # one band over the instances (fillBelowTo needs a fixed series name)
            target(f"min without (instance, pod) (calmon_ece_lower{sel(window=True)})",
                   "interval lower", "B"),
            target(f"max without (instance, pod) (calmon_ece_upper{sel(window=True)})",
                   "interval upper", "C"),
            target(f"calmon_ece_noise_floor{sel(window=True)}", "noise floor {{instance}}",
                   "D"),
        ], axis_label="calibration error", minimum=0, overrides=[
            {"matcher": {"id": "byFrameRefID", "options": "C"},
             "properties": [{"id": "custom.fillBelowTo", "value": "interval lower"},
                            {"id": "custom.fillOpacity", "value": 20},
                            {"id": "custom.lineWidth", "value": 0}]},
            {"matcher": {"id": "byFrameRefID", "options": "B"},
             "properties": [{"id": "custom.lineWidth", "value": 0}]},
            {"matcher": {"id": "byFrameRefID", "options": "D"},
             "properties": [{"id": "custom.lineStyle",
                             "value": {"fill": "dash", "dash": [10, 10]}}]},
        ]))
    lay.add(timeseries(
        "Debiased and smooth ECE", "Binned ECE beside the debiased l2 calibration error "
        "(Kumar et al. 2019, near 0 for a calibrated model at any sample size) and the "
        "smooth ECE (Blasiok and Nakkiran 2023, no bins).", PCT, [
            target(f"calmon_ece{sel(window=True)}", "binned ECE {{instance}}", "A"),
            target(f"calmon_ece_l2_debiased{sel(window=True)}", "debiased l2 {{instance}}",
                   "B"),
            target(f"calmon_smece{sel(window=True)}", "smooth ECE {{instance}}", "C"),
        ], axis_label="calibration error", minimum=0))
    diag_targets = [
        target(f"{rec_bin}:calmon_bin_mean_confidence:window$window{sel()}", "", "A",
               instant=True, format="table"),
        target(f"{rec_bin}:calmon_bin_accuracy:window$window{sel()}", "", "B",
               instant=True, format="table"),
        target(f"{rec_bin}:calmon_bin_samples:window$window{sel()}", "", "C",
               instant=True, format="table"),
    ]
    lay.add({
        "type": "xychart", "title": "Reliability diagram (cluster-wide)",
        "description": "One point per bin: x the mean confidence, y the accuracy (binary: "
                       "observed rate of y = 1), size the samples in the bin; on the dashed "
                       "diagonal a model is calibrated. From the recording rules, all "
                       "instances of the job.",
        "datasource": DS, "targets": diag_targets,
        "transformations": [
            {"id": "joinByField", "options": {"byField": "bin", "mode": "outer"}},
            {"id": "organize", "options": {
                "excludeByName": {"Time 1": True, "Time 2": True, "Time 3": True},
                "renameByName": {"Value #A": "mean confidence", "Value #B": "accuracy",
                                 "Value #C": "samples"}}},
            {"id": "calculateField", "options": {
                "alias": "calibrated", "mode": "binary",
                "binary": {"left": "mean confidence", "operator": "*", "right": "1"},
                "replaceFields": False}},
        ],
        "fieldConfig": {"defaults": {"unit": PCT, "min": 0, "max": 1,
                                     "custom": {"axisLabel": "", "show": "points"}},
                        "overrides": [
                            {"matcher": {"id": "byName", "options": "samples"},
                             "properties": [{"id": "unit", "value": "short"}]}]},
        "options": {"seriesMapping": "manual", "series": [
            {"name": "bins", "x": "mean confidence", "y": "accuracy",
             "pointSize": {"field": "samples", "min": 4, "max": 24}},
            {"name": "perfect calibration", "x": "mean confidence", "y": "calibrated",
             "show": "lines", "lineStyle": {"fill": "dash", "dash": [10, 10]}},
        ], "legend": {"showLegend": True, "displayMode": "list", "placement": "bottom"}},
    })
    lay.add(timeseries(
        "Cluster-wide ECE and MCE", "From the recording rules: every instance of the job "
        "pooled (exact window deltas of the bin counters).", PCT, [
            target(f"{rec}:calmon_ece:window$window{sel()}", "ECE", "A"),
            target(f"{rec}:calmon_mce:window$window{sel()}", "MCE", "B"),
        ], axis_label="calibration error", minimum=0))
    lay.add(timeseries(
        "Raw vs calibrated ECE", "ECE of the raw scores and, on predictions made after the "
        "live calibrator was fitted, after it. Scaled out, each instance's raw ECE is of its "
        "own share, and the calibrated ECE comes from the model's owner alone, over every "
        "instance's samples.", PCT, [
            target(f"calmon_ece{sel(window=True)}", "raw {{instance}}", "A"),
            target(f"calmon_calibrated_ece{sel(window=True)}", "calibrated {{instance}}", "B"),
        ], axis_label="calibration error", minimum=0))
    lay.add(timeseries(
        "Estimated vs realized accuracy", "Realized accuracy of the labelled predictions "
        "beside the accuracy expected of the predictions still waiting for their labels, "
        "read through the map learned from the labelled ones (P(y | score); the live "
        "calibrator while too few are labelled), with its band: a gap opens before any "
        "label arrives. The band counts the pending predictions' finite number and the "
        "map's fit error; a concept shift is beyond it.", PCT, [
            target(f"calmon_accuracy{sel(window=True)}", "realized {{instance}}", "A"),
            target(f"calmon_estimated_accuracy{sel(window=True)}", "estimated {{instance}}",
                   "B"),
            target(f"calmon_estimated_accuracy_lower{sel(window=True)}",
                   "band low {{instance}}", "C"),
            target(f"calmon_estimated_accuracy_upper{sel(window=True)}",
                   "band high {{instance}}", "D"),
        ], axis_label="accuracy"))
    lay.add(timeseries(
        "Score drift (PSI)", "Population stability index of the scores in the window against "
        "the live calibrator's fit data (or the previous window): above 0.25 the calibrator "
        "sees other inputs than it was fitted on.", "none", [
            target(f"calmon_score_psi{sel(window=True)}", "PSI {{instance}}", "A"),
        ], axis_label="PSI", minimum=0))
    lay.add(timeseries(
        "Observed / expected (binary models)", "sum(y) / sum(p): 1 when the mean predicted "
        "probability matches the observed rate.", "none", [
            target(f"calmon_observed_over_expected{sel(window=True)}", "{{instance}}", "A"),
        ], axis_label="observed / expected"))
    lay.add(timeseries(
        "Observed rate vs mean confidence", "Binary: observed rate of y = 1 and mean P(y=1); "
        "multiclass: mean top-label confidence.", PCT, [
            target(f"calmon_observed_rate{sel(window=True)}", "observed {{instance}}", "A"),
            target(f"calmon_mean_confidence{sel(window=True)}", "mean confidence {{instance}}",
                   "B"),
        ], axis_label="rate"))
    lay.add(timeseries(
        "Brier score and NLL", "Proper scoring rules of the window (lower is better).", "none", [
            target(f"calmon_brier{sel(window=True)}", "Brier {{instance}}", "A"),
            target(f"calmon_nll{sel(window=True)}", "NLL {{instance}}", "B"),
        ], axis_label="loss", minimum=0))
    lay.add(timeseries(
        "ACE and class-wise ECE", "Adaptive (equal-mass) ECE, and for multiclass models with "
        "metrics.classwise the mean over classes of the per-class ECE.", PCT, [
            target(f"calmon_ace{sel(window=True)}", "ACE {{instance}}", "A"),
            target(f"calmon_classwise_ece{sel(window=True)}", "class-wise {{instance}}", "B"),
        ], axis_label="calibration error", minimum=0))
    lay.add({
        "type": "state-timeline", "title": "Drift triggers",
        "description": "1 while a recalibration trigger fires.", "datasource": DS,
        "targets": [target(f"max without (instance, pod) (calmon_drift{sel()})",
                           "{{trigger}}", "A")],
        "fieldConfig": {"defaults": {"unit": "bool_on_off", "mappings": []}, "overrides": []},
        "options": {"showValue": "never"},
    }, w=24, h=5)

    # ---------------------------------------------------------------- data flow
    lay.row("Data flow")
    lay.add(timeseries(
        "Samples in the window", "Joined samples per instance and cluster-wide, and "
        "predictions still waiting for their labels.", "short", [
            target(f"calmon_window_samples{sel(window=True)}", "joined {{instance}}", "A"),
            target(f"{rec}:calmon_window_samples:window$window{sel()}", "joined, cluster",
                   "B"),
            target(f"calmon_pending_samples{sel(window=True)}", "pending {{instance}}", "C"),
        ], axis_label="samples", minimum=0))
    lay.add(timeseries(
        "Throughput", "Valid predictions, labels and joins per second.", "reqps", [
            target(f"sum without (instance, pod) (rate(calmon_predictions_total"
                   f"{sel(segment=False)}[$__rate_interval]))", "predictions", "A"),
            target(f"sum without (instance, pod) (rate(calmon_labels_total"
                   f"{sel(segment=False)}[$__rate_interval]))", "labels", "B"),
            target(f"sum without (instance, pod) (rate(calmon_joined_total"
                   f"{sel(segment=False)}[$__rate_interval]))", "joined", "C"),
        ], axis_label="records/s", minimum=0))
    bucket_sel = sel(segment=False)
    lay.add({
        "type": "heatmap", "title": "Label delay",
        "description": "Labels joined per delay bucket (label ts minus prediction ts) in each "
                       "interval: one cell per $__interval, no overlap.",
        "datasource": DS, "interval": "1m", "maxDataPoints": 200,
        # x - x offset step: each label lands in exactly one cell (increase() over
        # [step] at that step would drop increments that straddle two ranges)
        "targets": [target(
            f"sum by (le) (clamp_min(calmon_label_delay_seconds_bucket{bucket_sel}"
            f" - calmon_label_delay_seconds_bucket{bucket_sel} offset $__interval, 0))",
            "{{le}}", "A", format="heatmap")],
        "fieldConfig": {"defaults": {"unit": "s"}, "overrides": []},
        "options": {"calculate": False, "yAxis": {"unit": "s", "axisLabel": "delay"},
                    "cellValues": {"unit": "short"}, "color": {"mode": "scheme",
                                                               "scheme": "Oranges"}},
    })
    lay.add(timeseries(
        "Invalid records by reason", "Records that broke the input contract, per topic and "
        "reason.", "reqps", [
            target(f"sum by (topic, reason) (rate(calmon_invalid_records_total"
                   f"{sel(model=False, segment=False)}[$__rate_interval]))",
                   "{{topic}} {{reason}}", "A"),
        ], axis_label="records/s", minimum=0))
    lay.add(timeseries(
        "Expired and duplicate records", "Predictions expired unjoined (ttl, capacity), "
        "unmatched labels dropped, duplicates ignored, and records whose Kafka key is not "
        "their id (scaled out, they cannot co-partition).", "reqps", [
            target(f"sum by (reason) (rate(calmon_join_expired_total{sel(segment=False)}"
                   f"[$__rate_interval]))", "expired {{reason}}", "A"),
            target(f"sum (rate(calmon_labels_expired_total{sel(model=False, segment=False)}"
                   f"[$__rate_interval]))", "labels expired", "B"),
            target(f"sum by (topic) (rate(calmon_duplicates_total"
                   f"{sel(model=False, segment=False)}[$__rate_interval]))",
                   "duplicates {{topic}}", "C"),
            target(f"sum by (topic) (rate(calmon_key_mismatch_total"
                   f"{sel(model=False, segment=False)}[$__rate_interval]))",
                   "key not id {{topic}}", "D"),
        ], axis_label="records/s", minimum=0))
    lay.add(timeseries(
        "Consumer lag", "Records in each partition after calmon's position.", "short", [
            target(f"calmon_consumer_lag_records{sel(model=False, segment=False)}",
                   "{{instance}} {{topic}}/{{partition}}", "A"),
        ], axis_label="records", minimum=0))

    # ---------------------------------------------------------------- process
    lay.row("Process")
    lay.add(timeseries(
        "Checkpoint and main loop age", "Seconds since the last checkpoint and since the main "
        "loop last made progress (/healthz fails past 120 s).", "s", [
            target(f"time() - calmon_last_checkpoint_timestamp_seconds"
                   f"{sel(model=False, segment=False)}", "checkpoint {{instance}}", "A"),
            target(f"time() - calmon_loop_heartbeat_timestamp_seconds"
                   f"{sel(model=False, segment=False)}", "main loop {{instance}}", "B"),
        ], axis_label="age", minimum=0), w=8)
    lay.add(timeseries(
        "Pending joins", "Predictions waiting for their labels (all models).", "short", [
            target(f"calmon_join_pending{sel(model=False, segment=False)}", "{{instance}}",
                   "A"),
        ], axis_label="predictions", minimum=0), w=8)
    lay.add(timeseries(
        "Memory", "Resident memory of the daemon process.", "bytes", [
            target(f"process_resident_memory_bytes{sel(model=False, segment=False)}",
                   "{{instance}}", "A"),
        ], axis_label="resident", minimum=0), w=8)

    # ---------------------------------------------------------------- recalibration
    lay.row("Recalibration")
    lay.add(timeseries(
        "Refits by outcome", "Refits per interval: published, rejected (no holdout "
        "improvement, or too few samples), failed, or held (newer predictions moved from "
        "the fit data).", "short", [
            target(f"sum by (method, outcome) (increase(calmon_recalibrations_total{sel()}"
                   f"[$__rate_interval]))", "{{method}} {{outcome}}", "A"),
        ], axis_label="refits", minimum=0), w=8)
    lay.add(timeseries(
        "Calibrator version", "Version of the live calibrator.", "none", [
            target(f"max without (instance, pod) (calmon_calibrator_version{sel()})",
                   "version", "A"),
        ], axis_label="version", minimum=0), w=8)
    lay.add(timeseries(
        "Calibrator temperature", "Temperature of the live calibrator, when temperature "
        "scaling (above 1: the raw model is over-confident).", "none", [
            target(f"max without (instance, pod) (calmon_calibrator_temperature{sel()})",
                   "temperature", "A"),
        ], axis_label="temperature"), w=8)

    published = sel('outcome="published"')
    windows = list(cfg["windows"])
    default_window = cfg["alert_window"]

    def query_var(name: str, query: str, *, multi: bool, current: str,
                  include_all: bool) -> dict[str, Any]:
        var: dict[str, Any] = {
            "name": name, "label": name, "type": "query", "datasource": DS,
            "definition": query, "query": {"query": query, "refId": f"{name}-values"},
            "refresh": 2, "regex": "", "sort": 1, "multi": multi, "includeAll": include_all,
            "current": {"selected": True, "text": current, "value": current},
            "hide": 0, "options": [], "skipUrlSync": False,
        }
        if include_all:
            var["allValue"] = ".*"  # not a regex of every value
        return var

    return {
        "annotations": {"list": [
            {"builtIn": 1, "datasource": {"type": "grafana", "uid": "-- Grafana --"},
             "enable": True, "hide": True, "iconColor": "rgba(0, 211, 255, 1)",
             "name": "Annotations & Alerts", "type": "dashboard"},
            {"datasource": DS, "enable": True, "hide": False, "iconColor": "purple",
             "name": "Calibrator published",
             # exact per step, as the heatmap; the counters start at 0, so the
             # first publish shows too
             "expr": f"sum by (model, segment, method) (calmon_recalibrations_total{published}"
                     f" - calmon_recalibrations_total{published} offset $__interval) > 0",
             "step": "$__interval", "titleFormat": "Calibrator published",
             "textFormat": "{{model}} / {{segment}}: {{method}}",
             "tagKeys": "model,segment,method", "useValueForTime": False},
        ]},
        "description": "calmon: online calibration of ML classifiers (ECE with its interval, "
                       "reliability diagram, label-free estimates, drift and recalibration).",
        "editable": True,
        "fiscalYearStartMonth": 0,
        "graphTooltip": 1,
        "id": None,
        "links": [{"title": "Runbook", "type": "link", "url": cfg["runbook_url"],
                   "targetBlank": True}],
        "liveNow": False,
        "panels": lay.panels,
        "refresh": "1m",
        "schemaVersion": 39,
        "tags": ["calmon", "calibration", "ml"],
        "templating": {"list": [
            {"name": "datasource", "label": "Prometheus", "type": "datasource",
             "query": "prometheus", "current": {}, "hide": 0, "includeAll": False,
             "multi": False, "options": [], "refresh": 1, "regex": "", "skipUrlSync": False},
            query_var("namespace", f"label_values(calmon_window_samples{{{job}}}, namespace)",
                      multi=True, current="$__all", include_all=True),
            query_var("model",
                      f'label_values(calmon_window_samples{{{job}, namespace=~"$namespace"}}, '
                      "model)", multi=False, current="", include_all=False),
            query_var("segment",
                      f'label_values(calmon_window_samples{{{job}, namespace=~"$namespace", '
                      'model="$model"}, segment)', multi=False, current="__all__",
                      include_all=False),
            {"name": "window", "label": "window", "type": "custom",
             "description": "The windows the recording rules keep (deploy/mixin/config.yaml); "
                            "calmon's metrics.windows must include them.",
             "query": ",".join(windows),
             "options": [{"selected": w == default_window, "text": w, "value": w}
                         for w in windows],
             "current": {"selected": True, "text": default_window, "value": default_window},
             "multi": False, "includeAll": False, "hide": 0, "skipUrlSync": False},
        ]},
        "time": {"from": "now-24h", "to": "now"},
        "timepicker": {},
        "timezone": "",
        "title": "calmon: calibration monitor",
        "uid": "calmon",
        "version": 1,
        "weekStart": "",
    }
