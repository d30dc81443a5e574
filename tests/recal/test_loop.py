"""The recalibration loop on a real engine, no Kafka: ``Engine.feed`` + ``run_once``.

Every expected number is computed here from the records the test made, with
numpy/scipy (ECE by the contract's definition: 15 equal-width right-closed bins),
never with calmon's metrics or calibrators.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from scipy.optimize import minimize_scalar
from scipy.special import expit, log_softmax

from calmon.engine.engine import Engine
from calmon.recal.loop import Recalibrator
from calmon.recal.registry import Registry
from tests.recal.helpers import (
    BASE_TS,
    Stream,
    arrays,
    binary_logit_stream,
    ece_np,
    feed,
    latest,
    multiclass_logit_stream,
    nll_np,
    read_json,
    recal_config,
    step_prob_stream,
    temperature_probs,
    window_mask,
)

HOUR = 3600.0
WINDOWS = {"1h": HOUR, "24h": 24 * HOUR}


def fit_temperature(z: np.ndarray, y: np.ndarray) -> float:
    """NLL-optimal temperature by scipy's bounded scalar minimiser over log T."""
    if z.ndim == 1:
        def nll(lt: float) -> float:
            s = z / math.exp(lt)
            return float(np.mean(np.logaddexp(0.0, s) - y * s))
    else:
        def nll(lt: float) -> float:
            return float(-np.mean(log_softmax(z / math.exp(lt), axis=1)[np.arange(len(y)), y]))
    res = minimize_scalar(nll, bounds=(-5.0, 5.0), method="bounded",
                          options={"xatol": 1e-10})
    return math.exp(res.x)


def drift_stream(seed: int) -> Stream:
    """Two hours of calibrated traffic, then (3h later) 40 minutes of logits sharpened
    by 1/T: multiplied by T = 2.5, for a binary and a 5-class model."""
    rng = np.random.default_rng(seed)
    s = Stream()
    s.extend(binary_logit_stream(rng, "bin", 2000, BASE_TS, 2 * HOUR, prefix="a"))
    s.extend(multiclass_logit_stream(rng, "mc5", 1500, 5, BASE_TS, 2 * HOUR, prefix="a"))
    t2 = BASE_TS + 5 * HOUR
    s.extend(binary_logit_stream(rng, "bin", 6000, t2, 2400.0, scale=2.5, prefix="b"))
    s.extend(multiclass_logit_stream(rng, "mc5", 4000, 5, t2, 2400.0, scale=2.5, prefix="b"))
    return s


def test_drift_refit_publishes_temperature_and_calibrated_view(tmp_path: Path) -> None:
    """Acceptance 1 at engine level and acceptance 8: the published temperature is the
    NLL optimum on the fit part, its holdout numbers are the numpy ones, and
    ``calibrated_ece`` is the ECE of the window after the published calibrator."""
    cfg = recal_config(tmp_path)
    engine = Engine(cfg)
    recal = Recalibrator(cfg, engine)
    stream = drift_stream(seed=1)
    feed(engine, stream)
    results = recal.run_once()
    assert sorted(r.outcome for r in results) == ["published", "published"], results

    out = Path(cfg.recalibration.output_dir)
    now = max(p["ts"] for p in stream.preds)
    state = recal.metrics_state()
    calibrated = {(m, s, w): v for m, s, w, v in state.calibrated_ece}
    for model in ("bin", "mc5"):
        doc = read_json(latest(out, model))
        assert doc["version"] == 1 and doc["method"] == "temperature"
        assert doc["model"] == model and doc["segment"] == "__all__"
        t = doc["params"]["temperature"]
        assert abs(t / 2.5 - 1.0) < 0.10, (model, t)

        ts, z, y, kind = arrays(stream, model)
        assert doc["input"] == kind
        # the refit saw the 1h trigger window only: the drifted samples, split in time
        recent = window_mask(ts, now, HOUR)
        assert recent.sum() == (6000 if model == "bin" else 4000)
        order = np.argsort(ts[recent], kind="stable")
        zr, yr = z[recent][order], y[recent][order]
        fit = doc["fit"]
        n_hold = fit["holdout_samples"]
        assert fit["samples"] + n_hold == len(yr)
        assert abs(n_hold - 0.3 * len(yr)) <= 1
        zf, yf, zh, yh = zr[:-n_hold], yr[:-n_hold], zr[-n_hold:], yr[-n_hold:]
        assert t == pytest.approx(fit_temperature(zf, yf), rel=1e-4)
        before = temperature_probs(zh, kind, 1.0)
        after = temperature_probs(zh, kind, t)
        assert fit["holdout_before"]["ece"] == pytest.approx(ece_np(before, yh), abs=1e-9)
        assert fit["holdout_before"]["nll"] == pytest.approx(nll_np(before, yh), abs=1e-9)
        assert fit["holdout_after"]["ece"] == pytest.approx(ece_np(after, yh), abs=1e-9)
        assert fit["holdout_after"]["nll"] == pytest.approx(nll_np(after, yh), abs=1e-9)
        assert fit["holdout_after"]["ece"] < fit["holdout_before"]["ece"]
        assert fit["holdout_after"]["nll"] < fit["holdout_before"]["nll"]

        # acceptance 8: right after the publishing run the calibrated view already
        # shows the published calibrator, on every window
        for w, seconds in WINDOWS.items():
            mask = window_mask(ts, now, seconds)
            want = ece_np(temperature_probs(z[mask], kind, t), y[mask])
            assert calibrated[(model, "__all__", w)] == pytest.approx(want, abs=1e-9), (model, w)
        raw_1h = {r.model: r.stats.ece for r in engine.view().rows if r.window == "1h"}
        assert calibrated[(model, "__all__", "1h")] < raw_1h[model]

        assert state.versions[(model, "__all__")] == 1
        assert state.temperatures[(model, "__all__")] == t
        assert state.recalibrations == {
            ("bin", "__all__", "temperature", "published"): 1,
            ("mc5", "__all__", "temperature", "published"): 1}

    # the next run keeps showing the same calibrated view and does not refit again:
    # after the published calibrator nothing is significant any more
    assert recal.run_once() == []
    again = {(m, s, w): v for m, s, w, v in recal.metrics_state().calibrated_ece}
    assert again == calibrated
    assert not any(recal.metrics_state().drift.values())


