"""One stream both ways: ``replay --recalibrate`` and the daemon on a real broker agree
on when a drift is caught, with labels in the README's form (no ``ts``).

Replay used to read every label without a ts after every prediction, so a backtest
alarmed only at the end of the data; it now reads such a label at its place in its
file (the labels file in the order of the predictions: right after its prediction).
The daemon is fed the same stream one second of event time at a time, each second's
labels right after its predictions, and runs a check after each; replay checks every
second of event time. Both must alarm at the same check, with the same estimated
change.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from scipy.special import expit

from calmon.cli import main
from tests.daemon_helpers import (
    CalmonDaemon,
    Producer,
    end_positions,
    series,
    wait_until,
    write_config,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # each test over ~30 s on 2 cores

T0 = 1_764_460_800.0  # a multiple of the check interval
SECONDS, CHANGE_AT, RATE = 30, 12, 100  # event seconds, the change, predictions a second
# no refit (min_samples out of reach): the alarm stays latched, so the daemon's gauge
# says at which check it came
RECAL = {"enabled": True, "interval": "1s", "cooldown": "1h", "window": "1m",
         "min_samples": 1_000_000, "buffer": 20_000, "method": "temperature"}


def stream(seed: int = 3) -> tuple[list[dict], list[dict]]:
    """A binary logit model, calibrated, then reporting 3x its log-odds from CHANGE_AT."""
    rng = np.random.default_rng(seed)
    n = SECONDS * RATE
    ts = T0 + np.sort(rng.uniform(0, SECONDS, n))
    x = rng.normal(-0.5, 1.5, n)
    y = (rng.random(n) < expit(x)).astype(int)
    z = np.where(ts >= T0 + CHANGE_AT, 3.0 * x, x)
    preds = [{"id": f"r{i}", "model": "ctr", "ts": float(ts[i]), "logit": float(z[i])}
             for i in range(n)]
    labels = [{"id": f"r{i}", "label": int(y[i])} for i in range(n)]  # README: no ts
    return preds, labels


def replay_drift(tmp_path: Path, cfg: Path, preds: list[dict], labels: list[dict]
                 ) -> dict:
    p, lab = tmp_path / "p.jsonl", tmp_path / "l.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in preds), encoding="utf-8")
    lab.write_text("".join(json.dumps(r) + "\n" for r in labels), encoding="utf-8")
    import io
    from contextlib import redirect_stdout

    buf = io.StringIO()
    with redirect_stdout(buf):
        assert main(["replay", "--predictions", str(p), "--labels", str(lab), "-c", str(cfg),
                     "--recalibrate", "--json"]) == 0
    events = [e for e in json.loads(buf.getvalue())["events"] if e["kind"] == "drift"]
    assert events, "the backtest never alarmed"
    return events[0]


def test_replay_and_the_daemon_alarm_at_the_same_check(tmp_path: Path, kafka_topics,
                                                       kafka_bootstrap: str) -> None:
    preds_topic, labels_topic = kafka_topics(count=2, partitions=2)
    cfg = write_config(tmp_path / "c.yaml", kafka_bootstrap, preds_topic, labels_topic,
                       recalibration={**RECAL, "output_dir": str(tmp_path / "cal")},
                       segments={"slices": []}, metrics={"windows": ["1m", "1h"]})
    preds, labels = stream()
    backtest = replay_drift(tmp_path, cfg, preds, labels)
    end = T0 + SECONDS
    # caught soon after the change, not at the end of the data as before
    assert T0 + CHANGE_AT < backtest["ts"] < end - 5, backtest

    sent: list = []
    daemon_drift = daemon_change = None
    with CalmonDaemon(cfg) as daemon, Producer(kafka_bootstrap) as producer:
        for second in range(SECONDS):
            lo, hi = T0 + second, T0 + second + 1
            chunk = [i for i, p in enumerate(preds) if lo <= p["ts"] < hi]
            if not chunk:
                continue
            sent += producer.send(
                [(preds_topic, preds[i]["id"].encode(), json.dumps(preds[i]).encode())
                 for i in chunk]
                + [(labels_topic, labels[i]["id"].encode(), json.dumps(labels[i]).encode())
                   for i in chunk])
            daemon.wait_positions(end_positions(sent))
            n = int(daemon.status()["recalibration"]["checks"])
            # a check that began after the chunk was read has completed at n + 2
            wait_until(lambda n=n: int(daemon.status()["recalibration"]["checks"]) >= n + 2,
                       60, "a check after the chunk", detail=daemon.log_tail)
            sc = daemon.scrape()
            drifting = {k: v for k, v in series(sc, "calmon_drift", "model", "segment",
                                                "trigger").items() if v == 1.0}
            if drifting and daemon_drift is None:
                daemon_drift = max(preds[i]["ts"] for i in chunk)  # the check's "now"
                daemon_change = series(sc, "calmon_drift_change_timestamp_seconds", "model",
                                       "segment").get(("ctr", "__all__"))
                break
    assert daemon_drift is not None, "the daemon never alarmed"
    assert daemon_drift == backtest["ts"], (daemon_drift - T0, backtest["ts"] - T0)
    assert daemon_change == pytest.approx(backtest["change_ts"], abs=1e-6), (
        daemon_change, backtest)
