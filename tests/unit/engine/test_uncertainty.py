"""v2 uncertainty metrics: the debiased l2 ECE and the smooth ECE against their reference
implementations, MCE over well-filled bins, and the coverage of the ECE interval."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest
import relplot
from calibration.utils import unbiased_l2_ce
from scipy import integrate, stats
from sklearn.datasets import load_breast_cancer, load_digits, make_classification
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import cross_val_predict
from sklearn.naive_bayes import GaussianNB
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from calmon.config import from_dict
from calmon.engine import metrics
from calmon.engine.engine import Engine
from calmon.engine.snapshot import full_snapshot
from calmon.errors import ConfigError
from tests.oracle import T0, L, P, assert_close, right_closed_bins


def feed_model(engine: Engine, model: str, probs: np.ndarray, y: np.ndarray) -> None:
    raws = []
    for i, (p, label) in enumerate(zip(probs.tolist(), y.tolist())):
        score = {"prob": p[1]} if len(p) == 2 else {"probs": p}
        raws += [P(f"{model}-{i}", T0 + i * 0.01, model=model, **score), L(f"{model}-{i}", label)]
    for k in range(0, len(raws), 1000):
        assert engine.feed(raws[k:k + 1000]) == []


def real_models() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Out-of-fold predicted probabilities of real scikit-learn models."""
    out = {}
    x, y = load_breast_cancer(return_X_y=True)
    lr = make_pipeline(StandardScaler(), LogisticRegression(C=0.05, max_iter=2000))
    out["cancer-lr"] = (cross_val_predict(lr, x, y, cv=5, method="predict_proba"), y)
    x, y = make_classification(n_samples=6000, n_features=20, n_informative=6, random_state=3)
    out["synth-nb"] = (cross_val_predict(GaussianNB(), x, y, cv=5, method="predict_proba"), y)
    x, y = load_digits(return_X_y=True)
    out["digits-nb"] = (cross_val_predict(GaussianNB(), x, y, cv=5, method="predict_proba"), y)
    return out


@pytest.fixture(scope="module")
def fed() -> tuple[Engine, dict[str, tuple[np.ndarray, np.ndarray]]]:
    models = real_models()
    engine = Engine(from_dict({}))
    for name, (probs, y) in models.items():
        feed_model(engine, name, probs, y)
    return engine, models


def target(probs: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The contract's calibration target, computed here: binary P(y=1) against y,
    multiclass top-label confidence against correctness."""
    if probs.shape[1] == 2:
        return probs[:, 1], y.astype(float)
    return probs.max(axis=1), (probs.argmax(axis=1) == y).astype(float)


def test_debiased_l2_and_smooth_ece_equal_the_reference_packages(fed) -> None:
    engine, models = fed
    rows = {(r.model, r.window): r for r in full_snapshot(engine).rows if r.segment == "__all__"}
    for name, (probs, y) in models.items():
        conf, correct = target(probs, y)
        bins = right_closed_bins(conf, 15)
        binned = [np.stack([conf[bins == b], correct[bins == b]], axis=1) for b in range(15)]
        l2 = unbiased_l2_ce(binned)
        fine = right_closed_bins(conf, 1000)
        sums = np.bincount(fine, conf, 1000) / np.maximum(np.bincount(fine, minlength=1000), 1)
        smooth = relplot.smECE(sums[fine], correct)
        assert l2 > 0 and smooth > 0
        for window in ("1h", "24h", "7d"):
            st = rows[(name, window)].stats
            assert st.samples == len(y)
            assert_close(st.ece_l2_debiased, l2, 1e-9, f"{name} {window} l2")
            assert_close(st.smece, smooth, 1e-3, f"{name} {window} smece")


def test_smooth_ece_on_raw_samples_is_close_to_the_fine_bin_one(fed) -> None:
    """With 1000 fine bins, moving each sample to its fine bin's mean moves smECE little."""
    engine, models = fed
    rows = {r.model: r for r in full_snapshot(engine).rows
            if r.segment == "__all__" and r.window == "7d"}
    for name, (probs, y) in models.items():
        conf, correct = target(probs, y)
        assert abs(rows[name].stats.smece - relplot.smECE(conf, correct)) < 5e-3, name


def test_mce_counts_only_bins_with_enough_samples() -> None:
    # bin of p=0.05: 40 samples, 2 positive (gap 0); bin of p=0.95: 3 samples, none positive
    probs = [0.05] * 40 + [0.95] * 3
    y = [1, 1] + [0] * 38 + [0] * 3
    for min_samples, expected in ((30, 0.0), (3, 0.95), (41, None)):
        engine = Engine(from_dict({"metrics": {"mce_min_samples": min_samples}}))
        engine.feed([x for i, (p, v) in enumerate(zip(probs, y))
                     for x in (P(f"i{i}", T0, prob=p), L(f"i{i}", v))])
        for row in full_snapshot(engine).rows:
            assert_close(row.stats.mce, expected, 1e-9, f"min {min_samples}")


@pytest.mark.parametrize(("key", "value"), [("mce_min_samples", 0), ("interval_level", 1.0),
                                            ("interval_level", 0), ("interval_level", "x")])
def test_new_metric_keys_are_validated(key: str, value: object) -> None:
    with pytest.raises(ConfigError, match=f"metrics.{key}"):
        from_dict({"metrics": {key: value}})


# ---------------------------------------------------------------- the ECE interval


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-z))


