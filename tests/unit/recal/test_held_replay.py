"""A held refit end to end (contract section 3 ``held`` event, section 6 v4): ``calmon
replay --recalibrate`` over a drift that reverts, the engine's own histogram of the
unlabelled predictions feeding the hold. True logit z ~ N(-2, 1.2), 1,000 predictions an
hour, labels 20-40 minutes late; after a calibrated day the model reports 2.5 z for two
hours, then z again. The refit that is ready once the drift's labels are in was fitted
on a regime that has ended: the predictions made since the revert (their score spread
back to the old one) hold it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from tests.unit.test_replay import RECAL_CONFIG, run_recalibrate, write

T0 = 1_764_460_800.0
CHANGE, REVERT = T0 + 86_400.0, T0 + 86_400.0 + 7_200.0
# the replay tests' backtest config, with the default min_samples
CONFIG = RECAL_CONFIG.replace("min_samples: 500", "min_samples: 2000")


def reverting_files(tmp_path: Path, seed: int = 2) -> tuple[Path, Path, Path]:
    rng = np.random.default_rng(seed)
    n = 30_000  # 30 hours at 1,000 an hour
    ts = np.sort(T0 + rng.uniform(0, 30 * 3600.0, n))
    z = rng.normal(-2.0, 1.2, n)
    y = (rng.random(n) < 1 / (1 + np.exp(-z))).astype(int)
    reported = np.where((ts >= CHANGE) & (ts < REVERT), 2.5 * z, z)
    preds = [json.dumps({"id": f"r{i}", "model": "ctr", "ts": float(ts[i]),
                         "logit": float(reported[i])}) for i in range(n)]
    labels = [json.dumps({"id": f"r{i}", "label": int(y[i]),
                          "ts": float(ts[i] + rng.uniform(1200, 2400))}) for i in range(n)]
    cfg = tmp_path / "recal.yaml"
    cfg.write_text(CONFIG)
    return write(tmp_path / "p.jsonl", preds), write(tmp_path / "l.jsonl", labels), cfg


def test_a_refit_of_a_reverted_drift_is_held_in_the_backtest(capsys, tmp_path: Path) -> None:
    p, lab, cfg = reverting_files(tmp_path)
    events = json.loads(run_recalibrate(capsys, p, lab, cfg))["events"]
    line = " ".join(f"{e['kind']}@{(e['ts'] - CHANGE) / 3600:+.2f}h" for e in events)
    print("\n" + line)
    held = [e for e in events if e["kind"] == "held"]
    assert held, line
    first = held[0]
    assert REVERT < first["ts"] < REVERT + 3600.0, line
    assert first["psi"] > first["threshold"] >= 0.1
    assert first["newer_samples"] >= 300 and first["fit_samples"] > 0
    assert first["trigger"] and first["method"] == "temperature"
    # nothing fitted on the drift goes live after the revert
    assert not [e for e in events if e["kind"] == "published" and e["ts"] > REVERT], line
