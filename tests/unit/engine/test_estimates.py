"""Before the labels: pending counts, CBPE accuracy and positive rate, score PSI, and
their state across snapshot/restore."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from prometheus_client import generate_latest

from calmon.config import from_dict
from calmon.engine.engine import Engine, Row
from calmon.engine.snapshot import full_snapshot
from calmon.io.exporter import CalmonCollector
from calmon.io.exposition import new_registry
from tests.oracle import T0, L, P, right_closed_bins

HOUR = 3600.0
CFG = {"metrics": {"windows": ["1h", "24h"]}, "recalibration": {"window": "24h"}}


def sigmoid(z: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-z))


def rows(engine: Engine, model: str, segment: str = "__all__") -> dict[str, Row]:
    return {r.window: r for r in full_snapshot(engine).rows
            if r.model == model and r.segment == segment}


def psi_numpy(current: np.ndarray, reference: np.ndarray, bins: int = 15) -> float:
    """PSI of two samples' confidences, written out from the contract."""
    c = np.array([(right_closed_bins(current, bins) == b).mean() for b in range(bins)])
    r = np.array([(right_closed_bins(reference, bins) == b).mean() for b in range(bins)])
    c, r = np.maximum(c, 1e-4), np.maximum(r, 1e-4)
    return float(((c - r) * np.log(c / r)).sum())


def test_labels_never_arrive_binary_and_multiclass() -> None:
    """Predictions whose labels are held back: pending counted exactly per window, the
    estimates within 0.02 of what the held-back labels show."""
    rng = np.random.default_rng(11)
    engine = Engine(from_dict(CFG))
    n_old, n_new = 700, 4000
    ts_old = T0 + rng.uniform(0, 0.5 * HOUR, n_old)  # in 24h, not in 1h
    ts_new = T0 + 3 * HOUR + rng.uniform(0, 50 * 60, n_new)
    ts = np.concatenate([ts_old, ts_new])
    p = rng.beta(2, 5, len(ts))
    y = (rng.random(len(ts)) < p).astype(int)  # held back: never fed
    probs = rng.dirichlet([0.6, 0.6, 0.6, 0.6], len(ts))
    yk = np.array([rng.choice(4, p=row) for row in probs])
    raws = []
    for i in range(len(ts)):
        raws.append(P(f"b{i}", ts[i], model="bin", prob=float(p[i]),
                      segment={"country": "US" if i % 3 else "FR"}))
        raws.append(P(f"k{i}", ts[i], model="multi", probs=probs[i].tolist()))
    engine.feed(raws)
    new = slice(n_old, None)
    for model in ("bin", "multi"):
        r = rows(engine, model)
        assert r["1h"].estimates.pending_samples == n_new
        assert r["24h"].estimates.pending_samples == n_new + n_old
        for row in r.values():
            assert row.stats.samples == 0  # nothing joined: every label-based gauge is empty
    b1 = rows(engine, "bin")["1h"].estimates
    realized_acc = float(((p[new] >= 0.5).astype(int) == y[new]).mean())
    assert b1.estimated_accuracy is not None and b1.estimated_positive_rate is not None
    assert abs(b1.estimated_accuracy - realized_acc) < 0.02
    assert abs(b1.estimated_positive_rate - y[new].mean()) < 0.02
    # exactly the CBPE mean, computed here
    assert abs(b1.estimated_accuracy - np.maximum(p[new], 1 - p[new]).mean()) < 1e-9
    assert abs(b1.estimated_positive_rate - p[new].mean()) < 1e-9
    m1 = rows(engine, "multi")["1h"].estimates
    assert m1.estimated_positive_rate is None
    assert m1.estimated_accuracy is not None
    assert abs(m1.estimated_accuracy - (probs[new].argmax(1) == yk[new]).mean()) < 0.02
    # per segment too
    fr = np.arange(len(ts)) % 3 == 0
    seg = rows(engine, "bin", "country=FR")["24h"].estimates
    assert seg.pending_samples == int(fr.sum())
    assert abs(seg.estimated_positive_rate - p[fr].mean()) < 1e-9
    # labels arrive for the old ones: they leave the pending count, and join
    engine.feed([L(f"b{i}", int(y[i])) for i in range(n_old)])
    r = rows(engine, "bin")
    assert r["24h"].estimates.pending_samples == n_new
    assert r["24h"].stats.samples == n_old


