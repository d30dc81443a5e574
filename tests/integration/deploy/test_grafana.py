"""Checks of the provisioned Grafana dashboard and its provisioning files."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.integration.deploy._deploy import (
    CONTRACT_METRICS,
    DEPLOY,
    GRAFANA,
    METRIC_LABELS,
    SAMPLE_VARIABLES,
    dashboard_queries,
    iter_panels,
    load_dashboard,
    recording_rule_names,
    substitute,
)

DASH = load_dashboard()
QUERIES = dashboard_queries(DASH)
WINDOWS = ["1h", "24h", "7d"]
DS_REF = {"type": "prometheus", "uid": "${datasource}"}

# A metric name (with ':' for recording rules) not followed by '(' (a function).
_NAME = re.compile(r"(?<![\w:\"'.])([a-zA-Z_:][\w:]*)(?=\s*[{\[)\s]|$)")
_PROMQL_WORDS = {
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "offset",
    "bool",
    "and",
    "or",
    "unless",
    "le",
    "sum",
    "min",
    "max",
    "avg",
    "count",
    "group",
    "stddev",
    "stdvar",
    "topk",
    "bottomk",
    "quantile",
    "count_values",
}


def variables() -> dict[str, dict]:
    return {v["name"]: v for v in DASH["templating"]["list"]}


def metric_names(expr: str) -> set[str]:
    no_strings = re.sub(r'"[^"]*"', '""', expr)
    no_ranges = re.sub(r"\[[^\]]*\]", "[]", no_strings)
    no_groupings = re.sub(
        r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", r"\1", no_ranges
    )
    return {n for n in _NAME.findall(no_groupings) if n not in _PROMQL_WORDS}


def test_dashboard_basics() -> None:
    assert DASH["uid"] == "calmon"
    assert 36 <= DASH["schemaVersion"] <= 41
    assert DASH["title"]
    ids = [p["id"] for p in iter_panels(DASH["panels"])]
    assert len(ids) == len(set(ids)), "panel ids are unique"


def test_no_panel_overlaps_another() -> None:
    boxes: list[tuple[str, set[tuple[int, int]]]] = []
    for panel in iter_panels(DASH["panels"]):
        pos = panel["gridPos"]
        assert pos["x"] >= 0 and pos["w"] > 0 and pos["x"] + pos["w"] <= 24, panel["title"]
        cells = {(x, y) for x in range(pos["x"], pos["x"] + pos["w"])
                 for y in range(pos["y"], pos["y"] + pos["h"])}
        for title, other in boxes:
            assert not cells & other, f"{panel['title']!r} overlaps {title!r}"
        boxes.append((panel["title"], cells))


def test_template_variables() -> None:
    v = variables()
    assert v["datasource"]["type"] == "datasource"
    assert v["datasource"]["query"] == "prometheus"
    for name in ("namespace", "model", "segment"):
        assert v[name]["type"] == "query"
        assert v[name]["datasource"] == DS_REF
        definition = v[name]["definition"]
        assert definition.startswith("label_values(") and definition.endswith(f", {name})")
        assert 'job="calmon"' in definition
        assert v[name]["query"]["query"] == definition
    assert '$model' in v["segment"]["definition"], "segment values follow the model"
    assert '$namespace' in v["model"]["definition"]
    # the reliability diagram and every per-series panel show ONE model and segment
    assert not v["model"]["multi"] and not v["model"]["includeAll"]
    assert not v["segment"]["multi"] and not v["segment"]["includeAll"]
    for var in v.values():  # "All" is .*, never a regex listing every value
        if var.get("includeAll"):
            assert var["allValue"] == ".*", var["name"]
    # the window is one of the recorded windows: any other would empty the cluster panels
    mixin = yaml.safe_load((DEPLOY / "mixin" / "config.yaml").read_text())
    assert v["window"]["type"] == "custom" and not v["window"]["multi"]
    assert [o["value"] for o in v["window"]["options"]] == list(mixin["windows"])
    assert v["window"]["query"].split(",") == list(mixin["windows"])


def test_every_panel_uses_the_datasource_variable() -> None:
    for panel in iter_panels(DASH["panels"]):
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == DS_REF, panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == DS_REF, panel["title"]
    for ann in DASH["annotations"]["list"]:
        if "expr" in ann:
            assert ann["datasource"] == DS_REF


# The overview table lists the worst segments of every model: it honours the
# namespace and window, not model and segment (its links set those).
OVERVIEW = "Worst segments"
_SELECTOR = re.compile(r"([a-zA-Z_:][\w:$]*)\s*\{([^}]*)\}")


def honoured(where: str, expr: str) -> list[str]:
    """What the query ignores among the variables its metrics should honour."""
    missing = []
    selectors = _SELECTOR.findall(expr)
    assert selectors, f"{where}: no selector"
    for name, matchers in selectors:
        if name.startswith("label_values"):
            continue
        need = ['job="calmon"', 'namespace=~"$namespace"']
        recorded = ":" in name
        labels = (("model", "segment", "window") if recorded
                  else METRIC_LABELS.get(name, ()))
        if OVERVIEW not in where:
            need += [f'{label}="${label}"' for label in ("model", "segment") if label in labels]
        if "window" in labels and not (recorded and name.endswith("window$window")):
            need.append('window="$window"')
        if recorded:
            assert name.endswith("window$window"), f"{where}: {name} ignores $window"
        missing += [f"{name}: {n}" for n in need if n not in matchers]
    return missing


@pytest.mark.parametrize("where,expr", QUERIES, ids=[w for w, _ in QUERIES])
def test_every_query_honours_the_variables(where: str, expr: str) -> None:
    assert not honoured(where, expr), f"{where}: {honoured(where, expr)}"


def test_the_variable_check_catches_a_query_that_ignores_model() -> None:
    assert honoured("panel 'x'", 'calmon_ece{job="calmon", namespace=~"$namespace", '
                                 'window="$window"}') == [
        'calmon_ece: model="$model"', 'calmon_ece: segment="$segment"']
    assert honoured("panel 'x'", "sum(rate(calmon_labels_total{job=\"calmon\"}[5m]))")


AXIS_PANELS = {"timeseries", "xychart", "barchart", "stat", "table", "state-timeline"}


def test_every_axis_has_a_unit() -> None:
    for panel in iter_panels(DASH["panels"]):
        if panel["type"] == "row":
            continue
        title = panel["title"]
        if panel["type"] == "heatmap":
            assert panel["options"]["yAxis"]["unit"], title
            continue
        assert panel["type"] in AXIS_PANELS, title
        defaults = panel["fieldConfig"]["defaults"]
        assert defaults.get("unit"), f"{title}: no unit"
        if defaults["unit"] == "none" and panel["type"] == "timeseries":
            assert defaults["custom"]["axisLabel"], f"{title}: dimensionless and unlabelled"
        # one unit per axis: an override may only change the unit of the point size
        for override in panel["fieldConfig"]["overrides"]:
            for prop in override["properties"]:
                if prop["id"] == "unit":
                    sizes = [s["pointSize"]["field"] for s in panel["options"].get("series", [])
                             if "pointSize" in s]
                    assert override["matcher"]["options"] in sizes, f"{title}: mixed units"


def test_required_panels_are_there() -> None:
    exprs = "\n".join(e for _, e in QUERIES)
    for metric in (
        "calmon_ece{", "calmon_mce", "calmon_ace{", "calmon_ece_noise_floor{",
        "calmon_calibrated_ece{", "calmon_observed_over_expected{", "calmon_window_samples{",
        "calmon_join_pending", "calmon_label_delay_seconds_bucket", "calmon_invalid_records_total",
        "calmon_recalibrations_total", "calmon_calibrator_version", "calmon_calibrator_temperature",
        "calmon_classwise_ece{", "calmon_consumer_lag_records",
        # issue 11: the interval, debiased and smooth ECE, label-free estimates
        "calmon_ece_lower{", "calmon_ece_upper{", "calmon_ece_l2_debiased{", "calmon_smece{",
        "calmon_estimated_accuracy{", "calmon_accuracy{", "calmon_score_psi{",
        "job_model_segment_bin:calmon_bin_mean_confidence:window$window",
        "job_model_segment_bin:calmon_bin_accuracy:window$window",
        "job_model_segment_bin:calmon_bin_samples:window$window",
        "job_model_segment:calmon_ece:window$window",
    ):
        assert metric in exprs, metric
    [band] = [p for p in iter_panels(DASH["panels"]) if p["title"] == "ECE with its interval"]
    fills = [prop for o in band["fieldConfig"]["overrides"] for prop in o["properties"]
             if prop["id"] == "custom.fillBelowTo"]
    assert fills, "the interval is drawn as a band"
    legends = {t["legendFormat"] for t in band["targets"]}
    assert all(f["value"] in legends for f in fills), "fillBelowTo names a series"
    [heatmap] = [p for p in iter_panels(DASH["panels"]) if p["type"] == "heatmap"]
    target = heatmap["targets"][0]
    assert target["format"] == "heatmap" and "by (le)" in target["expr"]
    # one cell per step: the change since one step ago, so cells never overlap and no
    # label falls between two cells
    assert "offset $__interval" in target["expr"] and "$__rate_interval" not in target["expr"]
    annotations = [a for a in DASH["annotations"]["list"] if "expr" in a]
    assert any('outcome="published"' in a["expr"] for a in annotations)


def test_reliability_diagram_is_an_xy_chart_of_one_series() -> None:
    [panel] = [p for p in iter_panels(DASH["panels"]) if p["type"] == "xychart"]
    for target in panel["targets"]:
        assert target["instant"] and target["format"] == "table"
        assert target["expr"].startswith("job_model_segment_bin:calmon_bin_")
        assert 'model="$model"' in target["expr"] and 'segment="$segment"' in target["expr"]
    renamed = next(t for t in panel["transformations"] if t["id"] == "organize")
    assert set(renamed["options"]["renameByName"].values()) == {
        "mean confidence", "accuracy", "samples"}
    series = {s["name"]: s for s in panel["options"]["series"]}
    assert series["bins"]["x"] == "mean confidence" and series["bins"]["y"] == "accuracy"
    assert series["bins"]["pointSize"]["field"] == "samples"
    diagonal = series["perfect calibration"]
    assert diagonal["x"] == "mean confidence" and diagonal["y"] == "calibrated"
    defaults = panel["fieldConfig"]["defaults"]
    assert defaults["unit"] == "percentunit" and (defaults["min"], defaults["max"]) == (0, 1)


def test_worst_segments_table_drills_down() -> None:
    [table] = [p for p in iter_panels(DASH["panels"]) if p["title"].startswith(OVERVIEW)]
    [target] = table["targets"]
    assert target["expr"].startswith("topk(")
    assert "calmon_ece_noise_floor" in target["expr"]
    [link] = table["fieldConfig"]["defaults"]["links"]
    for var in ("model", "segment", "namespace"):
        assert f"var-{var}=${{__data.fields.{var}}}" in link["url"]
    assert "var-window=$window" in link["url"]


@pytest.mark.parametrize("where,expr", QUERIES, ids=[w for w, _ in QUERIES])
def test_query_is_sane_after_substitution(where: str, expr: str) -> None:
    used = set(re.findall(r"\$\{?(\w+)", expr))
    assert used <= set(SAMPLE_VARIABLES), f"{where}: unknown variables {used}"
    rules = recording_rule_names()
    for window in WINDOWS:
        text = substitute(expr, dict(SAMPLE_VARIABLES, window=window))
        assert "$" not in text
        for open_, close in ("()", "{}", "[]"):
            depth = 0
            for ch in text:
                depth += (ch == open_) - (ch == close)
                assert depth >= 0, f"{where}: unbalanced {open_}{close}"
            assert depth == 0, f"{where}: unbalanced {open_}{close}"
        assert text.count('"') % 2 == 0
        names = metric_names(text)
        calmon = {n for n in names if "calmon_" in n or n.startswith("process_")}
        assert calmon, f"{where}: references no calmon metric or recording rule"
        for name in calmon:
            if name.startswith("process_"):
                continue  # prometheus_client's process collector
            if ":" in name:
                assert name in rules, f"{where}: no recording rule {name}"
            else:
                assert name in CONTRACT_METRICS, f"{where}: {name} is not a contract metric"


def test_metric_name_extraction() -> None:
    names = metric_names(
        'sum by (model, le) (rate(calmon_x_total{a="b c"}[5m])) / on (model) '
        "job_model_segment:calmon_ece:window1h offset 1h"
    )
    assert names == {"calmon_x_total", "job_model_segment:calmon_ece:window1h"}


@pytest.mark.skipif(
    shutil.which("promtool") is None, reason="promtool is not on PATH (apt-get install prometheus)"
)
def test_queries_parse_as_promql(tmp_path: Path) -> None:
    rules = [
        {"record": f"dashboard:query:{i}", "expr": substitute(expr)}
        for i, (_, expr) in enumerate(QUERIES)
    ]
    path = tmp_path / "dashboard_queries.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    proc = subprocess.run(
        ["promtool", "check", "rules", "--lint=none", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_provisioning_files() -> None:
    dashboards = yaml.safe_load((GRAFANA / "provisioning" / "dashboards.yaml").read_text())
    assert dashboards["apiVersion"] == 1
    [provider] = dashboards["providers"]
    assert provider["type"] == "file" and provider["options"]["path"]
    datasources = yaml.safe_load((GRAFANA / "provisioning" / "datasources.yaml").read_text())
    assert datasources["apiVersion"] == 1
    assert any(d["type"] == "prometheus" for d in datasources["datasources"])
    # Grafana refuses a second default next to kube-prometheus-stack's own
    assert not any(d.get("isDefault") for d in datasources["datasources"])
