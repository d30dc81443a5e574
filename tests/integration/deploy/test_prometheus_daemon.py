"""deploy/prometheus rules and the Grafana dashboard against a real Prometheus
scraping a REAL ``calmon run`` daemon (every second) while traffic flows.

Traffic: binary (``ctr`` logits, over-confident, so a temperature refit is
published; ``fraud`` probabilities) and multiclass (``intent``, 4 classes)
models with country and device segments, all with event time = now so every
window holds every joined sample; plus a few invalid records, duplicates and
predictions that expire unlabelled, so every dashboard panel has data.

Checks: every rule and alert expression and every dashboard query parses and
runs; every recording rule and every panel target returns data; the recorded
cluster-wide ECE equals the daemon's own ``calmon_ece`` (one instance) and a
plain numpy computation over the produced records.

Skipped when the ``prometheus`` binary is not on PATH.
"""

from __future__ import annotations

import math
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from tests import oracle
from tests.conftest import create_topics, free_port, tansu_binary, unique_topic
from tests.daemon_helpers import (
    CalmonDaemon,
    Producer,
    confidence_and_correct,
    dumps,
    end_positions,
    segment_labels,
    series,
    wait_until,
    write_config,
)
from tests.integration.deploy._deploy import (
    PROM,
    SAMPLE_VARIABLES,
    dashboard_queries,
    fast_rule_files,
    load_dashboard,
    substitute,
)
from tests.integration.deploy.test_prometheus_live import Prometheus, rules, wait_for

pytestmark = [
    pytest.mark.integration,
    # one broker: what is tested here is Prometheus / the pages / HTTP TLS, the broker is
    # incidental (and this module is among the suite's heaviest); the Kafka side runs
    # on both brokers in the daemon tests
    pytest.mark.brokers("tansu"),
    pytest.mark.skipif(shutil.which("prometheus") is None,
                       reason="prometheus is not on PATH (Debian/Ubuntu: apt-get install "
                              "prometheus)"),
]

WINDOWS = ("1h", "24h", "7d")  # the recording rules' windows
MODELS = ("ctr", "fraud", "intent")
SLICES = (("country",), ("device",))
COUNTRIES = ("US", "DE", "BR")
DEVICES = ("ios", "web")
BINS = 15
ROUND = 240  # predictions per traffic round
JOIN_TTL_S = 600
TRAFFIC_DEADLINE_S = 60.0
VARIABLES = {**SAMPLE_VARIABLES, "segment": "__all__"}


# ---------------------------------------------------------------- traffic


@dataclass
class Traffic:
    """Every valid, joinable (prediction, label) pair produced, and the acks."""

    pairs: list[tuple[dict[str, Any], dict[str, Any]]] = field(default_factory=list)
    acks: list[Any] = field(default_factory=list)
    rounds: int = 0
    rng: np.random.Generator = field(default_factory=lambda: np.random.default_rng(2024))

    def round(self, pred_topic: str, label_topic: str) -> list[tuple[str, bytes, bytes]]:
        rng, now = self.rng, time.time()
        out: list[tuple[str, bytes, bytes]] = []
        for i in range(ROUND):
            model = MODELS[i % len(MODELS)]
            pid = f"{model}-{self.rounds}-{i}"
            seg = {"country": COUNTRIES[int(rng.integers(len(COUNTRIES)))],
                   "device": DEVICES[int(rng.integers(len(DEVICES)))]}
            rec: dict[str, Any] = {"id": pid, "model": model, "ts": now, "segment": seg}
            if model == "ctr":  # over-confident logits: the truth is sigmoid(z / 2.5)
                z = float(rng.normal(-0.5, 2.5))
                rec["logit"] = z
                y = int(rng.random() < 1 / (1 + math.exp(-z / 2.5)))
            elif model == "fraud":
                p = float(rng.beta(1.5, 4.0))
                rec["prob"] = p
                y = int(rng.random() < p)
            else:
                z = rng.normal(0.0, 1.5, 4)
                probs = np.exp(z) / np.exp(z).sum()
                rec["probs"] = [float(v) for v in probs]
                y = int(rng.choice(4, p=probs))
            label = {"id": pid, "label": y, "ts": now + float(rng.uniform(0, 2))}
            self.pairs.append((rec, label))
            out += [(pred_topic, pid.encode(), dumps(rec)),
                    (label_topic, pid.encode(), dumps(label))]
        # Noise that some panels show: a duplicate prediction, an invalid record, and a
        # prediction far older than join.ttl that no label ever joins (expired, reason ttl).
        first = out[0]
        out.append(first)
        out.append((pred_topic, b"bad", b"{not json"))
        old = {"id": f"orphan-{self.rounds}", "model": "fraud", "ts": now - 2 * JOIN_TTL_S,
               "prob": 0.5}
        out.append((pred_topic, old["id"].encode(), dumps(old)))
        # and predictions whose labels have not come yet: the label-free estimates' input
        for model, score in (("ctr", {"logit": -1.0}), ("fraud", {"prob": 0.2}),
                             (MODELS[-1], {"probs": [0.7, 0.1, 0.1, 0.1]})):
            waiting = {"id": f"waiting-{model}-{self.rounds}", "model": model, "ts": now,
                       "segment": {"country": COUNTRIES[0], "device": DEVICES[0]}, **score}
            out.append((pred_topic, waiting["id"].encode(), dumps(waiting)))
        self.rounds += 1
        return out


