"""Label-free estimates that hold when the scores are off (issue 39, contract v5 §2).

Scores generated with a known truth: each pending prediction's TRUE probability is
known, so the accuracy the pending predictions will realize in expectation is the mean
true probability of the model's decided class, and their positive rate the mean true
P(y=1) (plain numpy, no label noise). The labelled samples come first; each later
period's predictions stay pending, in a segment of their own (``period=k``), so each
period is read through the model's map (basis ``model``), as a segment with no labels
of its own is.

- binary: the reported logit is N(mu_k, 1.5), mu_k a random walk of +-0.2 logits per
  period, the true logit 1.3x the reported one (the model under-states its confidence:
  raw ECE about 0.04, below every trigger); 50,000 labelled, then 10 periods of 5,000:
  every period within 4 sqrt(a (1 - a) / n_fit) + 0.002 of the expected accuracy, the
  mean error at most a quarter of the raw-score estimate's; the positive rate the same;
- 3 and 20 classes, top label over-confident (truth softmax(0.77 z)), class-logit
  shifts between periods: every period within 0.007;
- the band: 200 replications (a fit sample of 5,000 labelled, 2,000 pending of a
  calibrated stream, level 0.9) cover the realized accuracy in at least 85% of them,
  and are at most 1.1x as wide as z sqrt(Poisson-binomial variance + a (1 - a) / n_fit).
"""

from __future__ import annotations

from statistics import NormalDist

import numpy as np
import pytest
from scipy.special import expit, softmax

from calmon.config import from_dict
from calmon.engine.engine import Engine
from calmon.engine.estimates import Estimates
from calmon.engine.records import Raw
from calmon.engine.snapshot import full_snapshot
from tests.oracle import T0, logit_records

HOUR = 3600.0
N_FIT, PERIODS, PER_PERIOD = 50_000, 10, 5_000


def cfg(**over: object):
    base = {"metrics": {"windows": ["24h", "7d"]}, "recalibration": {"enabled": False},
            "segments": {"slices": [["period"]]}, "limits": {"max_models": 200}}
    base.update(over)  # type: ignore[arg-type]
    return from_dict(base)


def feed(engine: Engine, raws: list[Raw]) -> None:
    for i in range(0, len(raws), 20_000):
        engine.feed(raws[i:i + 20_000])


def by_segment(engine: Engine, window: str = "7d") -> dict[tuple[str, str], Estimates]:
    return {(r.model, r.segment): r.estimates for r in full_snapshot(engine).rows
            if r.window == window}


def run_binary(seed: int, calibration: str = "labelled"):
    """(expected accuracy, expected positive rate, raw estimate, estimates) by period."""
    rng = np.random.default_rng(seed)
    z = rng.normal(0.0, 1.5, N_FIT)
    y = rng.random(N_FIT) < expit(1.3 * z)
    ts = T0 + np.sort(rng.uniform(0, 20 * HOUR, N_FIT))
    raws = logit_records([f"f{i}" for i in range(N_FIT)], ts, z, labels=y)
    mu = 0.0
    truth = []
    for k in range(PERIODS):
        mu += rng.choice([-0.2, 0.2])
        zk = rng.normal(mu, 1.5, PER_PERIOD)
        tk = T0 + 20 * HOUR + k * 600 + rng.uniform(0, 600, PER_PERIOD)
        raws += logit_records([f"p{k}-{i}" for i in range(PER_PERIOD)], tk, zk,
                              segment={"period": str(k)})
        q = expit(1.3 * zk)  # the truth
        decided = zk >= 0
        truth.append((float(np.where(decided, q, 1 - q).mean()), float(q.mean()),
                      float(np.where(decided, expit(zk), 1 - expit(zk)).mean())))
    engine = Engine(cfg(estimates={"calibration": calibration}))
    feed(engine, raws)
    est = by_segment(engine)
    return truth, [est[("m", f"period={k}")] for k in range(PERIODS)]


@pytest.mark.slow
def test_binary_scores_off_below_every_trigger_are_estimated_right() -> None:
    truth, est = run_binary(39)
    errors, raw_errors = [], []
    for k, ((acc, pos, raw), e) in enumerate(zip(truth, est)):
        assert e.estimate_basis == "model" and e.estimate_fit_samples == N_FIT
        assert e.pending_samples == PER_PERIOD
        tol = 4 * np.sqrt(acc * (1 - acc) / N_FIT) + 0.002
        assert e.estimated_accuracy is not None and e.estimated_positive_rate is not None
        print(f"period {k}: expected accuracy {acc:.4f}, estimated "
              f"{e.estimated_accuracy:.4f} (raw scores {raw:.4f}); positive rate {pos:.4f} vs "
              f"{e.estimated_positive_rate:.4f}; tolerance {tol:.4f}")
        assert abs(e.estimated_accuracy - acc) <= tol
        assert abs(e.estimated_positive_rate - pos) <= tol
        errors.append(abs(e.estimated_accuracy - acc))
        raw_errors.append(abs(raw - acc))
    print(f"mean error {np.mean(errors):.4f} vs the raw scores' {np.mean(raw_errors):.4f}")
    assert np.mean(errors) <= np.mean(raw_errors) / 4


