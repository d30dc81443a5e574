"""The rules and the dashboard against a real Prometheus, fed by fake calmon exporters.

Two fake instances serve every contract metric on 127.0.0.1; a Prometheus
started here scrapes them every second and evaluates deploy/prometheus/*_rules.yml.
Skipped when the `prometheus` binary is not on PATH (apt-get install prometheus).
"""

from __future__ import annotations

import json
import math
import random
import shutil
import socket
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest
import yaml

from tests import oracle
from tests.daemon_helpers import wait_until
from tests.integration.deploy._deploy import (
    dashboard_queries,
    fast_rule_files,
    load_dashboard,
    substitute,
)

pytestmark = pytest.mark.skipif(
    shutil.which("prometheus") is None,
    reason="prometheus is not on PATH (Debian/Ubuntu: apt-get install prometheus)",
)

BINS = 15
WINDOWS = ["1h", "24h", "7d"]
STARTED = time.time() - 60  # the fake processes started a minute ago, inside every window


@dataclass
class Series:
    """Joined samples of one model and segment on one instance (all inside every window)."""

    confidences: list[float] = field(default_factory=list)
    outcomes: list[int] = field(default_factory=list)

    def bins(self) -> dict[int, tuple[int, float, float]]:
        out: dict[int, list[float]] = {}
        for p, y in zip(self.confidences, self.outcomes, strict=True):
            b = max(0, math.ceil(p * BINS) - 1)  # right-closed, bin 0 also holds 0
            n, c, k = out.get(b, [0, 0.0, 0.0])
            out[b] = [n + 1, c + p, k + y]
        return {b: (int(v[0]), v[1], v[2]) for b, v in out.items()}


def ece(bins: dict[int, tuple[int, float, float]]) -> float:
    """The contract's definition, by the tests' oracle, from per-bin sums."""
    count, csum, ksum = (np.array(col, dtype=np.float64) for col in zip(*bins.values()))
    return float(oracle.ece_from_bins(count, csum, ksum)[0])  # a plain float: repr'd as text


def make_series(seed: int, size: int) -> Series:
    rng = random.Random(seed)
    s = Series()
    for _ in range(size):
        p = rng.random()
        s.confidences.append(p)
        s.outcomes.append(int(rng.random() < p**1.5))  # over-confident
    return s


# instance -> (model, segment) -> samples. "solo" lives on one instance only.
DATA = {
    "a": {
        ("ctr", "__all__"): make_series(1, 3000),
        ("ctr", "country=US"): make_series(2, 1200),
        ("solo", "__all__"): make_series(3, 2500),
    },
    "b": {("ctr", "__all__"): make_series(4, 2000)},
}


