"""Event time per model and fair capacity, against the real daemon on the real broker
(contract v3 §2, issue 21): a future record of one model leaves the others' windows
and implicit negatives unchanged; a flood from one model leaves another's joins
exact; 64-bit and 100-bit integer ids join. Expected numbers come from numpy over the
records sent, never from calmon."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.conftest import create_topics, unique_topic
from tests.daemon_helpers import CalmonDaemon, Producer, dumps, series, write_config

pytestmark = pytest.mark.integration

MIN = 60.0


def _ece(conf: np.ndarray, correct: np.ndarray, bins: int = 15) -> float:
    b = np.clip(np.ceil(conf * bins).astype(int) - 1, 0, bins - 1)
    return float(sum(abs(conf[b == k].mean() - correct[b == k].mean()) * (b == k).sum()
                     for k in range(bins) if (b == k).any()) / len(conf))


def _window(d: CalmonDaemon, name: str, model: str, window: str = "1h") -> float | None:
    return series(d.scrape(), name, "model", "segment", "window").get(
        (model, "__all__", window))


def _send(prod: Producer, topic: str, records: list[dict[str, Any]]) -> None:
    prod.send([(topic, str(r["id"]).encode(), dumps(r)) for r in records])


def test_a_future_record_of_one_model_leaves_the_others_alone(
        kafka_bootstrap: str, tmp_path: Path) -> None:
    preds, labels = unique_topic("et-p"), unique_topic("et-l")
    create_topics(kafka_bootstrap, [preds, labels], partitions=2)
    cfg = write_config(tmp_path / "c.yaml", kafka_bootstrap, preds, labels,
                       join={"missing_label": {"value": 0, "after": "30m"}})
    t = time.time() - 10 * MIN  # what the producers' clocks say, give or take
    rng = np.random.default_rng(21)
    # a multiclass model (no implicit negatives: joins at once) with 64- and 100-bit ids
    probs = rng.dirichlet(np.ones(3), 200)
    y_multi = rng.integers(0, 3, 200)
    ids = [2**63 + i if i % 2 else 2**100 + i for i in range(200)]
    multi = [{"id": ids[i], "model": "multi", "ts": t + i, "probs": probs[i].tolist()}
             for i in range(200)]
    multi_labels = [{"id": ids[i], "label": int(y_multi[i])} for i in range(200)]
    # a binary model whose labels will all be positive, 300 of them
    p_bin = rng.uniform(0.05, 0.95, 300)
    binary = [{"id": f"b{i}", "model": "good", "ts": t + i, "prob": float(p_bin[i])}
              for i in range(300)]
    with CalmonDaemon(cfg) as d, Producer(kafka_bootstrap) as prod:
        _send(prod, preds, multi + binary)
        _send(prod, labels, multi_labels)
        d.wait_counters({"predictions": 500, "joined": 200})
        conf = probs.max(axis=1)
        correct = (probs.argmax(axis=1) == y_multi).astype(float)
        assert _window(d, "calmon_window_samples", "multi") == 200
        before = _window(d, "calmon_ece", "multi")
        assert before == pytest.approx(_ece(conf, correct), abs=1e-9)

        # one record of a made-up model, 59 minutes past the others (within the skew)
        _send(prod, preds, [{"id": "x", "model": "made-up", "ts": t + 10 * MIN + 59 * MIN,
                             "prob": 0.5}])
        d.wait_counters({"predictions": 501})
        assert _window(d, "calmon_window_samples", "multi") == 200  # not emptied
        assert _window(d, "calmon_ece", "multi") == before
        # nothing of good's finalised as a negative: its positives are not duplicates
        _send(prod, labels, [{"id": f"b{i}", "label": 1} for i in range(300)])
        d.wait_counters({"labels": 500})
        assert d.counters()["duplicates"] == 0
        assert d.counters()["joined"] == 200
        # good's own clock passes ts + 30m: all 300 join with their real label
        _send(prod, preds, [{"id": "later", "model": "good", "ts": t + 300 + 31 * MIN,
                             "prob": 0.5}])
        d.wait_counters({"predictions": 502, "joined": 500})
        assert d.counters()["duplicates"] == 0
        assert _window(d, "calmon_window_samples", "good") == 300
        assert _window(d, "calmon_observed_rate", "good") == 1.0
        assert _window(d, "calmon_ece", "good") == pytest.approx(
            _ece(p_bin, np.ones(300)), abs=1e-9)


def test_a_flood_from_one_model_leaves_another_models_joins_exact(
        kafka_bootstrap: str, tmp_path: Path) -> None:
    preds, labels = unique_topic("et-fp"), unique_topic("et-fl")
    create_topics(kafka_bootstrap, [preds, labels], partitions=2)
    cfg = write_config(tmp_path / "c.yaml", kafka_bootstrap, preds, labels,
                       join={"max_pending": 1000})
    t = time.time() - 10 * MIN
    rng = np.random.default_rng(19)
    p = rng.uniform(0.05, 0.95, 500)
    y = (rng.uniform(size=500) < p).astype(int)
    quiet = [{"id": f"q{i}", "model": "quiet", "ts": t + i, "prob": float(p[i])}
             for i in range(500)]
    spam = [{"id": f"s{i}", "model": "spam", "ts": t + 500 + i * 0.01, "prob": 0.9}
            for i in range(20_000)]
    with CalmonDaemon(cfg) as d, Producer(kafka_bootstrap) as prod:
        _send(prod, preds, quiet)
        d.wait_counters({"predictions": 500})
        _send(prod, preds, spam)
        d.wait_counters({"predictions": 20_500})
        _send(prod, labels, [{"id": f"q{i}", "label": int(y[i])} for i in range(500)])
        d.wait_counters({"labels": 500, "joined": 500})
        assert _window(d, "calmon_window_samples", "quiet") == 500  # 500 of 500
        assert _window(d, "calmon_ece", "quiet") == pytest.approx(
            _ece(p, y.astype(float)), abs=1e-9)
        expired = series(d.scrape(), "calmon_join_expired_total", "model", "reason")
        assert expired.get(("quiet", "capacity"), 0) == 0
        assert expired[("spam", "capacity")] == 20_000 - 500
        sc = d.scrape()
        assert series(sc, "calmon_series") == {(): 2.0}  # quiet's and spam's __all__
        assert series(sc, "calmon_series_folded_total") == {(): 0.0}
