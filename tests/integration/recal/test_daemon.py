"""Recalibration end to end: ``python -m calmon run`` against the real broker.

Acceptance 1: a binary and a 5-class logit model, calibrated for the first half of
the stream, then sharpened (logits multiplied by T = 2.5) in a second half whose
event times lie more than 1h later, so the 1h trigger window holds only drifted
data. Within three scheduler runs of the drifted data being joined, a temperature
near 2.5 is published, the calibrated ECE falls below the raw one, the recal
metrics show it, and a topic-mode CalibratorWatcher receives it.

Acceptance 6 (second half): with ``alerts.webhook`` on a closed port the daemon
keeps consuming and the refit is still published.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from scipy.special import expit, log_softmax

from calmon.calibrators import CalibratorWatcher
from calmon.calibrators.signing import keygen
from tests.conftest import FAST_CLIENT, _free_port
from tests.daemon_helpers import (
    CalmonDaemon,
    Producer,
    Scrape,
    series,
    wait_until,
    write_config,
)
from tests.recal_helpers import (
    BASE_TS,
    Stream,
    binary_logit_stream,
    dumps,
    latest,
    multiclass_logit_stream,
    read_json,
)

pytestmark = pytest.mark.integration

INTERVAL = 1.0
MODELS = ("bin", "mc5")
RECAL = {"enabled": True, "interval": "1s", "cooldown": "1s", "window": "1h",
         "min_samples": 1000, "method": "temperature"}


def records(stream: Stream, preds_topic: str, labels_topic: str, what: str,
            seed: int) -> list[tuple[str, bytes, bytes]]:
    """``what``: "preds", "labels" or "both" (shuffled together), keyed by id."""
    out = []
    if what in ("preds", "both"):
        out += [(preds_topic, str(p["id"]).encode(), dumps(p)) for p in stream.preds]
    if what in ("labels", "both"):
        out += [(labels_topic, str(lab["id"]).encode(), dumps(lab)) for lab in stream.labels]
    order = np.random.default_rng(seed).permutation(len(out))
    return [out[i] for i in order]


def gauge(sc: Scrape, name: str, window: str = "1h") -> dict[str, float]:
    return {m: v for (m, s, w), v in series(sc, name, "model", "segment", "window").items()
            if s == "__all__" and w == window}


def send_as_one_batch(bootstrap: str, topic: str, values: list[tuple[bytes, bytes]]) -> None:
    """Produce ``values`` (key, value) to partition 0 as ONE record batch (huge batch size,
    sent only on flush), so a consumer gets all of them or none: with at most
    MAX_RECORDS (5000) of them, the daemon feeds them in one call and they join at once."""
    from kafka import KafkaProducer

    assert len(values) <= 5000
    producer = KafkaProducer(bootstrap_servers=bootstrap, batch_size=16 * 1024 * 1024,
                             linger_ms=600_000, max_request_size=32 * 1024 * 1024,
                             request_timeout_ms=10_000, delivery_timeout_ms=700_000)
    try:
        futures = [producer.send(topic, key=k, value=v, partition=0) for k, v in values]
        producer.flush(30)
        offsets = [f.get(10).offset for f in futures]
        assert offsets == list(range(offsets[0], offsets[0] + len(values)))
    finally:
        producer.close(timeout=5)


def test_drift_is_recalibrated_within_three_runs(
        kafka_bootstrap: str, kafka_topics: Callable[..., list[str]], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    preds_topic, labels_topic = kafka_topics(count=2, partitions=4)
    (cal_topic,) = kafka_topics(count=1, partitions=1)
    out = tmp_path / "calibrators"
    # issue 22: documents signed with a key from the environment; a broken file in
    # output_dir (a 401-digit parameter) is reported at start, and the daemon goes on
    private, public = keygen()
    monkeypatch.setenv("CALMON_SIGNING_KEY", private)  # the daemon inherits it
    keys = [{"id": "k1", "public_key": public}]
    broken = out / "old" / "__all__" / "latest.json"
    broken.parent.mkdir(parents=True)
    broken.write_text('{"model": "old", "segment": "__all__", "version": 1, "method": '
                      '"temperature", "input": "logit", "params": {"temperature": 1'
                      + "0" * 400 + "}}", encoding="utf-8")
    cfg = write_config(tmp_path / "calmon.yaml", kafka_bootstrap, preds_topic, labels_topic,
                       kafka={"calibrators_topic": cal_topic},
                       metrics={"windows": ["1h", "24h"]},
                       recalibration={**RECAL, "output_dir": str(out)},
                       calibrators={"signing_key": "${CALMON_SIGNING_KEY}", "key_id": "k1",
                                    "verify_keys": keys})
    rng = np.random.default_rng(2026)
    first = Stream()
    first.extend(binary_logit_stream(rng, "bin", 3000, BASE_TS, 2400.0, prefix="a"))
    first.extend(multiclass_logit_stream(rng, "mc5", 2000, 5, BASE_TS, 2400.0, prefix="a"))
    t2 = BASE_TS + 2400.0 + 3600.0 + 1200.0  # the first half is out of the 1h window
    drifted = {
        "bin": binary_logit_stream(rng, "bin", 5000, t2, 2400.0, scale=2.5, prefix="b"),
        "mc5": multiclass_logit_stream(rng, "mc5", 4000, 5, t2, 2400.0, scale=2.5,
                                       prefix="b"),
    }
    second = Stream().extend(drifted["bin"]).extend(drifted["mc5"])
    n1, n2 = len(first), len(second)

    with CalmonDaemon(cfg) as daemon, Producer(kafka_bootstrap) as producer:
        # ---- first half: calibrated, nothing may fire
        producer.send(records(first, preds_topic, labels_topic, "both", seed=1))
        daemon.wait_counters({"joined": n1})

        def ran_on_first_half() -> Scrape | None:
            # with no live calibrator a run sets calibrated_ece to the window's ECE:
            # equal values mean a run has seen the whole first half
            sc = daemon.scrape()
            cal, raw = gauge(sc, "calmon_calibrated_ece"), gauge(sc, "calmon_ece")
            ok = set(cal) == set(MODELS) and cal == raw
            return sc if ok and daemon.counters()["joined"] == n1 else None

        sc = wait_until(ran_on_first_half, 10 * INTERVAL, "a run over the first half")
        assert not any(sc.get("calmon_drift", {}).values()), sc.get("calmon_drift")
        # pre-created at 0 (issue 12), so increase() sees the first refit
        assert not any(sc.get("calmon_recalibrations_total", {}).values())
        assert [p for p in out.rglob("latest.json")] == [broken]
        assert "old/__all__/latest.json" in daemon.log_tail(400)  # reported at start

        # ---- second half: every prediction first; then each model's labels as one
        # record batch, so its drifted samples join in one engine batch (a run never
        # sees a part of them)
        producer.send(records(second, preds_topic, labels_topic, "preds", seed=2))
        daemon.wait_counters({"predictions": n1 + n2})
        joined = n1
        for m in MODELS:
            send_as_one_batch(kafka_bootstrap, labels_topic,
                              [(str(lab["id"]).encode(), dumps(lab))
                               for lab in drifted[m].labels])
            joined += len(drifted[m])
            daemon.wait_counters({"joined": joined})

        def recalibrated() -> tuple[dict[str, Any], Scrape] | None:
            docs = {m: latest(out, m) for m in MODELS}
            if not all(p.exists() for p in docs.values()):
                return None
            sc = daemon.scrape()
            # honest calibrated ECE: nothing was predicted after the fit yet, so no
            # number, and the samples gauge says 0
            n = gauge(sc, "calmon_calibrated_samples")
            if not all(n.get(m) == 0 for m in MODELS):
                return None
            return {m: read_json(p) for m, p in docs.items()}, sc

        # a deadline for a busy machine, not a speed claim (runs come every INTERVAL)
        docs, sc = wait_until(recalibrated, 60 * INTERVAL,
                              "published calibrators and calmon_calibrated_samples 0",
                              detail=daemon.log_tail)
        assert not set(gauge(sc, "calmon_calibrated_ece")) & set(MODELS)
        versions = series(sc, "calmon_calibrator_version", "model", "segment")
        temps = series(sc, "calmon_calibrator_temperature", "model", "segment")
        outcomes = series(sc, "calmon_recalibrations_total", "model", "segment", "method",
                          "outcome")
        for m in MODELS:
            doc = docs[m]
            assert doc["method"] == "temperature" and doc["segment"] == "__all__"
            # fitted on the samples after the estimated change: the drifted ones
            n_fit = doc["fit"]["samples"] + doc["fit"]["holdout_samples"]
            assert 0.8 * len(drifted[m]) <= n_fit <= len(drifted[m]) + 100, n_fit
            assert doc["change_ts"] >= BASE_TS + 2000.0  # the end of the calm half or later
            t = doc["params"]["temperature"]
            assert abs(t / 2.5 - 1.0) < 0.10, (m, t, doc["fit"])
            assert doc["fit"]["holdout_after"]["ece"] < doc["fit"]["holdout_before"]["ece"]
            assert doc["trigger"] in ("ece_above", "observed_over_expected")
            assert versions[(m, "__all__")] == doc["version"] == 1
            assert temps[(m, "__all__")] == t
            assert outcomes[(m, "__all__", "temperature", "published")] == 1
            assert doc["signature"]["key_id"] == "k1"
        evidence = series(sc, "calmon_drift_evidence", "model", "segment")
        assert set(evidence) >= {(m, "__all__") for m in MODELS}

        # ---- the same documents on kafka.calibrators_topic, for serving code
        watcher = CalibratorWatcher(topic=cal_topic, bootstrap_servers=kafka_bootstrap,
                                    min_interval=0.0, consumer_settings=dict(FAST_CLIENT),
                                    verify_keys=keys)  # signed by the daemon: accepted
        try:
            def watched() -> bool:
                watcher.refresh(force=True)
                return all(watcher.version(m) == 1 for m in MODELS)

            wait_until(watched, 20, "the topic watcher at v1")
            z = np.random.default_rng(0).normal(0, 4, 500)
            zz = np.random.default_rng(1).normal(0, 3, (500, 5))
            tb, tm = docs["bin"]["params"]["temperature"], docs["mc5"]["params"]["temperature"]
            bias = docs["bin"]["params"]["bias"]
            np.testing.assert_allclose(watcher.apply("bin", z), expit(z / tb + bias),
                                       atol=1e-12)
            bias_mc = np.asarray(docs["mc5"]["params"]["bias"])  # K class biases
            np.testing.assert_allclose(watcher.apply("mc5", zz),
                                       np.exp(log_softmax(zz / tm + bias_mc, axis=1)),
                                       atol=1e-12)
            assert watcher.refused == 0
        finally:
            watcher.close()
        assert not any(v for (m, _), v in versions.items() if m == "old")
        assert private not in daemon.log_tail(100_000)  # the signing key is never logged


def test_dead_webhook_neither_blocks_consuming_nor_publishing(
        kafka_bootstrap: str, kafka_topics: Callable[..., list[str]], tmp_path: Path) -> None:
    preds_topic, labels_topic = kafka_topics(count=2, partitions=4)
    out = tmp_path / "calibrators"
    closed = _free_port()  # bound once, released: nothing listens there
    cfg = write_config(tmp_path / "calmon.yaml", kafka_bootstrap, preds_topic, labels_topic,
                       metrics={"windows": ["1h", "24h"]},
                       recalibration={**RECAL, "cooldown": "1h", "output_dir": str(out)},
                       alerts={"webhook": f"http://127.0.0.1:{closed}/api/v2/alerts"})
    rng = np.random.default_rng(7)
    drifted = binary_logit_stream(rng, "bin", 3000, BASE_TS, 1800.0, scale=2.5, prefix="a")
    later = binary_logit_stream(rng, "bin", 3000, BASE_TS + 1800.0, 600.0, scale=2.5,
                                prefix="b")
    with CalmonDaemon(cfg) as daemon, Producer(kafka_bootstrap) as producer:
        producer.send(records(drifted, preds_topic, labels_topic, "both", seed=1))
        wait_until(lambda: latest(out, "bin").exists(), 20, "a published calibrator",
                   detail=daemon.log_tail)
        # the scheduler is now busy failing to deliver its alerts: consuming goes on
        producer.send(records(later, preds_topic, labels_topic, "both", seed=2))
        daemon.wait_counters({"joined": len(drifted) + len(later)}, timeout=20)
        wait_until(lambda: "CalmonRefitPublished not delivered" in daemon.log_tail(200),
                   20, "the failed delivery to be logged", detail=daemon.log_tail)
        sc = daemon.scrape()
        outcomes = series(sc, "calmon_recalibrations_total", "model", "segment", "method",
                          "outcome")
        assert {k: v for k, v in outcomes.items() if v} == {
            ("bin", "__all__", "temperature", "published"): 1}
        assert read_json(latest(out, "bin"))["version"] == 1
        assert daemon.running