@pytest.mark.slow
def test_live_calibration_reads_the_raw_scores_as_before() -> None:
    truth, est = run_binary(39, calibration="live")
    for (_, _, raw), e in zip(truth, est):
        assert e.estimate_basis == "raw"
        assert e.estimated_accuracy == pytest.approx(raw, abs=1e-9)


@pytest.mark.slow
@pytest.mark.parametrize("k", [3, 20])
def test_multiclass_top_label_over_confident_is_estimated_right(k: int) -> None:
    rng = np.random.default_rng(100 + k)
    z = rng.normal(0.0, 1.5, (N_FIT, k))
    truth = softmax(0.77 * z, axis=1)
    y = (rng.random(N_FIT)[:, None] > np.cumsum(truth, axis=1)).sum(axis=1)
    ts = T0 + np.sort(rng.uniform(0, 20 * HOUR, N_FIT))
    raws = logit_records([f"f{i}" for i in range(N_FIT)], ts, z, labels=y)
    shift = np.zeros(k)
    expected = []
    for p in range(PERIODS):
        shift = shift + rng.choice([-0.2, 0.2], k)
        zk = rng.normal(0.0, 1.5, (PER_PERIOD, k)) + shift
        tk = T0 + 20 * HOUR + p * 600 + rng.uniform(0, 600, PER_PERIOD)
        raws += logit_records([f"p{p}-{i}" for i in range(PER_PERIOD)], tk, zk,
                              segment={"period": str(p)})
        t = softmax(0.77 * zk, axis=1)
        expected.append(float(t[np.arange(PER_PERIOD), zk.argmax(1)].mean()))
    engine = Engine(cfg())
    feed(engine, raws)
    est = by_segment(engine)
    for p, acc in enumerate(expected):
        e = est[("m", f"period={p}")]
        assert e.estimate_basis == "model" and e.estimated_accuracy is not None
        print(f"K={k} period {p}: expected accuracy {acc:.4f}, estimated "
              f"{e.estimated_accuracy:.4f}")
        assert abs(e.estimated_accuracy - acc) <= 0.007


@pytest.mark.slow
def test_the_band_covers_the_realized_accuracy() -> None:
    rng = np.random.default_rng(2039)
    reps, n_fit, n_pend, level = 200, 5_000, 2_000, 0.9
    raws: list[Raw] = []
    at: list[float] = []  # each record's event time
    pending_truth = []
    for r in range(reps):
        model = f"m{r}"
        z = rng.normal(-0.5, 1.5, n_fit)
        y = rng.random(n_fit) < expit(z)  # calibrated
        ts = T0 + rng.uniform(0, 20 * HOUR, n_fit)
        raws += logit_records([f"{r}f{i}" for i in range(n_fit)], ts, z, model, labels=y)
        at += np.repeat(ts, 2).tolist()
        zp = rng.normal(-0.5, 1.5, n_pend)
        tp = T0 + 20 * HOUR + rng.uniform(0, 600, n_pend)
        raws += logit_records([f"{r}p{i}" for i in range(n_pend)], tp, zp, model)
        at += tp.tolist()
        pending_truth.append(expit(zp))
    engine = Engine(cfg(segments={"slices": []}))
    # the 200 models' streams interleaved in time, as they would arrive: the first batch
    # admits every model, the rest take the columnar join (a batch that admits a model
    # goes record by record, and model by model every batch would admit one)
    feed(engine, [raws[i] for i in np.argsort(at, kind="stable")])
    est = by_segment(engine)
    z = NormalDist().inv_cdf(0.5 + level / 2)
    covered, ratios = 0, []
    for r, q1 in enumerate(pending_truth):
        e = est[(f"m{r}", "__all__")]
        assert e.estimate_basis == "series"
        q = np.where(q1 >= 0.5, q1, 1 - q1)  # the decided class's true probability
        realized = float((rng.random(n_pend) < q).mean())
        lo, hi = e.estimated_accuracy_lower, e.estimated_accuracy_upper
        assert lo is not None and hi is not None
        covered += lo <= realized <= hi
        a = float(q.mean())
        ideal = z * np.sqrt(np.sum(q * (1 - q)) / n_pend**2 + a * (1 - a) / n_fit)
        ratios.append((hi - lo) / 2 / ideal)
    print(f"the 90% band covered the realized accuracy in {covered} of {reps}; "
          f"width / ideal: max {max(ratios):.3f}, median {np.median(ratios):.3f}")
    assert covered >= 0.85 * reps
    assert max(ratios) <= 1.1
