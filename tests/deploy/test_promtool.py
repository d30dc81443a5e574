"""deploy/prometheus: promtool checks and unit tests, plus the rules' conventions."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
import yaml

from tests.deploy._deploy import PROM, ROOT

PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None,
    reason="promtool is not on PATH (Debian/Ubuntu: apt-get install prometheus)",
)

ALERTS = yaml.safe_load((PROM / "alert_rules.yml").read_text())
RECORDING = yaml.safe_load((PROM / "recording_rules.yml").read_text())
TESTS = yaml.safe_load((PROM / "tests.yml").read_text())
WINDOWS = ["1h", "24h", "7d"]
REQUIRED_ALERTS = {
    "CalibrationDrift",
    "RecalibrationPublished",
    "RecalibrationRejected",
    "RecalibrationFailed",
    "LabelJoinBacklog",
    "LabelsStoppedArriving",
    "InvalidRecordsSpike",
    "CalmonDown",
}


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run([PROMTOOL, *args], cwd=ROOT, capture_output=True, text=True, timeout=120)


@needs_promtool
def test_check_config() -> None:
    proc = promtool("check", "config", "deploy/prometheus/prometheus.yml")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "2 rule files found" in proc.stdout + proc.stderr


@needs_promtool
def test_check_rules() -> None:
    proc = promtool(
        "check",
        "rules",
        "deploy/prometheus/recording_rules.yml",
        "deploy/prometheus/alert_rules.yml",
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


@needs_promtool
def test_rule_unit_tests() -> None:
    proc = promtool("test", "rules", "deploy/prometheus/tests.yml")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def alert_rules() -> list[dict]:
    return [r for g in ALERTS["groups"] for r in g["rules"]]


def recording_rules() -> list[dict]:
    return [r for g in RECORDING["groups"] for r in g["rules"]]


def test_prometheus_yml_loads_the_rule_files() -> None:
    config = yaml.safe_load((PROM / "prometheus.yml").read_text())
    assert set(config["rule_files"]) == {"recording_rules.yml", "alert_rules.yml"}
    for name in config["rule_files"]:
        assert (PROM / name).is_file()
    jobs = {j["job_name"]: j for j in config["scrape_configs"]}
    assert "calmon" in jobs
    assert set(TESTS["rule_files"]) == set(config["rule_files"])


def test_alerts_have_severity_and_annotations() -> None:
    names = set()
    for rule in alert_rules():
        names.add(rule["alert"])
        assert rule["labels"]["severity"] in {"info", "warning", "critical"}, rule["alert"]
        annotations = rule["annotations"]
        assert {"summary", "description"} <= set(annotations), rule["alert"]
        text = annotations["summary"] + annotations["description"]
        assert "$labels" in text or "$value" in text, rule["alert"]
    assert names >= REQUIRED_ALERTS


def test_every_alert_is_tested_firing_and_not_firing() -> None:
    fired, quiet = set(), set()
    for case in TESTS["tests"]:
        for t in case.get("alert_rule_test", []):
            (fired if t.get("exp_alerts") else quiet).add(t["alertname"])
    names = {r["alert"] for r in alert_rules()}
    assert names <= fired, f"never tested firing: {names - fired}"
    assert names <= quiet, f"never tested quiet: {names - quiet}"
    # Alerts with two rules (same name): each rule fires in some test.
    for rule in alert_rules():
        static = {k: v for k, v in rule["labels"].items() if k != "severity"}
        if not static:
            continue
        assert any(
            static.items() <= a["exp_labels"].items()
            for case in TESTS["tests"]
            for t in case.get("alert_rule_test", [])
            for a in t.get("exp_alerts") or []
            if t["alertname"] == rule["alert"]
        ), f"{rule['alert']} {static} never fires in tests.yml"


def test_recording_rule_names_and_windows() -> None:
    pattern = re.compile(r"^[a-z_]+:calmon_[a-z_]+:window(\d+[smhdw])$")
    for rule in recording_rules():
        m = pattern.match(rule["record"])
        assert m, f"{rule['record']} is not level:metric:operations"
        assert rule["labels"]["window"] == m.group(1)
        assert "increase(" not in rule["expr"] and "rate(" not in rule["expr"], (
            "window counts must be exact deltas, not extrapolated"
        )
    names = {r["record"] for r in recording_rules()}
    for window in WINDOWS:
        for family in (
            "model_segment_bin:calmon_bin_samples",
            "model_segment_bin:calmon_bin_confidence",
            "model_segment_bin:calmon_bin_correct",
            "model_segment_bin:calmon_bin_mean_confidence",
            "model_segment_bin:calmon_bin_accuracy",
            "model_segment:calmon_window_samples",
            "model_segment:calmon_ece",
            "model_segment:calmon_mce",
            "model_segment:calmon_mean_confidence",
        ):
            assert f"{family}:window{window}" in names


def test_recording_rules_are_unit_tested() -> None:
    tested = " ".join(
        t["expr"] for case in TESTS["tests"] for t in case.get("promql_expr_test", [])
    )
    for rule in recording_rules():
        if rule["record"].endswith(":window1h"):
            assert rule["record"] in tested, f"{rule['record']} has no promql_expr_test"
    for window in WINDOWS:
        assert f"model_segment:calmon_ece:window{window}" in tested