def test_calibrated_ece_reads_the_same_window_as_calmon_ece(tmp_path: Path) -> None:
    """With a published identity calibrator (temperature 1 on logits) the calibrated view
    is the model's own window: ``calibrated_ece`` must equal ``calmon_ece`` for every
    window, also when samples lie between now - W and the window's first bucket."""
    cfg = recal_config(tmp_path, recalibration={"min_samples": 10**9})  # never refit
    engine = Engine(cfg)
    recal = Recalibrator(cfg, engine)
    rng = np.random.default_rng(2)
    stream = binary_logit_stream(rng, "bin", 8000, BASE_TS, 2 * HOUR, scale=1.3)
    feed(engine, stream)
    Registry(cfg.recalibration.output_dir).publish(
        {"model": "bin", "segment": "__all__", "method": "temperature",
         "params": {"temperature": 1.0}, "input": "logit"})
    recal.run_once()
    calibrated = {w: v for m, s, w, v in recal.metrics_state().calibrated_ece}
    rows = {r.window: r.stats for r in engine.view().rows}
    ts, z, y, _ = arrays(stream, "bin")
    now = float(ts.max())
    for w, seconds in WINDOWS.items():
        mask = window_mask(ts, now, seconds)
        assert rows[w].samples == mask.sum()  # the documented bucket window
        want = ece_np(expit(z[mask]), y[mask])
        assert rows[w].ece == pytest.approx(want, abs=1e-9)
        assert calibrated[w] == pytest.approx(want, abs=1e-9), w


def test_auto_picks_a_binning_method_for_a_step_distortion(tmp_path: Path) -> None:
    """Acceptance 2: scores whose true probability is a step (0.2 below 0.5, 0.8 above)
    cannot be fixed by a temperature; ``auto`` publishes isotonic or histogram."""
    cfg = recal_config(tmp_path, recalibration={"method": "auto"})
    engine = Engine(cfg)
    recal = Recalibrator(cfg, engine)
    stream = step_prob_stream(np.random.default_rng(3), "step", 6000, BASE_TS, 1800.0)
    feed(engine, stream)
    (result,) = recal.run_once()
    assert result.outcome == "published", result
    doc = read_json(latest(Path(cfg.recalibration.output_dir), "step"))
    assert doc["method"] in ("isotonic", "histogram"), doc["method"]
    assert result.method == doc["method"] and doc["input"] == "prob"

    # the published map, applied here from its parameters, gives the holdout numbers
    _, s, y, _ = arrays(stream, "step")
    n_hold = doc["fit"]["holdout_samples"]
    sh, yh, sf, yf = s[-n_hold:], y[-n_hold:], s[:-n_hold], y[:-n_hold]
    params = doc["params"]
    if doc["method"] == "histogram":
        edges, values = np.array(params["edges"]), np.array(params["values"])
        idx = np.clip(np.searchsorted(edges, sh, side="left") - 1, 0, len(values) - 1)
        ph = values[idx]
    else:
        ph = np.interp(sh, params["x"], params["y"])
    after = doc["fit"]["holdout_after"]
    assert after["ece"] == pytest.approx(ece_np(ph, yh), abs=1e-9)
    assert after["nll"] == pytest.approx(nll_np(ph, yh), abs=1e-9)
    # and it beats the best temperature scaling (scipy) on the same split
    logit = np.log(np.clip(sh, 1e-15, 1)) - np.log(np.clip(1 - sh, 1e-15, 1))
    logit_f = np.log(np.clip(sf, 1e-15, 1)) - np.log(np.clip(1 - sf, 1e-15, 1))
    t = fit_temperature(logit_f, yf)
    assert after["nll"] < nll_np(expit(logit / t), yh) - 0.01