def independent_ece(pairs: list[tuple[dict[str, Any], dict[str, Any]]]
                    ) -> dict[tuple[str, str], float]:
    """(model, segment) -> ECE of the joined pairs, by the tests' oracle."""
    samples: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for pred, label in pairs:
        conf, correct = confidence_and_correct(pred, int(label["label"]))
        for seg in segment_labels(pred, SLICES):
            samples.setdefault((pred["model"], seg), []).append((conf, correct))
    return {k: oracle.ece(*np.array(v).T, BINS) for k, v in samples.items()}


# ---------------------------------------------------------------- Prometheus


def start_prometheus(tmp: Path, target: str) -> tuple[subprocess.Popen[bytes], Prometheus]:
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "rule_files": fast_rule_files(tmp),
        "scrape_configs": [{"job_name": "calmon", "static_configs": [{"targets": [target]}]}],
    }
    (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    with (tmp / "prometheus.log").open("wb") as log:
        proc = subprocess.Popen(
            ["prometheus", f"--config.file={tmp / 'prometheus.yml'}",
             f"--storage.tsdb.path={tmp / 'data'}", f"--web.listen-address=127.0.0.1:{port}",
             "--log.level=warn"],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
        )
    return proc, Prometheus(f"http://127.0.0.1:{port}")


def query_at(p: Prometheus, expr: str, t: float) -> list[dict[str, Any]]:
    data = p.get("/api/v1/query", query=expr, time=f"{t:.3f}")
    assert data["status"] == "success", (expr, data)
    return data["data"]["result"]


def by_series(result: list[dict[str, Any]]) -> dict[tuple[str, str], float]:
    out = {}
    for s in result:
        key = (s["metric"]["model"], s["metric"]["segment"])
        assert key not in out, f"two samples for {key}"
        out[key] = float(s["value"][1])
    return out


@dataclass
class Setup:
    prom: Prometheus
    daemon: CalmonDaemon
    traffic: Traffic
    started: float  # wall time the traffic started
    final: dict[str, Any]  # the daemon's /metrics once every record was consumed


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory, kafka_bootstrap: str) -> Iterator[Setup]:
    tansu_binary()
    tmp = tmp_path_factory.mktemp("prom-daemon")
    pred_topic, label_topic = unique_topic("pd-pred"), unique_topic("pd-label")
    create_topics(kafka_bootstrap, [pred_topic, label_topic], partitions=2)
    cfg = write_config(
        tmp / "calmon.yaml", kafka_bootstrap, pred_topic, label_topic,
        join={"ttl": f"{JOIN_TTL_S}s", "label_ttl": "1h"},
        metrics={"bins": BINS, "windows": list(WINDOWS), "classwise": True},
        segments={"slices": [list(s) for s in SLICES], "max_values": 50},
        recalibration={"enabled": True, "interval": "1s", "method": "temperature",
                       "min_samples": 300, "cooldown": "1h", "window": "1h",
                       "output_dir": str(tmp / "calibrators"),
                       "triggers": {"ece_above": 0.03}},
    )
    traffic = Traffic()
    with CalmonDaemon(cfg) as daemon:
        proc, prom = start_prometheus(tmp, f"127.0.0.1:{daemon.port}")
        try:
            wait_for(lambda: prom.get("/api/v1/status/buildinfo")["status"] == "success")
            started = time.time()
            pace = threading.Event()  # never set: its wait() paces the traffic
            with Producer(kafka_bootstrap) as producer:

                def enough() -> bool:
                    """A calibrator is live and Prometheus scraped traffic of every model
                    at least 3 times (so rate() over 1m has points)."""
                    sc = daemon.scrape(fresh=None)  # traffic flows: no batch is the last
                    if not sc.get("calmon_calibrator_version"):
                        return False
                    res = prom.query('count_over_time(calmon_joined_total[1m]) >= 3')
                    return {s["metric"]["model"] for s in res} >= set(MODELS)

                deadline = time.monotonic() + TRAFFIC_DEADLINE_S
                while True:
                    assert daemon.running, daemon.log_tail()
                    traffic.acks += producer.send(traffic.round(pred_topic, label_topic))
                    if traffic.rounds == 1:
                        # As in production (min_samples far above one scrape's worth of
                        # traffic): Prometheus sees the recalibration counters at 0
                        # before the first refit, which one round cannot trigger.
                        wait_until(lambda: prom.query(
                            'calmon_recalibrations_total{model="ctr", '
                            'outcome="published"} == 0'), 30, "the counters at 0",
                            interval=0.2)
                    if traffic.rounds >= 4 and enough():
                        break
                    assert time.monotonic() < deadline, (
                        f"no published calibrator / scrapes after {TRAFFIC_DEADLINE_S}s:\n"
                        f"{daemon.log_tail()}")
                    pace.wait(0.3)  # traffic rate, not synchronisation
            daemon.wait_positions(end_positions(traffic.acks), timeout=60)
            final = daemon.scrape()
            want = series(final, "calmon_window_samples", "model", "segment", "window")

            def settled() -> bool:
                """Prometheus scraped the final state and evaluated the rules on it."""
                for w in WINDOWS:
                    got = by_series(prom.query(f'calmon_window_samples{{window="{w}"}}'))
                    rec = by_series(
                        prom.query(f"job_model_segment:calmon_window_samples:window{w}"))
                    exp = {(m, s): v for (m, s, ww), v in want.items() if ww == w}
                    if got != exp or rec != exp:
                        return False
                return all(r["health"] != "unknown" for r in rules(prom))

            wait_until(settled, 30, "Prometheus to scrape and record the final state",
                       interval=0.2)
            yield Setup(prom, daemon, traffic, started, final)
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


