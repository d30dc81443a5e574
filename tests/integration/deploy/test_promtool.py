"""deploy/prometheus: promtool checks and unit tests, plus the rules' conventions."""

from __future__ import annotations

import itertools
import re
import shutil
import subprocess

import pytest
import yaml

from tests.integration.deploy._deploy import PROM, ROOT

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
    "CalmonCalibrationDrift",
    "CalmonECEAboveNoiseFloor",
    "CalmonEstimatedAccuracyDrop",
    "CalmonScoreShift",
    "CalmonRecalibrationRejected",
    "CalmonRecalibrationFailed",
    "CalmonLabelJoinBacklog",
    "CalmonLabelsStoppedArriving",
    "CalmonLabelsNotJoining",
    "CalmonInvalidRecordsSpike",
    "CalmonConsumerLag",
    "CalmonCheckpointTooOld",
    "CalmonTaskRestoreStuck",
    "CalmonRebalanceStorm",
    "CalmonMainLoopStalled",
    "CalmonTargetDown",
    "CalmonTargetMissing",
}
# Refit reports the daemon's webhook sends (calmon/recal/alerts.py, severity info) with
# the parameters no metric carries; no Prometheus rule may use their names.
WEBHOOK_ONLY = {"CalmonRefitPublished", "CalmonRefitRejected"}
RUNBOOK = ROOT / "docs" / "runbook.md"


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run([PROMTOOL, *args], cwd=ROOT, capture_output=True, text=True, timeout=120)


@needs_promtool
def test_check_config() -> None:
    proc = promtool("check", "config", "deploy/prometheus/prometheus.yml")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "2 rule files found" in proc.stdout + proc.stderr
    config = yaml.safe_load((PROM / "prometheus.yml").read_text())
    assert [j["job_name"] for j in config["scrape_configs"]] == ["calmon"]


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


def test_alerts_have_severity_annotations_and_links() -> None:
    names = set()
    runbook = RUNBOOK.read_text()
    for rule in alert_rules():
        name = rule["alert"]
        names.add(name)
        assert name.startswith("Calmon"), name
        # nothing here needs a person at 3 am: calibration degrades, it does not break
        # serving; Kubernetes restarts a stuck loop by itself
        assert rule["labels"]["severity"] in {"info", "warning"}, name
        annotations = rule["annotations"]
        assert set(annotations) == {"summary", "description", "runbook_url", "dashboard_url"}
        text = annotations["summary"] + annotations["description"]
        assert "$labels" in text or "$value" in text, name
        assert annotations["runbook_url"].endswith(f"runbook.md#{name.lower()}"), name
        assert f"\n## {name}\n" in runbook, f"docs/runbook.md has no section {name}"
        assert annotations["dashboard_url"].startswith("http"), name
        if "$labels.segment" in text:  # per-series alerts open the dashboard on theirs
            assert "var-model={{ $labels.model | urlquery }}" in annotations["dashboard_url"]
            assert "var-segment={{ $labels.segment | urlquery }}" in annotations["dashboard_url"]
        assert 'job="calmon"' in rule["expr"] or name == "CalmonECEAboveNoiseFloor", name
        assert "unless" not in rule["expr"] or "offset" not in rule["expr"], (
            f"{name}: no 'series born' branch (the counters are pre-created at 0)")
    assert names == REQUIRED_ALERTS
    assert not names & WEBHOOK_ONLY


def test_every_description_claims_the_time_its_tests_check() -> None:
    """An alert with ``for: N`` says N minutes in its description, and tests.yml checks
    it quiet one evaluation before and firing at the time the description claims."""
    for rule in alert_rules():
        if "for" in rule:
            minutes = int(rule["for"].rstrip("m"))
            assert f"{minutes} minutes" in rule["annotations"]["description"], rule["alert"]
        times = sorted(
            (int(t["eval_time"].rstrip("m")), bool(t.get("exp_alerts")))
            for case in TESTS["tests"] for t in case.get("alert_rule_test", [])
            if t["alertname"] == rule["alert"])
        # quiet, then firing one evaluation later (two where promtool's group order
        # may delay an alert on recorded series by one evaluation)
        assert any(not fired_before and fired_at and t1 - t0 <= 2
                   for (t0, fired_before), (t1, fired_at) in itertools.pairwise(times)), (
            f"{rule['alert']}: no quiet-then-firing check")


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
    intervals = {g["name"]: g.get("interval") for g in RECORDING["groups"]}
    assert intervals == {"calmon-window-1h": "1m", "calmon-window-24h": "5m",
                         "calmon-window-7d": "30m"}
    for rule in recording_rules():
        m = pattern.match(rule["record"])
        assert m, f"{rule['record']} is not level:metric:operations"
        assert rule["labels"]["window"] == m.group(1)
        assert "increase(" not in rule["expr"] and "rate(" not in rule["expr"], (
            "window counts must be exact deltas, not extrapolated"
        )
        assert " by (" not in rule["expr"].replace("count by (namespace, job)", ""), (
            f"{rule['record']}: aggregate without (instance, pod), keeping job and namespace")
        for metric in re.findall(r"\b(calmon_\w+|process_\w+)\{([^}]*)\}", rule["expr"]):
            assert 'job="calmon"' in metric[1], f"{rule['record']}: {metric[0]} unselected"
    names = {r["record"] for r in recording_rules()}
    for window in WINDOWS:
        for family in (
            "instance:calmon_window_mode",
            "job_model_segment_bin:calmon_bin_samples",
            "job_model_segment_bin:calmon_bin_confidence",
            "job_model_segment_bin:calmon_bin_correct",
            "job_model_segment_bin:calmon_bin_mean_confidence",
            "job_model_segment_bin:calmon_bin_accuracy",
            "job_model_segment:calmon_window_samples",
            "job_model_segment:calmon_ece",
            "job_model_segment:calmon_mce",
            "job_model_segment:calmon_mean_confidence",
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
        assert f"job_model_segment:calmon_ece:window{window}" in tested