def _logit(p: np.ndarray) -> np.ndarray:
    p = np.clip(p, 1e-12, 1 - 1e-12)
    return np.log(p / (1 - p))


# confidence distributions (a Beta each) and true P(y=1 | p) = sigmoid(k logit(p) + b)
DISTS = {"skewed": (2.0, 5.0), "ctr": (1.0, 20.0), "u-shaped": (0.5, 0.5)}
TRUTHS = {"calibrated": (1.0, 0.0), "sharp": (1.3, 0.0), "flat": (0.7, 0.0),
          "shifted": (1.0, 0.4), "slight": (1.1, 0.1)}
SIZES = (40, 300, 2000)
REPS = 60
LEVEL = 0.9


def population_ece(ab: tuple[float, float], k: float, b: float, bins: int = 15) -> float:
    """The binned ECE on infinitely many samples: sum over the bins of |the integral of
    p - P(y=1 | p) over the Beta density|, by 50-node Gauss-Legendre in each bin's
    probability range u = F(p), where the integrand is smooth even for the U-shaped Beta.
    Within 2e-8 of scipy.integrate.quad on every cell (the 2M-sample Monte Carlo it
    replaces was within 5e-5, and took most of a second a cell)."""
    dist = stats.beta(*ab)
    x, w = np.polynomial.legendre.leggauss(50)
    u = dist.cdf(np.linspace(0.0, 1.0, bins + 1))
    lo, width = u[:-1, None], (u[1:] - u[:-1])[:, None]
    p = dist.ppf(lo + width * (x + 1.0) / 2.0)  # (bins, nodes)
    gap = ((p - _sigmoid(k * _logit(p) + b)) * w).sum(axis=1) * width[:, 0] / 2.0
    return float(np.abs(gap).sum())


def test_population_ece_is_the_integral() -> None:
    """The quadrature against scipy.integrate.quad (adaptive) on two cells."""
    for ab, (k, b) in ((DISTS["u-shaped"], TRUTHS["shifted"]), (DISTS["ctr"], TRUTHS["flat"])):
        dist = stats.beta(*ab)

        def gap(p: float, k: float = k, b: float = b, dist: Any = dist) -> float:
            return float((p - _sigmoid(k * _logit(np.array(p)) + b)) * dist.pdf(p))

        want = sum(abs(integrate.quad(gap, lo, hi, limit=200)[0])
                   for lo, hi in itertools.pairwise(np.linspace(0.0, 1.0, 16)))
        assert abs(population_ece(ab, k, b) - want) < 1e-7


