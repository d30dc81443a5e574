"""The recalibration loop on a real engine, no Kafka: ``Engine.feed`` + ``run_once``.

Every expected number is computed here from the records the test made, with
numpy/scipy (ECE by the contract's definition: 15 equal-width right-closed bins),
never with calmon's metrics or calibrators.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from scipy.special import expit, log_softmax

import calmon.recal.policy as policy_mod
from calmon.engine.engine import Engine
from calmon.io.checkpoint import decode, encode
from calmon.io.exposition import new_registry
from calmon.recal.loop import Recalibrator
from calmon.recal.registry import Registry
from tests.recal_helpers import (
    BASE_TS,
    Stream,
    arrays,
    binary_logit_stream,
    conf_correct,
    ece_np,
    feed,
    latest,
    multiclass_logit_stream,
    nll_np,
    read_json,
    recal_config,
    step_prob_stream,
    window_mask,
)

HOUR = 3600.0
T2 = BASE_TS + 5 * HOUR  # where the drift starts


def drift_stream(seed: int) -> Stream:
    """Two hours of calibrated traffic, then (3h later) 40 minutes of logits sharpened
    2.5x, for a binary and a 5-class model."""
    rng = np.random.default_rng(seed)
    s = Stream()
    s.extend(binary_logit_stream(rng, "bin", 2000, BASE_TS, 2 * HOUR, prefix="a"))
    s.extend(multiclass_logit_stream(rng, "mc5", 1500, 5, BASE_TS, 2 * HOUR, prefix="a"))
    s.extend(binary_logit_stream(rng, "bin", 6000, T2, 2400.0, scale=2.5, prefix="b"))
    s.extend(multiclass_logit_stream(rng, "mc5", 4000, 5, T2, 2400.0, scale=2.5, prefix="b"))
    return s


def nonzero(counts: dict) -> dict:
    return {k: v for k, v in counts.items() if v}


def probs_of(doc: dict, z: np.ndarray) -> np.ndarray:
    """A temperature document applied with scipy: sigmoid(z/T + b) or softmax(z/T + b)."""
    t = doc["params"]["temperature"]
    if z.ndim == 1:
        return expit(z / t + doc["params"]["bias"])
    return np.exp(log_softmax(z / t + np.asarray(doc["params"].get("bias", 0.0)), axis=1))


def test_drift_is_refit_on_post_change_samples_through_the_gate(tmp_path: Path) -> None:
    cfg = recal_config(tmp_path)
    engine = Engine(cfg)
    recal = Recalibrator(cfg, engine)
    stream = drift_stream(seed=1)
    feed(engine, stream)
    events = recal.run_once()
    kinds = {(e.model, e.kind) for e in events}
    assert kinds == {("bin", "drift"), ("bin", "published"), ("mc5", "drift"),
                     ("mc5", "published")}, events
    out = Path(cfg.recalibration.output_dir)
    for model in ("bin", "mc5"):
        doc = read_json(latest(out, model))
        assert doc["version"] == 1 and doc["method"] == "temperature"
        assert abs(doc["params"]["temperature"] / 2.5 - 1) < 0.1, doc["params"]
        if model == "bin":
            assert abs(doc["params"]["bias"]) < 0.2
        # the estimated change time is near the true one, and the refit used only
        # samples after it (the newest ones, from inside the change time's confidence
        # set), split in time
        assert T2 - 600 <= doc["change_ts"] <= T2 + 600, doc["change_ts"] - T2
        ts, z, y, _kind = arrays(stream, model)
        order = np.argsort(ts, kind="stable")
        ts, z, y = ts[order], z[order], y[order]
        post = ts >= doc["change_ts"]
        fit = doc["fit"]
        n = fit["samples"] + fit["holdout_samples"]
        assert 1000 <= n <= post.sum()
        assert ts[-n] <= T2 + 600
        zp, yp = z[-n:], y[-n:]
        n_hold = fit["holdout_samples"]
        assert abs(n_hold - 0.3 * n) <= 1
        zh, yh = zp[-n_hold:], yp[-n_hold:]
        raw = expit(zh) if zh.ndim == 1 else np.exp(log_softmax(zh, axis=1))
        new = probs_of(doc, zh)
        assert fit["holdout_before"]["ece"] == pytest.approx(ece_np(raw, yh), abs=1e-9)
        assert fit["holdout_before"]["nll"] == pytest.approx(nll_np(raw, yh), abs=1e-9)
        assert fit["holdout_after"]["ece"] == pytest.approx(ece_np(new, yh), abs=1e-9)
        assert fit["holdout_after"]["nll"] == pytest.approx(nll_np(new, yh), abs=1e-9)
        # reference: bin counts of the fit part's raw confidences
        zf = zp[:-n_hold]
        conf, _ = conf_correct(expit(zf) if zf.ndim == 1 else
                               np.exp(log_softmax(zf, axis=1)), yp[:-n_hold])
        want = np.bincount(np.clip(np.ceil(conf * 15).astype(int) - 1, 0, 14), minlength=15)
        assert doc["reference"] == want.tolist()
        drift = next(e for e in events if e.model == model and e.kind == "drift")
        assert drift.fields["change_ts"] == doc["change_ts"]
        # the engine's label-free estimates and score PSI get the same calibrator
        apply, reference = engine.calibrators[(model, "__all__")]
        assert reference.tolist() == doc["reference"]
        np.testing.assert_allclose(apply(zh, "logit" if zh.ndim == 1 else "logits"),
                                   probs_of(doc, zh), atol=1e-12)

    # right after the publish, nothing was predicted after fitted_at: honest = no number
    state = recal.metrics_state()
    assert state.calibrated_ece == [] or all(s != "__all__" for _, s, _, _ in
                                             state.calibrated_ece)
    assert {(m, w): n for m, _, w, n in state.calibrated_samples} == {
        ("bin", "1h"): 0, ("bin", "24h"): 0, ("mc5", "1h"): 0, ("mc5", "24h"): 0}
    assert state.versions == {("bin", "__all__"): 1, ("mc5", "__all__"): 1}

    # later traffic (same drifted model) is what the calibrated ECE is computed on
    rng = np.random.default_rng(5)
    later = Stream()
    later.extend(binary_logit_stream(rng, "bin", 1500, T2 + 2400.0 + 60, 1200.0, scale=2.5,
                                     prefix="c"))
    later.extend(multiclass_logit_stream(rng, "mc5", 1500, 5, T2 + 2400.0 + 60, 1200.0,
                                         scale=2.5, prefix="c"))
    feed(engine, later)
    again = recal.run_once()
    assert [e for e in again if e.kind == "published"] == []
    state = recal.metrics_state()
    cal = {(m, w): v for m, _, w, v in state.calibrated_ece}
    counts = {(m, w): n for m, _, w, n in state.calibrated_samples}
    for model in ("bin", "mc5"):
        doc = read_json(latest(out, model))
        ts, z, y, _ = arrays(later, model)
        all_ts = np.concatenate([arrays(stream, model)[0], ts])
        now = float(all_ts.max())
        for w, seconds in (("1h", HOUR), ("24h", 24 * HOUR)):
            mask = window_mask(ts, now, seconds)  # all of `later` is after fitted_at
            assert counts[(model, w)] == mask.sum()
            assert cal[(model, w)] == pytest.approx(ece_np(probs_of(doc, z[mask]), y[mask]),
                                                    abs=1e-9)


def test_another_models_clock_never_moves_a_models_recalibration(tmp_path: Path) -> None:
    """Contract §2 (v3): "now" is per model. A model whose records run 50 minutes ahead
    (within the skew) neither empties another model's calibrated windows nor changes
    its checks: the calibrated ECE of ``bin`` is counted on ``bin``'s own last hour."""
    cfg = recal_config(tmp_path)
    engine = Engine(cfg)
    recal = Recalibrator(cfg, engine)
    rng = np.random.default_rng(11)
    stream = Stream()
    stream.extend(binary_logit_stream(rng, "bin", 2000, BASE_TS, 2 * HOUR, prefix="a"))
    stream.extend(binary_logit_stream(rng, "bin", 6000, T2, 2400.0, scale=2.5, prefix="b"))
    feed(engine, stream)
    assert [e.kind for e in recal.run_once()] == ["drift", "published"]
    later = binary_logit_stream(rng, "bin", 3000, T2 + 2400.0 + 60, 5400.0, scale=2.5,
                                prefix="c")
    ts, z, y, _ = arrays(later, "bin")
    ahead = binary_logit_stream(rng, "ahead", 500, float(ts.max()) + 3000.0, 60.0,
                                prefix="d")
    feed(engine, later)
    feed(engine, ahead)
    assert [e for e in recal.run_once() if e.model == "bin"] == []
    state = recal.metrics_state()
    counts = {(m, w): n for m, _, w, n in state.calibrated_samples}
    cal = {(m, w): v for m, _, w, v in state.calibrated_ece}
    doc = read_json(latest(Path(cfg.recalibration.output_dir), "bin"))
    mask = window_mask(ts, float(ts.max()), HOUR)  # bin's own clock, not ahead's
    assert 0 < mask.sum() < len(ts)
    assert counts[("bin", "1h")] == mask.sum()
    assert cal[("bin", "1h")] == pytest.approx(ece_np(probs_of(doc, z[mask]), y[mask]),
                                               abs=1e-9)
    # /reliability's calibrated diagram is the same window, computed by the run (15
    # right-closed bins of P(y=1)), and only read by the page: more traffic does not
    # change it before the next run
    want = np.bincount(np.clip(np.ceil(probs_of(doc, z[mask]) * 15).astype(int) - 1, 0, 14),
                       minlength=15)
    bins = recal.calibrated_bins("bin", "__all__", "1h")
    assert bins is not None and bins.count.tolist() == want.tolist()
    feed(engine, binary_logit_stream(rng, "bin", 200, float(ts.max()) + 1, 60.0, prefix="e"))
    again = recal.calibrated_bins("bin", "__all__", "1h")
    assert again is not None and again.count.tolist() == want.tolist()
    assert recal.calibrated_bins("ahead", "__all__", "1h") is None  # no calibrator


