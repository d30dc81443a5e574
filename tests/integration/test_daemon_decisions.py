"""The model's own decision through a real ``calmon run`` (contract v5 §1, §2): a
prediction whose decision breaks the rules is counted as ``bad_decision`` and
dead-lettered unchanged with its headers, a label naming a class the model does not
list as ``label_out_of_range``, and ``calmon_accuracy`` scores the decisions of the
valid predictions, labels given as names joining as their index."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from calmon.io.dead_letter import REASON_HEADER, SOURCE_HEADER
from tests.conftest import consume
from tests.daemon_helpers import (
    BASE_TS,
    CalmonDaemon,
    Producer,
    dumps,
    end_positions,
    series,
    write_config,
)

pytestmark = pytest.mark.integration

N = 300
CLASSES = ["legit", "fraud"]


def test_bad_decisions_are_dead_lettered_and_counted(
    kafka_bootstrap: str, kafka_topics: Callable[..., list[str]], tmp_path: Path
) -> None:
    preds_topic, labels_topic, dlq = kafka_topics(count=3, partitions=2)
    cfg = write_config(tmp_path / "calmon.yaml", kafka_bootstrap, preds_topic, labels_topic,
                       kafka={"dead_letter_topic": dlq}, fields={"decision": "action"},
                       models={"fraud": {"classes": CLASSES, "threshold": 0.1}})
    rng = np.random.default_rng(61)
    p = rng.uniform(0, 1, N)
    y = (rng.random(N) < p).astype(int)
    d = np.where(rng.random(N) < 0.6, rng.random(N) < 0.5, -1).astype(int)
    records = []
    for i in range(N):
        pred = {"id": f"f{i}", "model": "fraud", "ts": BASE_TS + i, "prob": float(p[i])}
        if d[i] >= 0:
            pred["action"] = CLASSES[d[i]] if i % 2 else int(d[i])
        label = CLASSES[y[i]] if i % 3 else int(y[i])
        records += [(preds_topic, f"f{i}".encode(), dumps(pred)),
                    (labels_topic, f"f{i}".encode(),
                     dumps({"id": f"f{i}", "label": label, "ts": BASE_TS + i + 1}))]
    bad = [(preds_topic, f"b{i}".encode(),
            dumps({"id": f"b{i}", "model": "fraud", "ts": BASE_TS + 5, "prob": 0.5,
                   "action": v}))
           for i, v in enumerate(["maybe", 2, 0.5, [1], "Fraud"])]
    # a name fraud does not list: its prediction waits on, whichever topic is read first
    unlisted = [(preds_topic, b"u1", dumps({"id": "u1", "model": "fraud", "ts": BASE_TS + 7,
                                           "prob": 0.3})),
                (labels_topic, b"u1", dumps({"id": "u1", "label": "chargeback",
                                            "ts": BASE_TS + 8}))]
    daemon = CalmonDaemon(cfg)
    with daemon.start(), Producer(kafka_bootstrap) as producer:
        sent = producer.send(records[:14] + unlisted + bad + records[14:])
        daemon.wait_positions(end_positions(sent))
        daemon.wait_checkpoint_of(end_positions(sent), "a checkpoint after the last record")
        st = daemon.status()
        sc = daemon.scrape()
    invalid = series(sc, "calmon_invalid_records_total", "topic", "reason")
    assert {k: v for k, v in invalid.items() if v} == {
        ("predictions", "bad_decision"): 5.0, ("labels", "label_out_of_range"): 1.0}
    c = st["counters"]
    assert (c["predictions"], c["labels"], c["joined"], c["invalid"]) == (N + 1, N, N, 6)
    assert st["pending"] == 1
    accuracy = series(sc, "calmon_accuracy", "model", "segment", "window")
    want = np.mean(np.where(d >= 0, d, p >= 0.1) == y)
    assert abs(accuracy[("fraud", "__all__", "7d")] - want) < 1e-9
    letters = consume(kafka_bootstrap, dlq, 6, timeout=30)
    got = sorted((dict(r.headers)[REASON_HEADER].decode(), r.value) for r in letters)
    assert got == sorted([("bad_decision", v) for _, _, v in bad]
                         + [("label_out_of_range", unlisted[1][2])])
    assert all(SOURCE_HEADER in dict(r.headers) for r in letters)