def exposition(instance: str) -> str:
    lines = []
    for (model, segment), s in DATA[instance].items():
        ms = f'model="{model}",segment="{segment}"'
        bins = s.bins()
        for b, (n, c, k) in sorted(bins.items()):
            lbl = f'{ms},bin="{b}"'
            lines.append(f"calmon_bin_samples_total{{{lbl}}} {n}")
            lines.append(f"calmon_bin_confidence_total{{{lbl}}} {c!r}")
            lines.append(f"calmon_bin_correct_total{{{lbl}}} {k!r}")
        total = len(s.confidences)
        mean_p = sum(s.confidences) / total
        rate = sum(s.outcomes) / total
        value = ece(bins)
        for w in WINDOWS:
            lbl = f'{ms},window="{w}"'
            for name, v in [
                ("calmon_ece", value),
                ("calmon_mce", value * 2),
                ("calmon_ace", value),
                ("calmon_brier", 0.2),
                ("calmon_nll", 0.6),
                ("calmon_accuracy", 0.7),
                ("calmon_mean_confidence", mean_p),
                ("calmon_observed_rate", rate),
                ("calmon_observed_over_expected", rate / mean_p),
                ("calmon_window_samples", total),
                ("calmon_ece_noise_floor", 0.01),
                ("calmon_calibrated_ece", value / 3),
                ("calmon_classwise_ece", value),
                # v2 (CONTRACT.md section 5)
                ("calmon_ece_l2_debiased", value / 2),
                ("calmon_smece", value * 0.9),
                ("calmon_ece_lower", value * 0.8),
                ("calmon_ece_upper", value * 1.2),
                ("calmon_pending_samples", 100),
                ("calmon_estimated_accuracy", 0.68),
                # v5: the band and the sums instances combine by
                ("calmon_estimated_accuracy_lower", 0.61),
                ("calmon_estimated_accuracy_upper", 0.75),
                ("calmon_estimated_correct", 68.0),
                ("calmon_estimated_correct_variance", 21.76),
                ("calmon_estimated_positive_rate", mean_p),
                ("calmon_score_psi", 0.05),
                ("calmon_calibrated_samples", total / 2),
            ]:
                lines.append(f"{name}{{{lbl}}} {v!r}")
        lines.append(f'calmon_drift{{{ms},trigger="ece_above"}} 1')
        lines.append(f"calmon_drift_evidence{{{ms}}} 0.3")
        lines.append(f"calmon_calibrator_version{{{ms}}} 2")
        lines.append(f"calmon_calibrator_temperature{{{ms}}} 1.5")
        for outcome in ("published", "rejected", "failed"):
            lines.append(
                f'calmon_recalibrations_total{{{ms},method="temperature",outcome="{outcome}"}} 1'
            )
    models = sorted({m for m, _ in DATA[instance]})
    for m in models:
        lines.append(f'calmon_predictions_total{{model="{m}"}} 10000')
        lines.append(f'calmon_labels_total{{model="{m}"}} 9000')
        lines.append(f'calmon_joined_total{{model="{m}"}} 8000')
        lines.append(f'calmon_join_expired_total{{model="{m}",reason="ttl"}} 5')
        lines.append(f'calmon_join_expired_total{{model="{m}",reason="capacity"}} 0')
    lines += [
        f"process_start_time_seconds {STARTED!r}",
        "process_resident_memory_bytes 123456789",
        'calmon_build_info{version="0.1.0",python="3.11.0"} 1',
        'calmon_consumer_lag_records{topic="predictions",partition="0"} 12',
        'calmon_consumer_lag_records{topic="labels",partition="0"} 0',
        f"calmon_loop_heartbeat_timestamp_seconds {time.time()!r}",
        "calmon_labels_expired_total 3",
        'calmon_duplicates_total{topic="predictions"} 2',
        'calmon_key_mismatch_total{topic="labels"} 0',
        'calmon_invalid_records_total{topic="predictions",reason="not_json"} 4',
        "calmon_join_pending 1234",
        f"calmon_last_checkpoint_timestamp_seconds {time.time()!r}",
    ]
    for m in models:
        cumulative = 0
        for le in ("1", "10", "60", "600", "3600", "+Inf"):
            cumulative += 10
            lines.append(f'calmon_label_delay_seconds_bucket{{model="{m}",le="{le}"}} {cumulative}')
        lines += [
            f'calmon_label_delay_seconds_count{{model="{m}"}} {cumulative}',
            f'calmon_label_delay_seconds_sum{{model="{m}"}} 999',
        ]
    return "\n".join(lines) + "\n"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def exporter(instance: str) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = exposition(instance).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


class Prometheus:
    def __init__(self, url: str) -> None:
        self.url = url

    def get(self, path: str, **params: str) -> dict:
        query = urllib.parse.urlencode(params)
        with urllib.request.urlopen(f"{self.url}{path}?{query}", timeout=10) as resp:
            return json.load(resp)

    def query(self, expr: str) -> list[dict]:
        data = self.get("/api/v1/query", query=expr)
        assert data["status"] == "success", data
        return data["data"]["result"]

    def value(self, expr: str) -> float:
        [sample] = self.query(expr)
        return float(sample["value"][1])


def wait_for(check, timeout: float = 40.0, what: str = "Prometheus"):  # type: ignore[no-untyped-def]
    """``wait_until`` for Prometheus' API: an error answer (or none yet) is "not yet"."""
    return wait_until(check, timeout, what, interval=0.5,
                      retry_on=(OSError, AssertionError, ValueError))