@pytest.mark.slow
def test_the_estimate_band_covers_the_realized_accuracy_at_its_level() -> None:
    """True probabilities known: each pending prediction is right with probability
    max(p, 1 - p), so the count right is Poisson-binomial. Per model, the sums and the
    band are that distribution's mean and variance written out here, and over 200
    models the 90% band holds the accuracy the held-back labels show about 90% of the
    time; with nothing pending there is no band."""
    rng = np.random.default_rng(23)
    engine = Engine(from_dict({**CFG, "limits": {"max_models": 200}}))
    models, n = 200, 300
    p = rng.beta(2, 3, (models, n))
    y = (rng.random((models, n)) < p).astype(int)  # held back: never fed
    engine.feed([P(f"m{m}-{i}", T0 + 3 * HOUR + i, model=f"m{m}", prob=float(p[m, i]))
                 for m in range(models) for i in range(n)])
    z = 1.6448536269514722  # the two-sided 90% normal quantile (metrics.interval_level)
    covered = 0
    # one snapshot read for every model (nothing is fed between the reads)
    snap = full_snapshot(engine)
    by_model = {r.model: r.estimates for r in snap.rows
                if r.segment == "__all__" and r.window == "1h"}
    assert len(by_model) == models
    for m in range(models):
        est = by_model[f"m{m}"]
        c = np.maximum(p[m], 1 - p[m])
        acc, var = c.mean(), (c * (1 - c)).sum()
        assert est.estimate_basis == "raw"  # no calibrator is live
        assert abs(est.estimated_correct - c.sum()) < 1e-6
        assert abs(est.estimated_correct_variance - var) < 1e-6
        assert abs(est.estimated_accuracy_lower - (acc - z * np.sqrt(var) / n)) < 1e-9
        assert abs(est.estimated_accuracy_upper - (acc + z * np.sqrt(var) / n)) < 1e-9
        realized = float(((p[m] >= 0.5).astype(int) == y[m]).mean())
        covered += est.estimated_accuracy_lower <= realized <= est.estimated_accuracy_upper
    assert 0.83 <= covered / models <= 0.96, covered
    # the labels arrive: nothing pending, no band (the basis is still said)
    engine.feed([L(f"m0-{i}", int(y[0, i])) for i in range(n)])
    est = rows(engine, "m0")["1h"].estimates
    assert est.pending_samples == 0 and est.estimated_accuracy_lower is None
    assert est.estimated_correct is None and est.estimate_basis == "raw"


def test_estimates_go_through_the_live_calibrator() -> None:
    """An overconfident model (truth sigmoid(z / 2)) and its calibrator: the estimates
    after the calibrator match the held-back labels; the raw confidences would not."""
    rng = np.random.default_rng(5)
    n = 5000
    z = rng.normal(0.0, 3.0, n)
    y = (rng.random(n) < sigmoid(z / 2)).astype(int)
    seen: list[str] = []

    def apply(scores: np.ndarray, kind: str) -> np.ndarray:
        seen.append(kind)
        return sigmoid(scores / 2)

    engine = Engine(from_dict(CFG), calibrators={("ctr", "__all__"): (apply, None)})
    engine.feed([P(f"i{i}", T0 + i * 0.5, model="ctr", logit=float(z[i])) for i in range(n)])
    est = rows(engine, "ctr")["1h"].estimates
    realized = float(((z >= 0).astype(int) == y).mean())
    assert seen and set(seen) == {"logit"}
    assert abs(est.estimated_accuracy - realized) < 0.02
    assert abs(est.estimated_positive_rate - y.mean()) < 0.02
    assert est.estimate_basis == "live"
    raw = float(np.maximum(sigmoid(z), 1 - sigmoid(z)).mean())
    assert raw - realized > 0.05  # without the calibrator the estimate is far off
    engine.set_calibrators({})
    assert abs(rows(engine, "ctr")["1h"].estimates.estimated_accuracy - raw) < 1e-9


def test_score_psi_against_the_previous_window_and_the_calibrator_reference() -> None:
    rng = np.random.default_rng(8)
    n = 3000
    engine = Engine(from_dict(CFG))
    before = rng.beta(2, 5, n)
    steady = rng.beta(2, 5, n)
    shifted = rng.beta(5, 2, n)
    t_before = T0 + np.sort(rng.uniform(0, HOUR - 1, n))
    t_after = T0 + HOUR + np.sort(rng.uniform(0, HOUR - 1, n))
    raws = []
    for model, after in (("steady", steady), ("shifted", shifted)):
        raws += [P(f"{model}a{i}", t_before[i], model=model, prob=float(before[i]))
                 for i in range(n)]
        raws += [P(f"{model}b{i}", t_after[i], model=model, prob=float(after[i]))
                 for i in range(n)]
        # half get labels: PSI counts every prediction, joined or not
        raws += [L(f"{model}b{i}", int(rng.random() < after[i])) for i in range(0, n, 2)]
    raws.append(P("clock", T0 + 2 * HOUR - 1, model="other", prob=0.5))
    engine.feed(raws)
    # the 1h window is exactly [T0 + 1h, T0 + 2h): buckets of 225 s, T0 a multiple of them
    psi_steady = rows(engine, "steady")["1h"].estimates.score_psi
    psi_shifted = rows(engine, "shifted")["1h"].estimates.score_psi
    assert psi_steady is not None and psi_shifted is not None
    assert abs(psi_steady - psi_numpy(steady, before)) < 1e-9
    assert abs(psi_shifted - psi_numpy(shifted, before)) < 1e-9
    assert psi_steady < 0.03
    assert psi_shifted > 1.0
    # no window before the first one: nothing to compare with
    assert rows(engine, "steady")["24h"].estimates.score_psi is None
    # a calibrator's reference histogram replaces the previous window
    ref = np.bincount(right_closed_bins(shifted, 15), minlength=15)
    engine.set_calibrators({("shifted", "__all__"): (lambda s, k: s, ref)})
    assert abs(rows(engine, "shifted")["1h"].estimates.score_psi) < 1e-12
    assert abs(rows(engine, "shifted")["24h"].estimates.score_psi
               - psi_numpy(np.concatenate([before, shifted]), shifted)) < 1e-9