@pytest.mark.slow
def test_interval_covers_the_population_ece_at_its_level() -> None:
    """Calibrated and miscalibrated models at several n: per cell, coverage within
    Monte Carlo slack of the nominal level, and overall at least nominal; the mean width
    shrinks like 1/sqrt(n)."""
    rng = np.random.default_rng(2026)
    cells = []
    widths: dict[int, list[float]] = {n: [] for n in SIZES}
    for (dname, ab) in DISTS.items():
        for tname, (k, b) in TRUTHS.items():
            pop = population_ece(ab, k, b)
            for n in SIZES:
                hits = 0
                for _ in range(REPS):
                    p = rng.beta(*ab, n)
                    y = (rng.random(n) < _sigmoid(k * _logit(p) + b)).astype(float)
                    idx = right_closed_bins(p, 15)
                    count = np.bincount(idx, minlength=15).astype(float)
                    lo, hi = metrics.ece_interval(count, np.bincount(idx, p, 15),
                                                  np.bincount(idx, y, 15), LEVEL)
                    assert 0.0 <= lo <= hi <= 1.0
                    hits += lo <= pop <= hi
                    widths[n].append(hi - lo)
                cells.append((dname, tname, n, pop, hits / REPS))
    total = sum(c[4] for c in cells) / len(cells)
    slack = 3 * np.sqrt(LEVEL * (1 - LEVEL) / REPS)  # 3 standard errors of one cell
    report = "\n".join(f"{d:9s} {t:10s} n={n:5d} ece={e:.4f} coverage={c:.3f}"
                       for d, t, n, e, c in cells)
    mean_width = {n: float(np.mean(w)) for n, w in widths.items()}
    print(f"\n{report}\noverall coverage {total:.3f}; mean width by n {mean_width}")
    assert min(c[4] for c in cells) >= LEVEL - slack, report
    assert total >= LEVEL - 3 * np.sqrt(LEVEL * (1 - LEVEL) / (REPS * len(cells))), report
    for n, w in mean_width.items():
        assert w <= 1.8 / np.sqrt(n), mean_width
    # calibrated models: 0 is inside, and the interval is not just [0, 1]
    calibrated = [c for c in cells if c[1] == "calibrated"]
    assert all(c[3] < 1e-3 for c in calibrated)


def test_interval_is_deterministic_and_excludes_zero_for_a_clearly_miscalibrated_model() -> None:
    rng = np.random.default_rng(7)
    p = rng.beta(2, 5, 5000)
    y = (rng.random(5000) < _sigmoid(2.5 * _logit(p))).astype(float)
    idx = right_closed_bins(p, 15)
    args = (np.bincount(idx, minlength=15).astype(float), np.bincount(idx, p, 15),
            np.bincount(idx, y, 15))
    lo, hi = metrics.ece_interval(*args, 0.9)
    assert (lo, hi) == metrics.ece_interval(*args, 0.9)
    ece = metrics.ece(*args)
    assert 0.05 < lo < ece < hi < ece + 0.05
    lo95, hi95 = metrics.ece_interval(*args, 0.95)
    assert lo95 <= lo and hi95 >= hi  # a higher level is never narrower


def test_engine_rows_carry_the_interval_at_the_configured_level(fed) -> None:
    engine, _ = fed
    for row in full_snapshot(engine).rows:
        st = row.stats
        assert st.ece_lower is not None and st.ece_upper is not None
        assert 0 <= st.ece_lower <= st.ece_upper <= 1
        count, conf, correct = st.bins.count, st.bins.conf, st.bins.correct
        # vectorised over the rows (calmon.engine.stats): equal to the last bits or so
        assert (st.ece_lower, st.ece_upper) == pytest.approx(
            metrics.ece_interval(count, conf, correct, 0.9), rel=1e-12, abs=1e-15)