def test_auto_picks_a_binning_method_for_a_step_distortion(tmp_path: Path) -> None:
    """Scores whose true probability is a step (0.2 below 0.5, 0.8 above) cannot be fixed
    by a sigmoid of the logit; ``auto`` (choosing on its own selection split) publishes
    isotonic or histogram, and its holdout numbers are the published map's."""
    cfg = recal_config(tmp_path, recalibration={"method": "auto"})
    engine = Engine(cfg)
    recal = Recalibrator(cfg, engine)
    stream = step_prob_stream(np.random.default_rng(3), "step", 6000, BASE_TS, 1800.0)
    feed(engine, stream)
    published = [e for e in recal.run_once() if e.kind == "published"]
    assert len(published) == 1, published
    doc = read_json(latest(Path(cfg.recalibration.output_dir), "step"))
    assert doc["method"] in ("isotonic", "histogram"), doc["method"]
    ts, s, y, _ = arrays(stream, "step")
    post = ts >= doc["change_ts"]
    n_hold = doc["fit"]["holdout_samples"]
    sh, yh = s[post][-n_hold:], y[post][-n_hold:]
    params = doc["params"]
    if doc["method"] == "histogram":
        edges, values = np.array(params["edges"]), np.array(params["values"])
        ph = values[np.clip(np.searchsorted(edges, sh, side="left") - 1, 0, len(values) - 1)]
    else:
        ph = np.interp(sh, params["x"], params["y"])
    assert ((ph > 0) & (ph < 1)).all()  # Laplace-smoothed: no certainties
    assert doc["fit"]["holdout_after"]["ece"] == pytest.approx(ece_np(ph, yh), abs=1e-9)
    assert doc["fit"]["holdout_after"]["nll"] == pytest.approx(nll_np(ph, yh), abs=1e-9)