@pytest.fixture(scope="module")
def prom(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    tmp = tmp_path_factory.mktemp("prometheus")
    servers = [exporter("a"), exporter("b")]
    targets = [f"127.0.0.1:{s.server_address[1]}" for s in servers]
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "rule_files": fast_rule_files(tmp),
        "scrape_configs": [{"job_name": "calmon", "static_configs": [{"targets": targets}]}],
    }
    (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    log = (tmp / "prometheus.log").open("w")
    proc = subprocess.Popen(
        [
            "prometheus",
            f"--config.file={tmp / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    p = Prometheus(f"http://127.0.0.1:{port}")
    try:
        wait_for(lambda: p.get("/api/v1/status/buildinfo")["status"] == "success")
        # Enough scrapes for rate() and every rule evaluated at least once.
        wait_for(lambda: p.value('min(count_over_time(up{job="calmon"}[1m]))') >= 4)
        wait_for(lambda: all(r["health"] != "unknown" for r in rules(p)))
        yield p
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
        for s in servers:
            s.shutdown()
        log.close()


def rules(p: Prometheus) -> list[dict]:
    data = p.get("/api/v1/rules")
    return [r for g in data["data"]["groups"] for r in g["rules"]]


def test_every_rule_evaluates_without_error(prom: Prometheus) -> None:
    for rule in rules(prom):
        assert rule["health"] == "ok", (rule["name"], rule.get("lastError"))
    assert len(rules(prom)) >= 45


@pytest.mark.parametrize("window", WINDOWS)
def test_one_instance_recorded_ece_equals_the_daemons(prom: Prometheus, window: str) -> None:
    recorded = prom.value(f'job_model_segment:calmon_ece:window{window}{{model="solo"}}')
    gauge = prom.value(f'calmon_ece{{model="solo", window="{window}"}}')
    assert abs(recorded - gauge) <= 1e-9
    samples = prom.value(
        f'job_model_segment:calmon_window_samples:window{window}{{model="solo"}}')
    assert samples == 2500


def test_cluster_reliability_diagram_sums_instances(prom: Prometheus) -> None:
    a, b = DATA["a"][("ctr", "__all__")], DATA["b"][("ctr", "__all__")]
    union = Series(a.confidences + b.confidences, a.outcomes + b.outcomes)
    bins = union.bins()
    recorded = prom.value('job_model_segment:calmon_ece:window1h{model="ctr", segment="__all__"}')
    assert abs(recorded - ece(bins)) <= 1e-9
    conf = {
        int(s["metric"]["bin"]): float(s["value"][1])
        for s in prom.query(
            "job_model_segment_bin:calmon_bin_mean_confidence:window1h"
            '{model="ctr", segment="__all__"}'
        )
    }
    acc = {
        int(s["metric"]["bin"]): float(s["value"][1])
        for s in prom.query(
            'job_model_segment_bin:calmon_bin_accuracy:window1h{model="ctr", segment="__all__"}'
        )
    }
    assert set(conf) == set(acc) == set(bins)
    for b_, (n, c, k) in bins.items():
        assert abs(conf[b_] - c / n) <= 1e-9 and abs(acc[b_] - k / n) <= 1e-9
    mce = prom.value('job_model_segment:calmon_mce:window1h{model="ctr", segment="__all__"}')
    assert abs(mce - max(abs(c / n - k / n) for n, c, k in bins.values())) <= 1e-9


def test_alerts_on_the_fake_data(prom: Prometheus) -> None:
    alerts = prom.get("/api/v1/alerts")["data"]["alerts"]
    names = {a["labels"]["alertname"] for a in alerts}
    # The recalibration counters stand at 1 since the first scrape: old events, not new
    # ones (no "series born" branch re-fires them); the targets are up and fresh.
    assert not names & {"CalmonRecalibrationRejected", "CalmonRecalibrationFailed",
                        "CalmonTargetDown", "CalmonTargetMissing", "CalmonMainLoopStalled"}
    # calmon_drift = 1: pending (for 10m), with both instances merged into one alert
    drift = [a for a in alerts if a["labels"]["alertname"] == "CalmonCalibrationDrift"]
    assert {(a["labels"]["model"], a["labels"]["segment"]) for a in drift} == {
        ("ctr", "__all__"), ("ctr", "country=US"), ("solo", "__all__")}
    assert all("instance" not in a["labels"] for a in drift)


DASHBOARD_QUERIES = dashboard_queries(load_dashboard())


@pytest.mark.parametrize("where,expr", DASHBOARD_QUERIES, ids=[w for w, _ in DASHBOARD_QUERIES])
def test_dashboard_query_runs(prom: Prometheus, where: str, expr: str) -> None:
    result = prom.query(substitute(expr))
    if where.startswith("panel"):
        assert result, f"{where}: no data for {substitute(expr)}"