def _stream(seed: int) -> list[list]:
    rng = np.random.default_rng(seed)
    batches = []
    for b in range(12):
        batch = []
        for i in range(300):
            k = b * 300 + i
            ts = T0 + k * 7.0
            batch.append(P(f"s{k}", ts, prob=float(rng.beta(2, 3)),
                           segment={"country": ["US", "FR"][k % 2]}))
            if k % 3 == 0 and k > 50:
                batch.append(L(f"s{k - 50}", int(rng.random() < 0.4)))
        batches.append(batch)
    return batches


def _key(engine: Engine) -> list[tuple]:
    return [(r.model, r.segment, r.window, tuple(r.stats.as_row().values()),
             tuple(r.estimates.as_row().values())) for r in full_snapshot(engine).rows]


def test_snapshot_restore_keeps_the_label_free_state_exactly() -> None:
    cfg = from_dict({**CFG, "segments": {"slices": [["country"]]}})
    batches = _stream(3)
    whole = Engine(cfg)
    for b in batches:
        whole.feed(b)
    final = _key(whole)
    assert any(r[4][0] > 0 and r[4][3] is not None for r in final)  # pending and PSI present
    cut = 7
    first = Engine(cfg)
    for b in batches[:cut]:
        first.feed(b)
    snap = pickle.loads(pickle.dumps(first.snapshot()))
    assert "scores" in snap
    second = Engine(cfg)
    second.restore(snap)
    assert _key(second) == _key(first)
    for b in batches[cut:]:
        second.feed(b)
    assert _key(second) == final


def test_exporter_spells_the_new_gauges() -> None:
    engine = Engine(from_dict(CFG))
    engine.feed([P("a", T0, prob=0.8), P("b", T0 + 1, prob=0.3), L("b", 0)])
    reg = new_registry()
    reg.register(CalmonCollector(engine))
    text = generate_latest(reg).decode()
    for name in ("calmon_ece_l2_debiased", "calmon_smece", "calmon_ece_lower",
                 "calmon_ece_upper", "calmon_pending_samples", "calmon_estimated_accuracy",
                 "calmon_estimated_positive_rate"):
        assert f'{name}{{model="m",segment="__all__",window="1h"}}' in text, name
    assert 'calmon_pending_samples{model="m",segment="__all__",window="1h"} 1.0' in text
    assert 'calmon_estimated_accuracy{model="m",segment="__all__",window="1h"} 0.8' in text
    assert "# TYPE calmon_score_psi gauge" in text


def test_a_broken_calibrator_does_not_break_the_view() -> None:
    def broken(scores: np.ndarray, kind: str) -> np.ndarray:
        raise RuntimeError("bad document")

    engine = Engine(from_dict(CFG), calibrators={("m", "__all__"): (broken, np.ones(3))})
    engine.feed([P("a", T0, prob=0.9), P("b", T0 + 1, probs=[0.2, 0.8], model="k")])
    est = rows(engine, "m")["1h"].estimates
    assert est.pending_samples == 1
    assert abs(est.estimated_accuracy - 0.9) < 1e-9  # the raw confidence, not nothing
    # a reference of the wrong length is ignored: the previous window is used (empty here)
    assert est.score_psi is None
    assert abs(rows(engine, "k")["1h"].estimates.estimated_accuracy - 0.8) < 1e-9


def test_a_segment_calibrator_wins_over_the_models() -> None:
    cfg = from_dict({**CFG, "segments": {"slices": [["country"]]}})
    halve = (lambda s, k: s / 2, None)
    engine = Engine(cfg, calibrators={("m", "__all__"): (lambda s, k: s, None),
                                      ("m", "country=FR"): halve})
    engine.feed([P("a", T0, prob=0.2, segment={"country": "FR"}),
                 P("b", T0 + 1, prob=0.2, segment={"country": "US"})])
    assert abs(rows(engine, "m", "country=FR")["1h"].estimates.estimated_positive_rate
               - 0.1) < 1e-9
    assert abs(rows(engine, "m", "country=US")["1h"].estimates.estimated_positive_rate
               - 0.2) < 1e-9
    assert abs(rows(engine, "m")["1h"].estimates.estimated_positive_rate - 0.2) < 1e-9