def test_a_refit_that_does_not_beat_the_live_calibrator_is_rejected(tmp_path: Path) -> None:
    """A good (not perfect) histogram calibrator is live; the data drift enough to fire,
    but temperature-with-bias cannot be flat on each side of 0.5, so the refit is
    ``rejected`` and nothing is published; the next try waits for twice the data."""
    cfg = recal_config(tmp_path, recalibration={"cooldown": "10m"})
    out = Path(cfg.recalibration.output_dir)
    registry = Registry(out)
    registry.publish({"model": "step", "segment": "__all__", "method": "histogram",
                      "params": {"edges": [0.0, 0.5, 1.0], "values": [0.2, 0.65]},
                      "input": "prob", "fitted_at": "2000-01-01T00:00:00Z"})
    live_bytes = latest(out, "step").read_bytes()
    engine = Engine(cfg)
    recal = Recalibrator(cfg, engine)
    rng = np.random.default_rng(4)
    feed(engine, step_prob_stream(rng, "step", 6000, BASE_TS, 1800.0, prefix="a"))
    (rejected,) = [e for e in recal.run_once() if e.kind != "drift"]
    assert rejected.kind == "rejected", rejected
    assert registry.versions("step", "__all__") == [1]
    assert latest(out, "step").read_bytes() == live_bytes
    state = recal.metrics_state()
    assert nonzero(state.recalibrations) == {("step", "__all__", "temperature", "rejected"): 1}
    # every series and method is handed to the exporter, which shows them at 0
    assert state.series == [("step", "__all__")] and state.methods == ("temperature",)
    assert state.drift[("step", "__all__", "ece_above")] == 1
    assert state.drift_evidence[("step", "__all__")] >= 1.0
    # the live map is wrong from the start: the change is dated at the first samples
    assert BASE_TS <= state.drift_change_ts[("step", "__all__")] <= BASE_TS + 600
    # and the exporter spells them as the contract does
    from prometheus_client import generate_latest

    from calmon.io.exporter import CalmonCollector

    reg = new_registry()
    reg.register(CalmonCollector(engine, recal=recal.metrics_state))
    text = generate_latest(reg).decode()
    for name in ("calmon_drift_evidence{", "calmon_drift_change_timestamp_seconds{",
                 "calmon_calibrated_samples{", "calmon_alerts_failed_total "):
        assert name in text, name

    # after a rejection the next try waits until the post-change samples have doubled
    # (not for the cooldown: a rejection published nothing), with alpha halved
    feed(engine, step_prob_stream(rng, "step", 2000, BASE_TS + 1800.0, 600.0, prefix="b"))
    assert [e for e in recal.run_once() if e.kind != "drift"] == []
    feed(engine, step_prob_stream(rng, "step", 5000, BASE_TS + 2400.0, 1200.0, prefix="c"))
    (again,) = recal.run_once()
    assert again.kind == "rejected"
    assert again.fields["fit_samples"] + again.fields["holdout_samples"] >= 2 * (
        rejected.fields["fit_samples"] + rejected.fields["holdout_samples"])
    assert nonzero(recal.metrics_state().recalibrations) == {
        ("step", "__all__", "temperature", "rejected"): 2}


