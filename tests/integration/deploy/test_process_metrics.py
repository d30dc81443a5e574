"""The daemon's own health on /metrics and /healthz (issue 12), against a stub source.

A stub ``Source`` stands in for Kafka so the numbers are known exactly: the consumer
lag is each partition's end offset (set by the test) minus the next offset calmon
reached (from the records the stub handed out). The broker plumbing of the same
gauge is checked in test_prometheus_daemon.py (Tansu's end offsets are not exact).
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from calmon import __version__
from calmon.config import from_dict
from calmon.daemon import Daemon
from calmon.engine.records import Kind, Raw
from calmon.io.kafka_source import Batch
from tests import procfs
from tests.conftest import _free_port
from tests.daemon_helpers import wait_until

PRED, LABEL = "p", "l"


class StubSource:
    """Hands out queued batches; ``hang`` makes poll block (a hung main loop)."""

    def __init__(self) -> None:
        self.batches: list[Batch] = []
        self.ends: dict[tuple[str, int], int] = {}
        self.hang = threading.Event()
        self.release = threading.Event()
        self.lock = threading.Lock()

    def assign(self, positions: Any = None, *, from_checkpoint: bool = False) -> list[Any]:
        return []

    def poll(self, timeout_ms: int = 250, max_records: int = 5000) -> Batch:
        if self.hang.is_set():
            self.release.wait(60)  # held until the test releases it: the stall under test
        with self.lock:
            if self.batches:
                return self.batches.pop(0)
        self.release.wait(timeout_ms / 1000)  # an idle poll waits like a real one
        return Batch()

    def end_offsets(self) -> dict[tuple[str, int], int]:
        return dict(self.ends)

    def commit(self, positions: dict[tuple[str, int], int]) -> bool:
        return True

    def connected(self) -> bool:
        return True

    def close(self) -> None:
        self.release.set()


def records(topic: str, partition: int, start: int, values: list[dict[str, Any]],
            kind: Kind) -> Batch:
    batch = Batch()
    for i, v in enumerate(values):
        batch.records.append(Raw(kind, json.dumps(v).encode(), 1.7e9,
                                 f"{topic}/{partition}/{start + i}"))
    batch.positions[(topic, partition)] = start + len(values)
    return batch


@pytest.fixture()
def daemon(tmp_path: Path) -> Iterator[tuple[Daemon, StubSource, int]]:
    port = _free_port()
    cfg = from_dict({
        "kafka": {"bootstrap_servers": "unused:9092", "predictions_topic": PRED,
                  "labels_topic": LABEL},
        "recalibration": {"enabled": True, "interval": "1h", "method": "auto",
                          "output_dir": str(tmp_path / "cal")},
        "server": {"host": "127.0.0.1", "port": port},
        "state": {"dir": str(tmp_path / "state"), "checkpoint_interval": "1s"},
    })
    source = StubSource()
    d = Daemon(cfg, source=source, install_signals=False)
    thread = threading.Thread(target=d.run, daemon=True)
    thread.start()
    try:
        wait_until(lambda: d.ready(), 30, "daemon running")
        yield d, source, port
    finally:
        source.release.set()
        d.request_stop()
        thread.join(30)
        assert not thread.is_alive()


def get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def samples(port: int, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    out = {}
    for fam in text_string_to_metric_families(get(port, "/metrics")[1]):
        for s in fam.samples:
            if s.name == name:
                out[tuple(sorted(s.labels.items()))] = s.value
    return out


def test_lag_build_info_process_and_precreated_counters(
        daemon: tuple[Daemon, StubSource, int]) -> None:
    _d, source, port = daemon
    preds = [{"id": f"r{i}", "model": "m", "prob": 0.2} for i in range(7)]
    labels = [{"id": f"r{i}", "label": 0} for i in range(3)]
    with source.lock:
        source.batches += [records(PRED, 0, 100, preds[:4], Kind.PREDICTION),
                           records(PRED, 1, 0, preds[4:], Kind.PREDICTION),
                           records(LABEL, 0, 50, labels, Kind.LABEL)]
    # end offsets: p/0 has 10 records past 104, p/1 is caught up, l/0 has 47 past 53;
    # l/1 has no position yet (never read), so no lag is claimed for it
    source.ends = {(PRED, 0): 114, (PRED, 1): 3, (LABEL, 0): 100, (LABEL, 1): 9}
    want = {(("partition", "0"), ("topic", PRED)): 10.0,
            (("partition", "1"), ("topic", PRED)): 0.0,
            (("partition", "0"), ("topic", LABEL)): 47.0}
    wait_until(lambda: samples(port, "calmon_consumer_lag_records") == want, 30,
               "lag = end offset - next offset", detail=lambda: samples(
                   port, "calmon_consumer_lag_records"))
    # an end offset behind the position (fetched before the last batch) is no backlog
    source.ends = {(PRED, 0): 90}
    wait_until(lambda: samples(port, "calmon_consumer_lag_records") == {
        (("partition", "0"), ("topic", PRED)): 0.0}, 30, "lag floored at 0")

    info = samples(port, "calmon_build_info")
    assert len(info) == 1 and list(info.values()) == [1.0]
    assert dict(next(iter(info)))["version"] == __version__
    start = samples(port, "process_start_time_seconds")
    # the daemon runs in this process: its start is this process's, read from /proc as an
    # independent check (a container's boot time can sit minutes off the wall clock)
    assert len(start) == 1 and abs(next(iter(start.values())) - procfs.start_time("self")) < 2
    assert samples(port, "process_resident_memory_bytes")
    assert samples(port, "python_info")

    # recalibration counters exist at 0 for every method auto may pick and every
    # outcome before any refit, so increase() sees the first one
    got = samples(port, "calmon_recalibrations_total")
    want_keys = {(("method", m), ("model", "m"), ("outcome", o), ("segment", "__all__"))
                 for m in ("temperature", "platt", "isotonic", "histogram")
                 for o in ("published", "rejected", "failed", "held")}
    assert set(got) == want_keys
    assert set(got.values()) == {0.0}
    beat = samples(port, "calmon_loop_heartbeat_timestamp_seconds")
    assert abs(next(iter(beat.values())) - time.time()) < 60


def test_healthz_fails_while_the_main_loop_is_stuck(
        daemon: tuple[Daemon, StubSource, int]) -> None:
    d, source, port = daemon
    assert get(port, "/healthz") == (200, "ok\n")
    d.stall_after_s = 1.0
    source.hang.set()  # the next poll hangs
    wait_until(lambda: get(port, "/healthz")[0] == 503, 30, "/healthz 503 on a stuck loop")
    assert "stalled" in get(port, "/healthz")[1]
    stalled_beat = samples(port, "calmon_loop_heartbeat_timestamp_seconds")
    source.hang.clear()
    source.release.set()  # the loop goes on
    wait_until(lambda: get(port, "/healthz")[0] == 200, 30, "/healthz 200 once it moves")
    assert samples(port, "calmon_loop_heartbeat_timestamp_seconds") != stalled_beat
