"""Label-free estimates around a refit (issue 23), through ``replay --recalibrate``
(calmon.replay.replay_recalibrate: the engine, its estimates and the daemon's policy on
event time). 3,000 predictions an hour, every label an hour late. The truth is the
TRUE probability of every prediction: the accuracy the pending predictions will show
is the mean true probability of the model's predicted class, their positive rate the
mean true P(y=1) (plain numpy, no label noise).

- covariate shift (inputs move, calibration holds): nothing is published and the
  estimates stay within 0.02 of the truth;
- concept shift (the same scores now mean more positives: a prior shift of +1.5):
  an alarm and a publish within 3 h of the shift (2 h of labelled post-shift data),
  then the estimates under the new calibrator within 0.03 of the truth.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from scipy.special import expit

from calmon import config as config_mod
from calmon.replay import replay_recalibrate

T0 = 1_764_460_800.0
HOUR = 3600.0
RATE = 3000  # predictions an hour
DELAY = HOUR  # every label an hour after its prediction


def _files(tmp: Path, hours: float, seed: int, shift_at: float, covariate: bool
           ) -> tuple[Path, Path, np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    n = int(RATE * hours)
    ts = np.sort(T0 + rng.uniform(0, hours * HOUR, n))
    after = ts >= T0 + shift_at * HOUR
    if covariate:  # the inputs move; the model stays calibrated on them
        z = np.where(after, rng.normal(-0.5, 1.0, n), rng.normal(-2.0, 1.0, n))
        true = expit(z)
    else:  # the same scores now mean more positives
        z = rng.normal(-2.0, 1.0, n)
        true = expit(np.where(after, z + 1.5, z))
    y = (rng.random(n) < true).astype(int)
    p, lab = tmp / "p.jsonl", tmp / "l.jsonl"
    p.write_text("".join(json.dumps({"id": f"r{i}", "model": "m", "ts": float(ts[i]),
                                     "logit": float(z[i])}) + "\n" for i in range(n)))
    # the files end with the last prediction: later labels have not arrived yet
    lab.write_text("".join(json.dumps({"id": f"r{i}", "label": int(y[i]),
                                       "ts": float(ts[i] + DELAY)}) + "\n" for i in range(n)
                           if ts[i] + DELAY <= ts[-1]))
    return p, lab, ts, z, true


def _cfg(tmp: Path):  # the default policy, on 1h/24h windows
    return config_mod.from_dict({"metrics": {"windows": ["1h", "24h"]},
                                 "segments": {"slices": []},
                                 "recalibration": {"window": "24h",
                                                   "output_dir": str(tmp / "cal")}})


def _truth(ts: np.ndarray, z: np.ndarray, true: np.ndarray, now: float
           ) -> tuple[float, float, int]:
    pending = ts + DELAY > now  # the last hour's predictions: their labels are not in
    predicted = z[pending] >= 0  # the model's own decision
    acc = np.where(predicted, true[pending], 1 - true[pending]).mean()
    return float(acc), float(true[pending].mean()), int(pending.sum())


def _estimates(bt, window: str = "1h"):
    return next(r.estimates for r in bt.view.rows if r.model == "m" and r.window == window)


def test_a_covariate_shift_publishes_nothing_and_the_estimates_hold(tmp_path: Path) -> None:
    p, lab, ts, z, true = _files(tmp_path, 8, seed=51, shift_at=3, covariate=True)
    bt = replay_recalibrate(_cfg(tmp_path), p, lab)
    assert [e for e in bt.events if e.kind == "published"] == [], bt.events
    acc, pos, pending = _truth(ts, z, true, float(ts.max()))
    est = _estimates(bt)
    print(f"\ncovariate shift: estimated accuracy {est.estimated_accuracy:.4f} vs {acc:.4f}, "
          f"positive rate {est.estimated_positive_rate:.4f} vs {pos:.4f}; events {bt.events}")
    assert est.pending_samples == pending
    assert abs(est.estimated_accuracy - acc) <= 0.02
    assert abs(est.estimated_positive_rate - pos) <= 0.02


def test_after_a_concept_shift_a_refit_makes_the_estimates_right_again(tmp_path: Path) -> None:
    shift = T0 + 2 * HOUR
    p, lab, ts, z, true = _files(tmp_path, 6, seed=52, shift_at=2, covariate=False)
    bt = replay_recalibrate(_cfg(tmp_path), p, lab)
    drift = [e for e in bt.events if e.kind == "drift"]
    pubs = [e for e in bt.events if e.kind == "published"]
    assert drift and pubs, bt.events
    acc, pos, _ = _truth(ts, z, true, float(ts.max()))
    est = _estimates(bt)
    print(f"\nconcept shift (+1.5 prior): alarm {(drift[0].ts - shift) / HOUR:.2f} h, "
          f"published {(pubs[0].ts - shift) / HOUR:.2f} h after it; estimated accuracy "
          f"{est.estimated_accuracy:.4f} vs {acc:.4f}, positive rate "
          f"{est.estimated_positive_rate:.4f} vs {pos:.4f}")
    assert pubs[0].ts - shift <= 3 * HOUR
    assert abs(est.estimated_accuracy - acc) <= 0.03
    assert abs(est.estimated_positive_rate - pos) <= 0.03