def test_hostile_names_stay_inside_output_dir(tmp_path: Path) -> None:
    cfg = recal_config(tmp_path)
    engine = Engine(cfg)
    recal = Recalibrator(cfg, engine)
    names = ["..", "a/b", "\u00e9" * 60, "."]  # 120 bytes: within limits, hashed on disk
    rng = np.random.default_rng(8)
    for i, name in enumerate(names):
        s = binary_logit_stream(rng, name, 3000, BASE_TS, 1800.0, scale=2.5, prefix=f"{i}")
        feed(engine, s)
    events = recal.run_once()
    assert sorted(e.model for e in events if e.kind == "published") == sorted(names)
    out = Path(cfg.recalibration.output_dir).resolve()
    files = [p.resolve() for p in tmp_path.rglob("*.json")]
    assert files and all(out in p.parents for p in files)
    assert all(p.parent.parent.parent == out for p in files)
    assert all(len(part.encode()) <= 120 for p in files for part in p.relative_to(out).parts)
    assert sorted(e["model"] for e in recal.registry.entries()) == sorted(names)


def test_one_failing_series_does_not_stop_the_others(tmp_path: Path, monkeypatch) -> None:
    cfg = recal_config(tmp_path)
    engine = Engine(cfg)
    recal = Recalibrator(cfg, engine)
    rng = np.random.default_rng(9)
    for name in ("good", "bad"):
        feed(engine, binary_logit_stream(rng, name, 3000, BASE_TS, 1800.0, scale=2.5,
                                         prefix=name))
    calls: list[str] = []
    orig = policy_mod.Policy._refit

    def failing(self, now, model, segment, *a, **k):
        calls.append(model)
        if model == "bad":
            raise OSError(28, "No space left on device")
        return orig(self, now, model, segment, *a, **k)

    monkeypatch.setattr(policy_mod.Policy, "_refit", failing)
    events = recal.run_once()
    outcome = {e.model: e.kind for e in events if e.kind != "drift"}
    assert outcome == {"bad": "failed", "good": "published"}
    assert sorted(calls) == ["bad", "good"]
    assert recal.metrics_state().recalibrations[("bad", "__all__", "temperature", "failed")] == 1


