"""Acceptance 5: ``calmon calibrators rollback`` republishes an old version's parameters
as a new version, and ``CalibratorWatcher`` follows it, from the directory and from
``kafka.calibrators_topic``. Expected outputs are sigmoid / softmax of logit / T
computed with scipy from the parameters the test published."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from scipy.special import expit, log_softmax

from calmon.calibrators import CalibratorWatcher
from calmon.cli import main
from calmon.recal.registry import Registry
from tests.conftest import FAST_CLIENT
from tests.daemon_helpers import wait_until
from tests.recal_helpers import latest, read_json

T1, T2 = 2.0, 0.7  # binary "ctr": v1, v2
U1, U2 = 1.6, 3.0  # 5-class "intent": v1, v2


def write_cfg(path: Path, output_dir: Path, **kafka: Any) -> Path:
    cfg: dict[str, Any] = {"recalibration": {"output_dir": str(output_dir)}}
    if kafka:
        cfg["kafka"] = kafka
    path.write_text(yaml.safe_dump(cfg), encoding="utf-8")
    return path


def publish_two_versions(registry: Registry) -> None:
    for t, u in ((T1, U1), (T2, U2)):
        registry.publish({"model": "ctr", "segment": "__all__", "method": "temperature",
                          "params": {"temperature": t}, "input": "logit",
                          "trigger": "ece_above"})
        registry.publish({"model": "intent", "segment": "__all__", "method": "temperature",
                          "params": {"temperature": u}, "input": "logits",
                          "trigger": "ece_above"})


def inputs() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return rng.normal(0, 3, 1000), rng.normal(0, 2, (1000, 5))


def assert_watcher_serves(watcher: CalibratorWatcher, version: int, t: float, u: float) -> None:
    z, zz = inputs()
    assert watcher.version("ctr") == version
    assert watcher.version("intent") == version
    # outputs are kept within [1e-7, 1 - 1e-7] (contract §6: no certainties)
    np.testing.assert_allclose(watcher.apply("ctr", z), np.clip(expit(z / t), 1e-7, 1 - 1e-7),
                               rtol=0, atol=1e-12)
    np.testing.assert_allclose(watcher.apply("intent", zz),
                               np.exp(log_softmax(zz / u, axis=1)), rtol=0, atol=1e-12)
    # a segment without its own calibrator falls back to the model's
    assert watcher.version("ctr", "country=US") == version


def rollback(cfg: Path, model: str, to: int) -> int:
    return main(["calibrators", "rollback", "--model", model, "--to", str(to), "-c", str(cfg)])


def test_rollback_republishes_v1_as_v3_and_the_directory_watcher_follows(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "calibrators"
    cfg = write_cfg(tmp_path / "calmon.yaml", out)
    registry = Registry(out)
    publish_two_versions(registry)
    v1 = read_json(out / "ctr" / "__all__" / "v1.json")

    # a foreign file in the tree is skipped, not fatal
    (out / "junk" / "__all__").mkdir(parents=True)
    (out / "junk" / "__all__" / "latest.json").write_text("{}", encoding="utf-8")
    watcher = CalibratorWatcher(out, min_interval=0.0)
    assert_watcher_serves(watcher, 2, T2, U2)

    live = registry.live("ctr", "__all__")  # what a running daemon holds (cached)
    assert live is not None and live.version == 2

    assert rollback(cfg, "ctr", 1) == 0
    assert "ctr/__all__: v1 republished as v3" in capsys.readouterr().out
    assert rollback(cfg, "intent", 1) == 0
    assert "intent/__all__: v1 republished as v3" in capsys.readouterr().out
    assert registry.versions("ctr", "__all__") == [1, 2, 3]
    watcher.refresh(force=True)  # what its refresh thread does within min_interval
    doc = read_json(latest(out, "ctr"))
    assert doc == read_json(out / "ctr" / "__all__" / "v3.json")
    assert doc["version"] == 3 and doc["rollback_of"] == 1 and doc["trigger"] == "rollback"
    for key in ("model", "segment", "method", "params", "input"):
        assert doc[key] == v1[key], key
    assert doc["params"] == {"temperature": T1}

    assert_watcher_serves(watcher, 3, T1, U1)
    watcher.close()
    # a fresh watcher sees the same
    with CalibratorWatcher(out, min_interval=0.0) as fresh:
        assert_watcher_serves(fresh, 3, T1, U1)
    # and so does a running daemon's registry
    live = registry.live("ctr", "__all__")
    assert live is not None and live.version == 3 and live.doc["params"] == {"temperature": T1}

    assert main(["calibrators", "list", "--json", "-c", str(cfg)]) == 0
    listed = {e["model"]: e for e in json.loads(capsys.readouterr().out)}
    assert listed["ctr"]["live"] == 3 and listed["ctr"]["versions"] == [1, 2, 3]
    assert listed["ctr"]["trigger"] == "rollback"

    # a version that does not exist: an error, and nothing published
    assert rollback(cfg, "ctr", 7) == 1
    assert "v7" in capsys.readouterr().err
    assert registry.versions("ctr", "__all__") == [1, 2, 3]
    assert watcher.version("ctr") == 3


@pytest.mark.integration
def test_topic_watcher_sees_published_and_rolled_back_documents(
        kafka_bootstrap: str, kafka_topics: Callable[..., list[str]], tmp_path: Path) -> None:
    """Documents published with a real producer (``Registry(publish=...)``) and the CLI's
    rollback (``kafka.calibrators_topic`` set) reach a watcher in topic mode."""
    from kafka import KafkaProducer

    (topic,) = kafka_topics(count=1, partitions=1)
    out = tmp_path / "calibrators"
    cfg = write_cfg(tmp_path / "calmon.yaml", out, bootstrap_servers=kafka_bootstrap,
                    calibrators_topic=topic, client=dict(FAST_CLIENT))
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap, request_timeout_ms=5000)
    try:
        def publish(model: str, segment: str, _doc: dict, data: bytes) -> None:
            producer.send(topic, key=f"{model}/{segment}".encode(), value=data).get(10)

        # records serving code must skip: not JSON, not a calibrator, a tombstone
        for junk in (b"not json", b"{}", b"[1, 2]", b'{"model": "ctr", "version": 9}', None):
            producer.send(topic, key=b"junk", value=junk).get(10)
        publish_two_versions(Registry(out, publish))
    finally:
        producer.close(timeout=5)

    watcher = CalibratorWatcher(topic=topic, bootstrap_servers=kafka_bootstrap,
                                min_interval=0.0, consumer_settings=dict(FAST_CLIENT))
    try:
        def seen(version: int) -> Callable[[], bool]:
            def cond() -> bool:
                watcher.refresh(force=True)
                return watcher.version("ctr") == version and watcher.version("intent") == version
            return cond

        wait_until(seen(2), 20, "the topic watcher at v2")
        assert_watcher_serves(watcher, 2, T2, U2)
        assert rollback(cfg, "ctr", 1) == 0
        assert rollback(cfg, "intent", 1) == 0
        wait_until(seen(3), 20, "the topic watcher at v3")
        assert_watcher_serves(watcher, 3, T1, U1)
    finally:
        watcher.close()
