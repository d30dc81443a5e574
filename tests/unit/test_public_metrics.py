"""calmon.metrics (the public library) equals plain formulas, scikit-learn, and the engine."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from sklearn.calibration import calibration_curve

from calmon import config, metrics, replay


def _stream(seed: int, n: int = 3000) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    z = rng.normal(0.0, 2.0, n)
    p = 1 / (1 + np.exp(-z))
    y = (rng.random(n) < 1 / (1 + np.exp(-z / 2.0))).astype(int)  # model over-confident
    return p, y


def _plain_ece(p: np.ndarray, y: np.ndarray, bins: int) -> float:
    b = np.clip(np.ceil(p * bins).astype(int) - 1, 0, bins - 1)  # right-closed, 0 in bin 0
    total = 0.0
    for i in range(bins):
        m = b == i
        if m.any():
            total += m.sum() / len(p) * abs(p[m].mean() - y[m].mean())
    return total


@pytest.mark.parametrize("bins", [10, 15])
def test_reliability_curve_equals_scikit_learn(bins: int) -> None:
    p, y = _stream(1)
    curve = metrics.reliability_curve(p, y, bins=bins)
    prob_true, prob_pred = calibration_curve(y, p, n_bins=bins, strategy="uniform")
    full = curve.count > 0
    np.testing.assert_allclose(curve.accuracy[full], prob_true, rtol=0, atol=1e-12)
    np.testing.assert_allclose(curve.mean_confidence[full], prob_pred, rtol=0, atol=1e-12)
    assert curve.count.sum() == len(p)


def test_ece_brier_nll_equal_plain_formulas() -> None:
    p, y = _stream(2)
    assert metrics.ece(p, y) == pytest.approx(_plain_ece(p, y, 15), abs=1e-12)
    assert metrics.brier(p, y) == pytest.approx(np.mean((p - y) ** 2), abs=1e-12)
    py = np.clip(np.where(y == 1, p, 1 - p), 1e-15, 1)
    assert metrics.nll(p, y) == pytest.approx(np.mean(-np.log(py)), abs=1e-12)
    z = np.log(p / (1 - p))
    assert metrics.ece(z, y, logits=True) == pytest.approx(metrics.ece(p, y), abs=1e-9)


def test_multiclass_is_top_label() -> None:
    rng = np.random.default_rng(3)
    logits = rng.normal(0, 2, (2000, 4))
    probs = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    y = np.array([rng.choice(4, p=q) for q in probs])
    conf, correct = probs.max(axis=1), (probs.argmax(axis=1) == y).astype(float)
    assert metrics.ece(probs, y) == pytest.approx(_plain_ece(conf, correct, 15), abs=1e-12)
    assert metrics.ece(logits, y, logits=True) == pytest.approx(metrics.ece(probs, y), abs=1e-9)
    onehot = np.eye(4)[y]
    assert metrics.brier(probs, y) == pytest.approx(np.mean(((probs - onehot) ** 2).sum(1)))


def test_bad_input_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        metrics.ece([0.2, 1.5], [0, 1])
    with pytest.raises(ValueError):
        metrics.ece([0.2, 0.5], [0, 2])
    with pytest.raises(ValueError):
        metrics.ece([], [])


def test_the_same_numbers_as_the_engine(tmp_path: Path) -> None:
    p, y = _stream(4, 2500)
    t0 = 1_764_460_800.0
    preds = tmp_path / "p.jsonl"
    labels = tmp_path / "l.jsonl"
    preds.write_text("".join(json.dumps({"id": i, "model": "m", "ts": t0 + i, "prob": float(v)})
                             + "\n" for i, v in enumerate(p)))
    labels.write_text("".join(json.dumps({"id": i, "label": int(v), "ts": t0 + i + 1}) + "\n"
                              for i, v in enumerate(y)))
    cfg = config.from_dict({"segments": {"slices": []}})
    view = replay.replay(cfg, preds, labels)
    row = next(r.stats for r in view.rows if r.segment == "__all__" and r.window == "24h")
    assert row.samples == len(p)
    assert metrics.ece(p, y) == pytest.approx(row.ece, abs=1e-9)
    assert metrics.mce(p, y) == pytest.approx(row.mce, abs=1e-9)
    assert metrics.ace(p, y) == pytest.approx(row.ace, abs=1e-9)
    assert metrics.brier(p, y) == pytest.approx(row.brier, abs=1e-9)
    assert metrics.nll(p, y) == pytest.approx(row.nll, abs=1e-9)
    assert metrics.noise_floor(p, y) == pytest.approx(row.noise_floor, abs=1e-3)
    assert metrics.smece(p, y) == pytest.approx(row.smece, abs=1e-6)
    lo, hi = metrics.ece_interval(p, y)
    assert (lo, hi) == (pytest.approx(row.ece_lower, abs=1e-6), pytest.approx(row.ece_upper,
                                                                              abs=1e-6))
