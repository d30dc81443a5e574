"""Shared helpers for the deploy/ tests: paths, config expansion, dashboard queries."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[3]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "kubernetes"
PROM = DEPLOY / "prometheus"
GRAFANA = DEPLOY / "grafana"
DASHBOARD = GRAFANA / "dashboards" / "calmon.json"

# CONTRACT.md section 0: every config key and its sub-keys (None: free-form value).
CONTRACT_CONFIG_KEYS: dict[str, set[str] | None] = {
    "kafka": {
        "bootstrap_servers",
        "group_id",
        "predictions_topic",
        "labels_topic",
        "dead_letter_topic",
        "calibrators_topic",
        "auto_offset_reset",
        "max_record_bytes",
        "instance",
        "client",
        "library",
        "max_clock_skew",
        "joined_topic",
        "state_changelog_topic",  # v4
    },
    "limits": {"max_models", "max_classes", "max_id_bytes", "max_name_bytes", "max_series",
               "memory"},
    "fields": {"id", "model", "ts", "segment", "label"},
    "join": {"ttl", "label_ttl", "max_pending", "missing_label"},
    "metrics": {"bins", "fine_bins", "windows", "classwise", "mce_min_samples",
                "interval_level", "refresh", "export"},  # v3: refresh, export
    "segments": {"slices", "max_values"},
    "recalibration": {
        "enabled",
        "interval",
        "method",
        "per_segment",
        "min_samples",
        "buffer",
        "holdout_fraction",
        "cooldown",
        "alpha",
        "window",
        "triggers",
        "output_dir",
    },
    "alerts": {"webhook"},
    "server": {"host", "port"},
    "state": {"dir", "checkpoint_interval", "on_corrupt"},
}

# CONTRACT.md section 5.
CONTRACT_METRICS = {
    "calmon_ece",
    "calmon_mce",
    "calmon_ace",
    "calmon_brier",
    "calmon_nll",
    "calmon_accuracy",
    "calmon_mean_confidence",
    "calmon_observed_rate",
    "calmon_observed_over_expected",
    "calmon_window_samples",
    "calmon_ece_noise_floor",
    "calmon_calibrated_ece",
    "calmon_bin_samples_total",
    "calmon_bin_confidence_total",
    "calmon_bin_correct_total",
    "calmon_predictions_total",
    "calmon_labels_total",
    "calmon_joined_total",
    "calmon_join_expired_total",
    "calmon_labels_expired_total",
    "calmon_duplicates_total",
    "calmon_join_pending",
    "calmon_label_delay_seconds",
    "calmon_label_delay_seconds_bucket",
    "calmon_label_delay_seconds_count",
    "calmon_label_delay_seconds_sum",
    "calmon_invalid_records_total",
    "calmon_recalibrations_total",
    "calmon_calibrator_version",
    "calmon_calibrator_temperature",
    "calmon_drift",
    "calmon_last_checkpoint_timestamp_seconds",
    "calmon_classwise_ece",
    # v2 (CONTRACT.md section 5)
    "calmon_ece_l2_debiased",
    "calmon_smece",
    "calmon_ece_lower",
    "calmon_ece_upper",
    "calmon_pending_samples",
    "calmon_estimated_accuracy",
    "calmon_estimated_positive_rate",
    "calmon_score_psi",
    "calmon_calibrated_samples",
    "calmon_drift_evidence",
    "calmon_drift_change_timestamp_seconds",
    "calmon_dead_letters_failed_total",
    "calmon_alerts_failed_total",
    # v3 (CONTRACT.md section 5)
    "calmon_key_mismatch_total",
    # v5 (CONTRACT.md section 5)
    "calmon_estimated_accuracy_lower",
    "calmon_estimated_accuracy_upper",
    "calmon_estimated_correct",
    "calmon_estimated_correct_variance",
    # issue 12: the daemon's own health (to be added to the contract)
    "calmon_build_info",
    "calmon_consumer_lag_records",
    "calmon_loop_heartbeat_timestamp_seconds",
}
# Labels each metric carries besides the target's (CONTRACT.md section 5), for
# the dashboard's variable checks.
ROW = ("model", "segment", "window")
METRIC_LABELS: dict[str, tuple[str, ...]] = {
    **dict.fromkeys(
        ["calmon_ece", "calmon_mce", "calmon_ace", "calmon_brier", "calmon_nll",
         "calmon_accuracy", "calmon_mean_confidence", "calmon_observed_rate",
         "calmon_observed_over_expected", "calmon_window_samples", "calmon_ece_noise_floor",
         "calmon_calibrated_ece", "calmon_classwise_ece", "calmon_ece_l2_debiased",
         "calmon_smece", "calmon_ece_lower", "calmon_ece_upper", "calmon_pending_samples",
         "calmon_estimated_accuracy", "calmon_estimated_positive_rate", "calmon_score_psi",
         "calmon_calibrated_samples", "calmon_estimated_accuracy_lower",
         "calmon_estimated_accuracy_upper", "calmon_estimated_correct",
         "calmon_estimated_correct_variance"], ROW),
    **dict.fromkeys(
        ["calmon_bin_samples_total", "calmon_bin_confidence_total", "calmon_bin_correct_total",
         "calmon_recalibrations_total", "calmon_calibrator_version",
         "calmon_calibrator_temperature", "calmon_drift", "calmon_drift_evidence",
         "calmon_drift_change_timestamp_seconds"], ("model", "segment")),
    **dict.fromkeys(
        ["calmon_predictions_total", "calmon_labels_total", "calmon_joined_total",
         "calmon_join_expired_total", "calmon_label_delay_seconds_bucket"], ("model",)),
}

_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def expand_env(text: str, env: Mapping[str, str]) -> str:
    """Expand ``${VAR}`` and ``${VAR:-default}`` as calmon's config loader does.

    A variable that is unset and has no default raises KeyError.
    """

    def repl(m: re.Match[str]) -> str:
        name, default = m.group(1), m.group(2)
        if name in env and env[name] != "":
            return env[name]
        if default is not None:
            return default
        raise KeyError(f"${{{name}}} is not set and has no default")

    return _ENV_REF.sub(repl, text)


OVERLAYS = ("sidecar", "scaled-out", "group", "group-static")


def kustomize(directory: Path) -> list[dict[str, Any]]:
    """``kubectl kustomize DIR``: the objects a ``kubectl apply -k DIR`` would send."""
    import shutil
    import subprocess

    kubectl = shutil.which("kubectl")
    if kubectl is None:
        import pytest

        pytest.skip("kubectl is not on PATH: it renders the kustomize overlays",
                    allow_module_level=True)
    out = subprocess.run([kubectl, "kustomize", str(directory)], capture_output=True,
                         text=True, timeout=120, check=True).stdout
    return [d for d in yaml.safe_load_all(out) if d is not None]


def load_manifests() -> list[tuple[Path, dict[str, Any]]]:
    """Every object of each rendered overlay (with the overlay's directory) and of every
    YAML file under deploy/kubernetes/operator (with its file)."""
    docs = [(K8S / "overlays" / name, doc) for name in OVERLAYS
            for doc in kustomize(K8S / "overlays" / name)]
    for path in sorted((K8S / "operator").glob("*.y*ml")):
        with path.open() as f:
            for doc in yaml.safe_load_all(f):
                if doc is not None:
                    docs.append((path, doc))
    return docs


def load_dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def iter_panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in panels:
        yield panel
        yield from iter_panels(panel.get("panels", []))


def dashboard_queries(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """(where, expression) for every panel target and annotation query."""
    out = []
    for panel in iter_panels(dashboard["panels"]):
        for target in panel.get("targets", []):
            if target.get("expr"):
                out.append((f"panel {panel['title']!r} target {target['refId']}", target["expr"]))
    for ann in dashboard.get("annotations", {}).get("list", []):
        if ann.get("expr"):
            out.append((f"annotation {ann['name']!r}", ann["expr"]))
    return out


# Sample values for Grafana's variables, as Grafana would interpolate them.
SAMPLE_VARIABLES = {
    "__rate_interval": "1m",
    "__interval": "2s",  # the test Prometheus scrapes every second
    "__range": "1h",
    "namespace": ".*",
    "model": "ctr",
    "segment": "__all__",
    "window": "1h",
}

_VAR_REF = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)")


def substitute(expr: str, values: Mapping[str, str] = SAMPLE_VARIABLES) -> str:
    """Interpolate ``$var`` and ``${var}`` (unknown variables raise KeyError)."""

    def repl(m: re.Match[str]) -> str:
        return values[m.group(1) or m.group(2)]

    return _VAR_REF.sub(repl, expr)


def recording_rule_names() -> set[str]:
    data = yaml.safe_load((PROM / "recording_rules.yml").read_text())
    return {r["record"] for g in data["groups"] for r in g["rules"] if "record" in r}


def fast_rule_files(tmp: Path) -> list[str]:
    """Copies of the rule files for a test Prometheus, every group evaluated at the
    global interval: a group's first evaluation comes at a hashed offset within its own
    `interval` (up to 30 minutes for the 7d windows), too late for a test."""
    out = []
    for name in ("recording_rules.yml", "alert_rules.yml"):
        data = yaml.safe_load((PROM / name).read_text())
        for group in data["groups"]:
            group.pop("interval", None)
        path = tmp / name
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        out.append(str(path))
    return out
