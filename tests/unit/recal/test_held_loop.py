"""The daemon's loop holds a refit (contract section 6, v4): counted in /status
(``Recalibrator.status()["held"]``) and in calmon_recalibrations_total{outcome="held"}.
A real engine, no Kafka: a binary model calibrated for two hours, sharpened 2.5x for 40
minutes (labelled), then 20 minutes of predictions calibrated again whose labels have not
come: their score histogram is far from the refit's reference."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from prometheus_client import generate_latest

from calmon.engine.engine import Engine
from calmon.engine.records import Kind, Raw
from calmon.io.exporter import recal_metrics
from calmon.io.exposition import new_registry
from calmon.recal.loop import Recalibrator
from tests.recal_helpers import BASE_TS, Stream, binary_logit_stream, feed, recal_config

HOUR = 3600.0
T2 = BASE_TS + 5 * HOUR


def test_a_held_refit_is_counted_in_status_and_metrics(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    s = Stream()
    s.extend(binary_logit_stream(rng, "bin", 2000, BASE_TS, 2 * HOUR, prefix="a"))
    s.extend(binary_logit_stream(rng, "bin", 6000, T2, 2400.0, scale=2.5, prefix="b"))
    tail = binary_logit_stream(rng, "bin", 800, T2 + 2400.0, 1200.0, prefix="c")
    cfg = recal_config(tmp_path)
    engine = Engine(cfg)
    recal = Recalibrator(cfg, engine)
    feed(engine, s)
    engine.feed([Raw(Kind.PREDICTION, json.dumps(p).encode(), None, f"test/c/{i}")
                 for i, p in enumerate(tail.preds)])  # their labels have not come
    events = recal.run_once()
    held = [e for e in events if e.kind == "held"]
    assert [e.kind for e in events] == ["drift", "held"], events
    f = held[0].fields
    # the newer predictions: the tail's, in the 1h window's buckets (225 s) that start
    # at or after the newest labelled (fitted) prediction
    newest = max(p["ts"] for p in s.preds)
    start = np.ceil(newest / 225.0) * 225.0
    assert f["newer_samples"] == sum(p["ts"] >= start for p in tail.preds) >= 300
    assert f["psi"] > f["threshold"] >= 0.1
    assert not any(Path(cfg.recalibration.output_dir).rglob("*.json"))  # nothing published
    assert recal.status()["held"] == 1

    class One:
        def collect(self):
            return recal_metrics(recal.metrics_state())

    reg = new_registry()
    reg.register(One())  # type: ignore[arg-type]
    line = next(x for x in generate_latest(reg).decode().splitlines()
                if x.startswith("calmon_recalibrations_total{") and 'outcome="held"' in x
                and 'model="bin"' in x)
    assert float(line.split()[-1]) == 1.0
