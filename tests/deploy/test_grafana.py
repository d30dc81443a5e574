"""Checks of the provisioned Grafana dashboard and its provisioning files."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.deploy._deploy import (
    CONTRACT_METRICS,
    GRAFANA,
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
    for panel in iter_panels(DASH["panels"]):
        pos = panel["gridPos"]
        assert pos["x"] >= 0 and pos["x"] + pos["w"] <= 24, panel["title"]


def test_template_variables() -> None:
    v = variables()
    assert v["datasource"]["type"] == "datasource"
    assert v["datasource"]["query"] == "prometheus"
    for name in ("model", "segment", "window"):
        assert v[name]["type"] == "query"
        assert v[name]["datasource"] == DS_REF
        definition = v[name]["definition"]
        assert definition.startswith("label_values(") and definition.endswith(f", {name})")
        assert v[name]["query"]["query"] == definition
    assert "$model" in v["segment"]["definition"], "segment values follow the model"
    assert v["model"]["multi"] and v["model"]["includeAll"]
    assert not v["window"]["multi"], "a window is one metric name of the recording rules"


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


def test_required_panels_are_there() -> None:
    exprs = "\n".join(e for _, e in QUERIES)
    for metric in (
        "calmon_ece{",
        "calmon_mce{",
        "calmon_ace{",
        "calmon_ece_noise_floor{",
        "calmon_calibrated_ece{",
        "calmon_observed_over_expected{",
        "calmon_window_samples{",
        "calmon_join_pending",
        "calmon_label_delay_seconds_bucket",
        "calmon_invalid_records_total",
        "calmon_recalibrations_total",
        "calmon_calibrator_version",
        "calmon_calibrator_temperature",
        "model_segment_bin:calmon_bin_mean_confidence:window${window}",
        "model_segment_bin:calmon_bin_accuracy:window${window}",
        "model_segment:calmon_ece:window${window}",
    ):
        assert metric in exprs, metric
    types = {p["type"] for p in iter_panels(DASH["panels"])}
    assert {"timeseries", "barchart", "heatmap"} <= types
    [heatmap] = [p for p in iter_panels(DASH["panels"]) if p["type"] == "heatmap"]
    assert heatmap["targets"][0]["format"] == "heatmap"
    assert "by (le)" in heatmap["targets"][0]["expr"]
    annotations = [a for a in DASH["annotations"]["list"] if "expr" in a]
    assert any("calmon_recalibrations_total" in a["expr"] for a in annotations)


def test_reliability_diagram_reads_the_recording_rules() -> None:
    [panel] = [p for p in iter_panels(DASH["panels"]) if p["type"] == "barchart"]
    assert panel["options"]["xField"] == "bin"
    for target in panel["targets"]:
        assert target["instant"] and target["format"] == "table"
        assert target["expr"].startswith("model_segment_bin:calmon_bin_")
    renamed = panel["transformations"][-1]["options"]["renameByName"]
    assert set(renamed.values()) == {"mean confidence", "accuracy"}


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
        calmon = {n for n in names if "calmon_" in n}
        assert calmon, f"{where}: references no calmon metric or recording rule"
        for name in calmon:
            if ":" in name:
                assert name in rules, f"{where}: no recording rule {name}"
            else:
                assert name in CONTRACT_METRICS, f"{where}: {name} is not a contract metric"


def test_metric_name_extraction() -> None:
    names = metric_names(
        'sum by (model, le) (rate(calmon_x_total{a="b c"}[5m])) / on (model) '
        "model_segment:calmon_ece:window1h offset 1h"
    )
    assert names == {"calmon_x_total", "model_segment:calmon_ece:window1h"}


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