def test_a_refit_that_does_not_beat_the_live_calibrator_is_rejected(tmp_path: Path) -> None:
    """Acceptance 4: a good (not perfect) histogram calibrator is live; the data drift
    enough to fire, but a temperature refit is far worse than the live map, so the
    refit is counted ``rejected`` and nothing is published."""
    cfg = recal_config(tmp_path)
    out = Path(cfg.recalibration.output_dir)
    registry = Registry(out)
    registry.publish({"model": "step", "segment": "__all__", "method": "histogram",
                      "params": {"edges": [0.0, 0.5, 1.0], "values": [0.2, 0.65]},
                      "input": "prob"})
    live_bytes = latest(out, "step").read_bytes()
    engine = Engine(cfg)
    clock = [1_000_000.0]
    recal = Recalibrator(cfg, engine, clock=lambda: clock[0])
    stream = step_prob_stream(np.random.default_rng(4), "step", 6000, BASE_TS, 1800.0)
    feed(engine, stream)

    (result,) = recal.run_once()
    assert result.outcome == "rejected", result
    assert registry.versions("step", "__all__") == [1]
    assert latest(out, "step").read_bytes() == live_bytes
    state = recal.metrics_state()
    assert state.recalibrations == {("step", "__all__", "temperature", "rejected"): 1}
    assert state.versions == {("step", "__all__"): 1}
    assert state.drift[("step", "__all__", "ece_above")] == 1

    # independently: the live map beats the best temperature on the holdout part
    _, s, y, _ = arrays(stream, "step")
    n_hold = result.holdout_samples
    sh, yh = s[-n_hold:], y[-n_hold:]
    live = np.where(sh <= 0.5, 0.2, 0.65)
    assert result.before is not None
    assert result.before.nll == pytest.approx(nll_np(live, yh), abs=1e-9)
    assert result.before.ece == pytest.approx(ece_np(live, yh), abs=1e-9)
    lg = np.log(s / (1 - s))
    t = fit_temperature(lg[:-n_hold], y[:-n_hold])
    assert nll_np(expit(lg[-n_hold:] / t), yh) > nll_np(live, yh) + 0.01

    # inside the cooldown the trigger keeps firing but nothing is refitted ...
    assert recal.run_once() == []
    assert recal.metrics_state().recalibrations == state.recalibrations
    # ... after it, the refit is tried (and rejected) again
    clock[0] += cfg.recalibration.cooldown
    (again,) = recal.run_once()
    assert again.outcome == "rejected"
    assert recal.metrics_state().recalibrations == {
        ("step", "__all__", "temperature", "rejected"): 2}
    assert registry.versions("step", "__all__") == [1]


def test_ece_increase_compares_with_the_live_documents_holdout_ece(tmp_path: Path) -> None:
    """``ece_increase`` compares with the holdout ECE recorded in the live calibrator's
    document, so it works for a restarted Recalibrator (and follows a CLI rollback)."""
    cfg = recal_config(tmp_path)
    engine = Engine(cfg)
    clock = [1_000_000.0]
    first = Recalibrator(cfg, engine, clock=lambda: clock[0])
    rng = np.random.default_rng(12)
    feed(engine, binary_logit_stream(rng, "bin", 5000, BASE_TS, 1800.0, scale=2.5, prefix="a"))
    (r1,) = first.run_once()
    assert r1.outcome == "published" and r1.after is not None

    # later the model sharpens further; only ece_increase is configured now
    only_increase = {"triggers": {"ece_above": None, "ece_increase": 0.02,
                                  "observed_over_expected": None}}
    cfg2 = recal_config(tmp_path, recalibration=only_increase)
    feed(engine, binary_logit_stream(rng, "bin", 5000, BASE_TS + 2 * HOUR, 1800.0,
                                     scale=7.5, prefix="b"))
    clock[0] += 10.0
    restarted = Recalibrator(cfg2, engine, clock=lambda: clock[0])  # no recal state at all
    (r2,) = restarted.run_once()
    assert r2.outcome == "published"
    assert restarted.metrics_state().drift[("bin", "__all__", "ece_increase")] == 1
    doc = read_json(latest(Path(cfg.recalibration.output_dir), "bin"))
    assert doc["version"] == 2 and doc["trigger"] == "ece_increase"
    assert abs(doc["params"]["temperature"] / 7.5 - 1.0) < 0.10