def test_a_bad_latest_json_is_skipped_not_raised(tmp_path: Path) -> None:
    cfg = recal_config(tmp_path)
    out = Path(cfg.recalibration.output_dir)
    d = out / "bin" / "__all__"
    d.mkdir(parents=True)
    (d / "latest.json").write_text("[" * 100_000)  # deep nesting
    engine = Engine(cfg)
    recal = Recalibrator(cfg, engine)
    feed(engine, binary_logit_stream(np.random.default_rng(1), "bin", 2000, BASE_TS, 900.0))
    recal.run_once()  # no exception: the file counts as no calibrator
    assert recal.registry.live("bin", "__all__") is None
    (d / "latest.json").write_text(json.dumps({"method": "temperature", "version": "x",
                                               "params": {"temperature": 2}, "input": "logit"}))
    assert recal.registry.live("bin", "__all__") is None


def test_snapshot_restores_the_detectors(tmp_path: Path) -> None:
    cfg = recal_config(tmp_path)
    engine = Engine(cfg)
    recal = Recalibrator(cfg, engine)
    feed(engine, drift_stream(seed=3))
    recal.run_once()
    snap = decode(encode(recal.snapshot()))  # as the checkpoint stores it
    other = Recalibrator(cfg, engine)
    other.restore(snap)
    assert encode(other.snapshot()) == encode(snap)
    assert other.policy.gauges == recal.policy.gauges


def test_overrun_checks_are_counted_and_exported(tmp_path: Path) -> None:
    """A check that outlasts recalibration.interval makes APScheduler skip the next one:
    a counter (calmon_recalibration_overruns_total), not a warning on the terminal."""
    import dataclasses
    import threading
    import time

    from prometheus_client import generate_latest

    from calmon.io.exporter import recal_metrics

    cfg = recal_config(tmp_path)
    cfg = dataclasses.replace(cfg, recalibration=dataclasses.replace(cfg.recalibration,
                                                                     interval=1.0))
    recal = Recalibrator(cfg, Engine(cfg))
    release = threading.Event()
    recal.run_once = lambda: release.wait(30) and []  # type: ignore[method-assign]
    recal.start()
    try:
        deadline = time.monotonic() + 30
        while recal.metrics_state().overruns == 0:
            assert time.monotonic() < deadline, "no overrun counted"
            time.sleep(0.1)  # polling a deadline-bounded condition
    finally:
        release.set()
        recal.stop()

    class One:
        def collect(self):
            return recal_metrics(recal.metrics_state())

    reg = new_registry()
    reg.register(One())  # type: ignore[arg-type]
    text = generate_latest(reg).decode()
    line = next(x for x in text.splitlines()
                if x.startswith("calmon_recalibration_overruns_total "))
    assert float(line.split()[1]) >= 1


def test_the_version_gauges_are_read_by_the_runs_not_by_scrapes(tmp_path: Path) -> None:
    """Contract §5: a scrape only renders. The live versions and temperatures of
    output_dir are read by the recalibration runs; a rollback by the CLI beside the
    daemon shows from the next run on (at most one recalibration.interval later)."""
    cfg = recal_config(tmp_path)
    engine = Engine(cfg)
    recal = Recalibrator(cfg, engine)
    feed(engine, drift_stream(seed=1))
    recal.run_once()
    assert recal.metrics_state().versions == {("bin", "__all__"): 1, ("mc5", "__all__"): 1}
    cli = Registry(Path(cfg.recalibration.output_dir))  # another process's view
    assert cli.rollback("bin", "__all__", 1)["version"] == 2
    assert recal.metrics_state().versions[("bin", "__all__")] == 1  # no scrape reads disk
    recal.run_once()
    state = recal.metrics_state()
    assert state.versions[("bin", "__all__")] == 2
    doc = read_json(latest(Path(cfg.recalibration.output_dir), "bin"))
    assert state.temperatures[("bin", "__all__")] == doc["params"]["temperature"]
