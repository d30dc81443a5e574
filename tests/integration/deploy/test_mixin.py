"""deploy/mixin/generate.py: the generated files are up to date and consistent."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import yaml

from tests.integration.deploy._deploy import DASHBOARD, DEPLOY, PROM

OPERATOR = DEPLOY / "kubernetes" / "operator"


def generator() -> Any:
    spec = importlib.util.spec_from_file_location("calmon_mixin_generate",
                                                  DEPLOY / "mixin" / "generate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_generated_files_are_up_to_date() -> None:
    outputs: dict[Path, str] = generator().outputs()
    assert set(outputs) >= {PROM / "recording_rules.yml", PROM / "alert_rules.yml", DASHBOARD,
                            OPERATOR / "prometheusrule.yaml", OPERATOR / "dashboard.yaml"}
    stale = [str(p) for p, text in outputs.items() if not p.exists() or p.read_text() != text]
    assert not stale, f"run python deploy/mixin/generate.py; out of date: {stale}"


def test_operator_objects_carry_the_same_rules_and_dashboard() -> None:
    [rule] = yaml.safe_load_all((OPERATOR / "prometheusrule.yaml").read_text())
    recording = yaml.safe_load((PROM / "recording_rules.yml").read_text())["groups"]
    alerts = yaml.safe_load((PROM / "alert_rules.yml").read_text())["groups"]
    assert rule["kind"] == "PrometheusRule"
    assert rule["spec"]["groups"] == recording + alerts
    [cm] = yaml.safe_load_all((OPERATOR / "dashboard.yaml").read_text())
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(cm["data"]["calmon.json"]) == json.loads(DASHBOARD.read_text())


def test_monitors_produce_the_job_the_selector_expects() -> None:
    config = yaml.safe_load((DEPLOY / "mixin" / "config.yaml").read_text())
    assert config["selector"] == 'job="calmon"'
    pod_labels = {}
    for path in (DEPLOY / "kubernetes" / "overlays").rglob("*.yaml"):  # the workloads
        for doc in yaml.safe_load_all(path.read_text()):
            if isinstance(doc, dict) and doc.get("kind") in ("Deployment", "StatefulSet"):
                pod_labels[doc["metadata"]["name"]] = doc["spec"]["template"]["metadata"][
                    "labels"]
    assert pod_labels
    for name in ("podmonitor.yaml", "servicemonitor.yaml"):
        [mon] = yaml.safe_load_all((OPERATOR / name).read_text())
        job_label = mon["spec"]["jobLabel"]
        selector = mon["spec"]["selector"]["matchLabels"]
        if mon["kind"] == "PodMonitor":
            for workload, labels in pod_labels.items():
                assert selector.items() <= labels.items(), workload
                assert labels[job_label] == "calmon", workload
        endpoints = mon["spec"].get("podMetricsEndpoints") or mon["spec"]["endpoints"]
        assert [e["port"] for e in endpoints] == ["metrics"]


def test_check_refuses_placeholder_links(tmp_path: Path, capsys) -> None:
    """The shipped links are placeholders: `--check` (what CI runs on a deployment's copy)
    refuses them until a cluster's own URLs are set, and accepts those."""
    gen = generator()
    shipped = yaml.safe_load((DEPLOY / "mixin" / "config.yaml").read_text())
    assert len(gen.placeholders(shipped)) == 2
    assert gen.main(["--check"]) == 1
    assert "runbook_url" in capsys.readouterr().out
    mine = dict(shipped, runbook_url="https://wiki.acme.io/calmon/runbook",
                dashboard_url="https://grafana.acme.io/d/calmon/calmon")
    assert gen.placeholders(mine) == []
    cfg = tmp_path / "mixin.yaml"
    cfg.write_text(yaml.safe_dump(mine))
    outputs = gen.outputs(cfg)
    alerts = next(text for p, text in outputs.items() if p.name == "alert_rules.yml")
    assert "https://wiki.acme.io/calmon/runbook#" in alerts and "example.com" not in alerts
