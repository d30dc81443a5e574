"""Issue 35 points 1 and 2 against the real daemon on the real broker: a model dropped
as idle while it still had unlabelled predictions, and a model that takes a new class
count while a calibrator of the old one is live, leave every other model's
statistics and recalibration checks moving, and take what calmon kept of them along.
Expected numbers come from numpy over the records sent, never from calmon."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from scipy.special import expit, softmax

from calmon.calibrators import fit
from calmon.recal.policy import iso
from calmon.recal.registry import Registry
from tests.conftest import create_topics, unique_topic
from tests.daemon_helpers import CalmonDaemon, Producer, dumps, series, wait_until, write_config
from tests.recal_helpers import ece_np

pytestmark = pytest.mark.integration

DAY = 86400.0
PROGRESS_S = 120.0  # generous for a busy 2-core machine


def _send(prod: Producer, topic: str, records: list[dict[str, Any]]) -> None:
    prod.send([(topic, str(r["id"]).encode(), dumps(r)) for r in records])


def _gauge(d: CalmonDaemon, name: str, model: str, window: str = "7d") -> float | None:
    return series(d.scrape(), name, "model", "segment", "window").get(
        (model, "__all__", window))


def _checks(d: CalmonDaemon) -> int:
    return int(d.status()["recalibration"]["checks"])


def _more_checks(d: CalmonDaemon) -> None:
    """Two more recalibration checks complete (one that began after this was called)."""
    n = _checks(d)
    wait_until(lambda: _checks(d) >= n + 2, PROGRESS_S, "two more recalibration checks",
               detail=lambda: d.log_tail())


def test_a_model_dropped_idle_with_pending_predictions_takes_its_numbers_along(
        kafka_bootstrap: str, tmp_path: Path) -> None:
    preds, labels = unique_topic("fg-p"), unique_topic("fg-l")
    create_topics(kafka_bootstrap, [preds, labels], partitions=1)
    cfg = write_config(tmp_path / "c.yaml", kafka_bootstrap, preds, labels,
                       segments={"slices": []})
    now = time.time()
    with CalmonDaemon(cfg) as d, Producer(kafka_bootstrap) as prod:
        # "old" 15 days behind everything else, three predictions, one labelled
        _send(prod, preds, [{"id": f"o{i}", "model": "old", "ts": now - 15 * DAY + i,
                             "prob": 0.5} for i in range(3)])
        _send(prod, labels, [{"id": "o0", "label": 1}])
        d.wait_counters({"predictions": 3, "joined": 1})
        sc = d.scrape()
        assert series(sc, "calmon_predictions_total", "model")[("old",)] == 3
        p = np.array([0.7, 0.2, 0.9, 0.6])
        y = np.array([1, 0, 1, 0])
        for i in range(4):  # "keep", now: "old" is dropped; keep's numbers go on moving
            _send(prod, preds, [{"id": f"k{i}", "model": "keep", "ts": now + i,
                                 "prob": float(p[i])}])
            _send(prod, labels, [{"id": f"k{i}", "label": int(y[i])}])
            d.wait_counters({"predictions": 4 + i, "joined": 2 + i})
            wait_until(lambda i=i: _gauge(d, "calmon_window_samples", "keep") == i + 1,
                       PROGRESS_S, f"keep's sample {i + 1} shown", detail=lambda: d.log_tail())
            assert _gauge(d, "calmon_ece", "keep") == pytest.approx(
                ece_np(p[:i + 1], y[:i + 1]), abs=1e-9)
        st = d.status()
        assert st["counters"]["joined"] == 5 and "old" not in st["estimates"]
        sc = d.scrape()
        # nothing of "old" is left on a scrape: rows, estimates, process counters
        named = {dict(key).get("model") for samples in sc.values() for key in samples}
        assert "keep" in named and "old" not in named
        assert ("old",) not in series(sc, "calmon_predictions_total", "model")
        assert series(sc, "calmon_series_errors_total", "stage")[("statistics",)] == 0


def _doc(model: str, fitted_at: float, seed: int) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    z = rng.normal(0.0, 2.0, 500)
    y = (rng.random(500) < expit(z / 2.0)).astype(int)
    return fit("temperature", z, y, "logit").to_json(model=model, segment="__all__",
                                                     fitted_at=iso(fitted_at))


def test_a_class_reset_leaves_every_models_recalibration_checks_moving(
        kafka_bootstrap: str, tmp_path: Path) -> None:
    preds, labels = unique_topic("fr-p"), unique_topic("fr-l")
    create_topics(kafka_bootstrap, [preds, labels], partitions=1)
    out = tmp_path / "calibrators"
    cfg = write_config(tmp_path / "c.yaml", kafka_bootstrap, preds, labels,
                       segments={"slices": []},
                       recalibration={"enabled": True, "interval": "1s", "cooldown": "1s",
                                      "window": "1h", "min_samples": 100_000,
                                      "output_dir": str(out)})
    now = time.time()
    reg = Registry(out)  # as the CLI would: a live binary calibrator for each model
    for k, model in enumerate(("flip", "steady")):
        reg.publish(_doc(model, now - 3600, seed=k))
    rng = np.random.default_rng(35)
    with CalmonDaemon(cfg) as d, Producer(kafka_bootstrap) as prod:
        # "flip": five binary predictions (not live: fewer than 10 in the longest window)
        _send(prod, preds, [{"id": f"f{i}", "model": "flip", "ts": now + i,
                             "logit": float(rng.normal())} for i in range(5)])
        _send(prod, labels, [{"id": f"f{i}", "label": i % 2} for i in range(5)])
        _send(prod, preds, [{"id": f"s{i}", "model": "steady", "ts": now + i,
                             "logit": float(rng.normal())} for i in range(200)])
        _send(prod, labels, [{"id": f"s{i}", "label": i % 2} for i in range(200)])
        d.wait_counters({"joined": 205})
        _more_checks(d)
        # "flip" takes three classes: the documented reset
        z = rng.normal(0.0, 1.5, (100, 3))
        y3 = rng.integers(0, 3, 100)
        _send(prod, preds, [{"id": f"g{i}", "model": "flip", "ts": now + 10 + i,
                             "logits": z[i].tolist()} for i in range(100)])
        _send(prod, labels, [{"id": f"g{i}", "label": int(y3[i])} for i in range(100)])
        _send(prod, preds, [{"id": f"t{i}", "model": "steady", "ts": now + 300 + i,
                             "logit": float(rng.normal())} for i in range(150)])
        _send(prod, labels, [{"id": f"t{i}", "label": i % 2} for i in range(150)])
        d.wait_counters({"joined": 455, "class_resets": 1})
        for _ in range(2):  # the checks go on, run after run, and their gauges move
            _more_checks(d)
            samples = series(d.scrape(), "calmon_calibrated_samples", "model", "segment",
                             "window")
            assert samples[("steady", "__all__", "1h")] == 350  # all after its fit
            assert samples[("flip", "__all__", "1h")] == 100  # the new count only
        # flip's binary calibrator is set aside: its 3-class window is read as given
        assert _gauge(d, "calmon_calibrated_ece", "flip", "1h") == pytest.approx(
            ece_np(softmax(z, axis=1), y3), abs=1e-9)
        assert series(d.scrape(), "calmon_series_errors_total", "stage") == {
            ("statistics",): 0.0, ("calibrated",): 0.0}