# ---------------------------------------------------------------- rules and alerts


def rule_exprs(name: str) -> list[tuple[str, str]]:
    data = yaml.safe_load((PROM / name).read_text())
    return [(r.get("record") or r["alert"], r["expr"]) for g in data["groups"] for r in g["rules"]]


RECORDING = rule_exprs("recording_rules.yml")
ALERTING = rule_exprs("alert_rules.yml")


def test_every_rule_is_healthy(setup: Setup) -> None:
    all_rules = rules(setup.prom)
    assert len(all_rules) == len(RECORDING) + len(ALERTING)
    for rule in all_rules:
        assert rule["health"] == "ok", (rule["name"], rule.get("lastError"))


@pytest.mark.parametrize("name,expr", RECORDING, ids=[f"{n}#{i}" for i, (n, _) in
                                                      enumerate(RECORDING)])
def test_recording_rule_expression_returns_data(setup: Setup, name: str, expr: str) -> None:
    # query() asserts status success; a scrape that misses its 1 s timeout on a loaded
    # machine leaves a gap, so give the next scrape and evaluation a chance
    wait_until(lambda: setup.prom.query(expr), 15, f"{name}: data", interval=0.5)
    wait_until(lambda: setup.prom.query(name), 15, f"{name}: recorded", interval=0.5)


_SELECTED = re.compile(r"\b((?:calmon|process)_\w+|up)\{([^}]*)\}")


def selectors(expr: str) -> list[str]:
    """Every metric selector of an expression, e.g. calmon_drift{job="calmon"}."""
    return [f"{name}{{{matchers}}}" for name, matchers in _SELECTED.findall(expr)]


@pytest.mark.parametrize("name,expr", ALERTING, ids=[f"{n}#{i}" for i, (n, _) in
                                                     enumerate(ALERTING)])
def test_alert_expression_runs_on_data(setup: Setup, name: str, expr: str) -> None:
    """The alert's expression runs, and every series it reads exists on the scraped
    daemon under the selector (a misspelt metric or label would never fire)."""
    setup.prom.query(expr)  # asserts status success
    found = selectors(expr)
    assert found, expr
    for sel in found:
        if sel.split("{")[0] in GROUP_ONLY:  # this daemon is one instance, no tasks
            continue
        wait_until(lambda sel=sel: setup.prom.query(sel), 15, f"{name}: data for {sel}",
                   interval=0.5)


# Exported by kafka.instance: group alone (calmon.group_run.TaskCollector): the daemon
# above runs one instance, so the alerts reading them are checked against what that
# collector describes instead (names and labels), as the group mode exports them.
GROUP_ONLY = {"calmon_tasks", "calmon_restore_seconds_count", "calmon_restore_seconds_sum",
              "calmon_restore_seconds_bucket", "calmon_restored_bytes_total"}


def test_group_mode_alerts_read_what_group_mode_exports() -> None:
    from calmon.group_run import TaskCollector

    described = {f.name: f for f in TaskCollector(None).describe()}  # type: ignore[arg-type]
    exported = {"calmon_tasks": ("state",), "calmon_restore_seconds_count": (),
                "calmon_restore_seconds_sum": (), "calmon_restore_seconds_bucket": ("le",),
                "calmon_restored_bytes_total": ()}
    assert set(exported) == GROUP_ONLY
    seen = set()
    for name, expr in ALERTING:
        for sel in selectors(expr):
            metric, matchers = sel.split("{", 1)
            if metric not in GROUP_ONLY:
                continue
            seen.add(name)
            family = metric.removesuffix("_total").removesuffix("_count")
            assert family.removesuffix("_sum").removesuffix("_bucket") in described, sel
            labels = {m.split("=")[0].strip() for m in matchers.rstrip("}").split(",")}
            assert labels - {"job"} <= set(exported[metric]), (name, sel)
    assert seen == {"CalmonTaskRestoreStuck", "CalmonRebalanceStorm"}


def test_alerts_on_the_live_daemon(setup: Setup) -> None:
    prom = setup.prom
    # The ctr refit of this run: the counter was exported at 0 before it, so increase()
    # sees the first refit (the rule has no "series born" branch to need).
    wait_until(lambda: prom.query('increase(calmon_recalibrations_total{job="calmon", '
                                  'outcome="published", model="ctr"}[10m]) > 0'), 15,
               "increase() to see the ctr publish", interval=0.5,
               detail=lambda: prom.query('calmon_recalibrations_total{outcome="published"}'))
    firing = {a["labels"]["alertname"] for a in prom.get("/api/v1/alerts")["data"]["alerts"]}
    assert not firing & {"CalmonTargetDown", "CalmonTargetMissing", "CalmonMainLoopStalled",
                         "CalmonCheckpointTooOld", "CalmonConsumerLag",
                         "CalmonRecalibrationFailed"}, firing


def test_process_health_metrics(setup: Setup) -> None:
    final = setup.final
    lag = series(final, "calmon_consumer_lag_records", "topic", "partition")
    # Tansu's end offsets are not exact: the plumbing is checked here (one series per
    # owned partition of both topics), the arithmetic in test_process_metrics.py
    assert {p for _, p in lag} == {"0", "1"} and len(lag) == 4, lag
    assert all(v >= 0 for v in lag.values())
    assert final.get("process_start_time_seconds") and final.get("process_cpu_seconds_total")
    assert final.get("calmon_build_info") and final.get("calmon_loop_heartbeat_timestamp_seconds")


# ---------------------------------------------------------------- the recorded ECE


@pytest.mark.parametrize("window", WINDOWS)
def test_recorded_ece_equals_the_daemons_and_numpy(setup: Setup, window: str) -> None:
    prom = setup.prom
    t = time.time()  # one evaluation time for both, after the final scrape + rule run
    recorded = by_series(query_at(prom, f"job_model_segment:calmon_ece:window{window}", t))
    gauge = by_series(query_at(prom, f'calmon_ece{{window="{window}"}}', t))
    daemon_final = {(m, s): v for (m, s, w), v in
                    series(setup.final, "calmon_ece", "model", "segment", "window").items()
                    if w == window}
    expected = independent_ece(setup.traffic.pairs)
    assert set(recorded) == set(gauge) == set(daemon_final) == set(expected)
    assert {m for m, _ in recorded} == set(MODELS)
    assert len(recorded) == len(MODELS) * (1 + len(COUNTRIES) + len(DEVICES))
    for key, value in recorded.items():
        assert abs(value - gauge[key]) <= 1e-6, (key, value, gauge[key])
        assert abs(gauge[key] - daemon_final[key]) <= 1e-12, key  # the final scrape
        assert abs(gauge[key] - expected[key]) <= 1e-9, (key, gauge[key], expected[key])
    samples = by_series(
        query_at(prom, f"job_model_segment:calmon_window_samples:window{window}", t))
    joined = {}
    for pred, _ in setup.traffic.pairs:
        for seg in segment_labels(pred, SLICES):
            joined[(pred["model"], seg)] = joined.get((pred["model"], seg), 0) + 1
    assert samples == {k: float(v) for k, v in joined.items()}


# ---------------------------------------------------------------- the dashboard


DASHBOARD = load_dashboard()
PANEL_QUERIES = [(w, e) for w, e in dashboard_queries(DASHBOARD) if w.startswith("panel")]
ANNOTATIONS = [(w, e) for w, e in dashboard_queries(DASHBOARD) if w.startswith("annotation")]


@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("where,expr", PANEL_QUERIES, ids=[w for w, _ in PANEL_QUERIES])
def test_every_panel_query_returns_data(setup: Setup, where: str, expr: str,
                                        window: str) -> None:
    """For some model (observed/expected is binary only, class-wise ECE multiclass
    only)."""
    queries = [substitute(expr, {**VARIABLES, "model": m, "window": window}) for m in MODELS]
    wait_until(lambda: any(setup.prom.query(q) for q in queries), 15,
               f"{where}: data for {queries[0]}", interval=0.5)


@pytest.mark.parametrize("where,expr", ANNOTATIONS, ids=[w for w, _ in ANNOTATIONS])
def test_annotation_shows_the_recalibration(setup: Setup, where: str, expr: str) -> None:
    # Grafana runs annotation queries as range queries with step = $__interval.
    step = "2s"
    q = substitute(expr, {**VARIABLES, "model": "ctr", "__interval": step})

    def shown() -> set[tuple[str, str]]:
        # the refit may have been published in the last second of the setup: the next
        # step of a range query ending now shows it
        data = setup.prom.get("/api/v1/query_range", query=q,
                              start=f"{setup.started - 5:.3f}", end=f"{time.time():.3f}",
                              step=step)
        assert data["status"] == "success", data
        return {(s["metric"]["model"], s["metric"]["segment"]) for s in data["data"]["result"]}

    wait_until(lambda: ("ctr", "__all__") in shown(), 15, f"{where}: the ctr publish",
               interval=0.5, detail=shown)


_LABEL_VALUES = re.compile(r"label_values\((?:(.+),\s*)?(\w+)\)")


def test_template_variables_have_values(setup: Setup) -> None:
    """The dashboard's variable queries (label_values(selector, label)) list our
    models, segments and windows, as Grafana's data source would ask for them."""
    found = {}
    for var in DASHBOARD["templating"]["list"]:
        if var["type"] != "query":
            continue
        definition = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
        m = _LABEL_VALUES.fullmatch(definition.strip())
        assert m, definition
        selector, label = m.group(1), m.group(2)
        values = {**VARIABLES, "model": "ctr"}
        params = {"match[]": substitute(selector, values)} if selector else {}
        data = setup.prom.get(f"/api/v1/label/{label}/values", **params)
        assert data["status"] == "success", data
        found[var["name"]] = set(data["data"])
    assert found["model"] == set(MODELS)
    assert "__all__" in found["segment"] and "country=US" in found["segment"]
    windows = [v for v in DASHBOARD["templating"]["list"] if v["name"] == "window"]
    assert [o["value"] for o in windows[0]["options"]] == list(WINDOWS)
