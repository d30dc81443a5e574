"""The estimation maps as the engine keeps them (contract v5 §2): each series' estimates
read through the isotonic map of its labelled samples, equal to scikit-learn's and to
the band's numpy reference (``test_estmap.reference``) to 1e-9; the fallbacks (the
model's map, the last map, the live calibrator, the raw scores) named as the basis; a
pause in the labels keeps the map; after a change only its samples are fitted."""

from __future__ import annotations

import numpy as np
import pytest

from calmon.config import from_dict
from calmon.engine.engine import Engine
from calmon.engine.estimates import Estimates
from calmon.engine.snapshot import full_snapshot
from tests.oracle import T0, L, P
from tests.unit.engine.test_estmap import F, fine_index, reference

HOUR = 3600.0
ALL = "__all__"


def config(**over: object) -> dict:
    cfg = {"metrics": {"windows": ["1h", "24h"], "fine_bins": F},
           "recalibration": {"window": "24h"},
           "estimates": {"min_samples": 1000, "samples": 50_000}}
    cfg.update(over)  # type: ignore[arg-type]
    return cfg


def estimates(engine: Engine, model: str = "m", segment: str = ALL,
              window: str = "24h") -> Estimates:
    [row] = [r for r in full_snapshot(engine).rows
             if (r.model, r.segment, r.window) == (model, segment, window)]
    return row.estimates


def fine_sums(conf: np.ndarray, correct: np.ndarray) -> tuple[np.ndarray, ...]:
    b = fine_index(conf)
    return (np.bincount(b, minlength=F).astype(float), np.bincount(b, conf, minlength=F),
            np.bincount(b, correct.astype(float), minlength=F))


def labelled_binary(rng: np.random.Generator, n: int, start: float, span: float,
                    prefix: str, segment: dict | None = None):
    """n joined predictions whose truth is sharper than their score (p ** 0.7 is right)."""
    p = rng.beta(1.5, 3, n)
    y = (rng.random(n) < p ** 0.7).astype(int)
    ts = start + rng.uniform(0, span, n)
    raws = []
    for i in range(n):
        raws.append(P(f"{prefix}{i}", float(ts[i]), prob=float(p[i]), segment=segment or {}))
        raws.append(L(f"{prefix}{i}", int(y[i]), float(ts[i]) + 1))
    return p, y, ts, raws


def pending_binary(rng: np.random.Generator, n: int, start: float, span: float,
                   prefix: str, segment: dict | None = None):
    p = rng.beta(1.5, 3, n)
    ts = start + rng.uniform(0, span, n)
    return p, [P(f"{prefix}{i}", float(ts[i]), prob=float(p[i]), segment=segment or {})
               for i in range(n)]


def assert_reference(got: Estimates, sums: tuple[np.ndarray, ...], pend: np.ndarray,
                     flip: np.ndarray) -> None:
    acc, pos, var, lo, hi, corr = reference(*sums, pend, flip)
    assert got.pending_samples == len(pend)
    assert got.estimated_accuracy == pytest.approx(acc, abs=1e-9)
    assert got.estimated_positive_rate == pytest.approx(pos, abs=1e-9)
    assert got.estimated_correct == pytest.approx(corr, abs=1e-9 * len(pend))
    assert got.estimated_correct_variance == pytest.approx(var, rel=1e-9, abs=1e-12)
    assert got.estimated_accuracy_lower == pytest.approx(lo, abs=1e-9)
    assert got.estimated_accuracy_upper == pytest.approx(hi, abs=1e-9)


@pytest.mark.parametrize("threshold", [None, 0.1])
def test_binary_estimates_read_the_series_map_as_the_reference(threshold: float | None
                                                               ) -> None:
    rng = np.random.default_rng(5 if threshold is None else 6)
    models = {} if threshold is None else {"*": {"threshold": threshold}}
    engine = Engine(from_dict(config(models=models)))
    p, y, ts, raws = labelled_binary(rng, 3000, T0, 50 * 60, "a")
    pend, praws = pending_binary(rng, 800, T0 + 50 * 60, 5 * 60, "b")
    engine.feed(raws + praws)
    flip = (pend < (threshold or 0.5)).astype(int)
    for window in ("1h", "24h"):
        got = estimates(engine, window=window)
        assert got.estimate_basis == "series"
        assert got.estimate_fit_samples == 3000
        assert got.estimate_fit_newest_ts is not None
        assert ts.max() <= got.estimate_fit_newest_ts <= float(ts.max()) + HOUR
        assert_reference(got, fine_sums(p, y), pend, flip)


def test_a_small_segment_reads_its_models_map_and_a_pause_keeps_the_last() -> None:
    rng = np.random.default_rng(7)
    engine = Engine(from_dict(config(segments={"slices": [["country"]]})))
    p, y, _, raws = labelled_binary(rng, 2500, T0, 50 * 60, "a", {"country": "US"})
    p2, y2, _, raws2 = labelled_binary(rng, 200, T0, 50 * 60, "c", {"country": "FR"})
    pend, praws = pending_binary(rng, 500, T0 + 50 * 60, 5 * 60, "b", {"country": "FR"})
    engine.feed(raws + raws2 + praws)
    model_sums = fine_sums(np.concatenate([p, p2]), np.concatenate([y, y2]))
    fr = estimates(engine, segment="country=FR")
    assert (fr.estimate_basis, fr.estimate_fit_samples) == ("model", 2700)
    assert_reference(fr, model_sums, pend, (pend < 0.5).astype(int))
    assert estimates(engine, segment="country=US").estimate_basis == "series"
    before = estimates(engine)
    # labels pause: two days of predictions only, the labelled samples leave every window
    later, lraws = pending_binary(rng, 400, T0 + 48 * HOUR, HOUR, "z", {"country": "FR"})
    engine.feed(lraws)
    after = estimates(engine)
    assert after.estimate_basis == "last"
    assert (after.estimate_fit_samples, after.estimate_fit_newest_ts) == (
        before.estimate_fit_samples, before.estimate_fit_newest_ts)
    assert_reference(estimates(engine, window="1h"), model_sums, later,
                     (later < 0.5).astype(int))
    # the FR series never had a map of its own to keep: the model's is gone too
    assert estimates(engine, segment="country=FR", window="1h").estimate_basis == "raw"


def test_after_a_change_only_its_samples_are_fitted() -> None:
    rng = np.random.default_rng(8)
    engine = Engine(from_dict(config()))
    change = T0 + 20 * 225.0  # a bucket edge of the 1h window (225 s buckets)
    p1, y1, _, raws1 = labelled_binary(rng, 2000, T0, 20 * 225.0 - 1, "a")
    engine.feed(raws1)
    # the new regime: the truth is the score itself
    p2 = rng.beta(1.5, 3, 1500)
    y2 = (rng.random(1500) < p2).astype(int)
    t2 = change + rng.uniform(0, 20 * 60, 1500)
    raws = []
    for i in range(1500):
        raws += [P(f"n{i}", float(t2[i]), prob=float(p2[i])), L(f"n{i}", int(y2[i]))]
    pend, praws = pending_binary(rng, 600, change + 20 * 60, 60, "b")
    engine.feed(raws + praws)
    flip = (pend < 0.5).astype(int)
    assert_reference(estimates(engine), fine_sums(np.concatenate([p1, p2]),
                                                  np.concatenate([y1, y2])), pend, flip)
    engine.set_changes({("m", ALL): change})
    got = estimates(engine)
    assert (got.estimate_basis, got.estimate_fit_samples) == ("series", 1500)
    assert_reference(got, fine_sums(p2, y2), pend, flip)
    # too few post-change samples: the old regime's map is not used
    engine.set_changes({("m", ALL): change + 20 * 60 - 225.0})
    assert estimates(engine).estimate_basis == "raw"


def test_multiclass_reads_its_top_label_through_the_map() -> None:
    rng = np.random.default_rng(9)
    engine = Engine(from_dict(config()))
    n, k = 3000, 4
    z = rng.normal(0, 1.5, (n, k))
    probs = np.exp(z) / np.exp(z).sum(1, keepdims=True)
    truth = np.exp(0.7 * z) / np.exp(0.7 * z).sum(1, keepdims=True)  # over-confident
    y = np.array([rng.choice(k, p=t) for t in truth])
    ts = T0 + rng.uniform(0, 50 * 60, n)
    raws = []
    for i in range(n):
        raws += [P(f"a{i}", float(ts[i]), probs=probs[i].tolist()),
                 L(f"a{i}", int(y[i]), float(ts[i]) + 1)]
    zp = rng.normal(0, 1.5, (700, k))
    pp = np.exp(zp) / np.exp(zp).sum(1, keepdims=True)
    raws += [P(f"b{i}", T0 + 50 * 60 + i, probs=pp[i].tolist()) for i in range(700)]
    engine.feed(raws)
    got = estimates(engine)
    assert got.estimate_basis == "series" and got.estimated_positive_rate is None
    top = probs.max(1)
    acc, _, var, lo, hi, corr = reference(*fine_sums(top, probs.argmax(1) == y),
                                          pp.max(1), np.zeros(700, int))
    assert got.estimated_accuracy == pytest.approx(acc, abs=1e-9)
    assert got.estimated_correct == pytest.approx(corr, abs=1e-9 * 700)
    assert got.estimated_correct_variance == pytest.approx(var, rel=1e-9)
    assert got.estimated_accuracy_lower == pytest.approx(lo, abs=1e-9)
    assert got.estimated_accuracy_upper == pytest.approx(hi, abs=1e-9)


def test_live_calibration_keeps_the_v3_numbers() -> None:
    rng = np.random.default_rng(10)
    engine = Engine(from_dict(config(estimates={"calibration": "live"})))
    _, _, _, raws = labelled_binary(rng, 3000, T0, 50 * 60, "a")
    pend, praws = pending_binary(rng, 500, T0 + 50 * 60, 60, "b")
    engine.feed(raws + praws)
    got = estimates(engine)
    assert got.estimate_basis == "raw" and got.estimate_fit_samples == 0
    assert got.estimated_accuracy == pytest.approx(np.maximum(pend, 1 - pend).mean(),
                                                   abs=1e-9)
    assert got.estimated_positive_rate == pytest.approx(pend.mean(), abs=1e-9)


def test_live_calibration_reads_the_live_calibrator_as_v3_did() -> None:
    """``estimates.calibration: live`` with a calibrator served and enough labels for a
    map: the estimates are v3's, the live calibrator's probability of the side each
    raw score decides (numpy), basis ``live``, the band the pending count's alone."""
    from statistics import NormalDist

    rng = np.random.default_rng(13)

    def apply(scores: np.ndarray, kind: str) -> np.ndarray:
        assert kind == "prob"
        return np.clip(scores ** 0.7, 0, 1)

    for calibration, basis in (("live", "live"), ("labelled", "series")):
        engine = Engine(from_dict(config(estimates={"calibration": calibration})),
                        calibrators={("m", ALL): (apply, None)})
        _, _, _, raws = labelled_binary(rng, 3000, T0, 50 * 60, "a")
        pend, praws = pending_binary(rng, 500, T0 + 50 * 60, 60, "b")
        engine.feed(raws + praws)
        got = estimates(engine)
        assert got.estimate_basis == basis
        if calibration == "labelled":
            continue
        q1 = pend ** 0.7
        q = np.where(pend >= 0.5, q1, 1 - q1)
        assert got.estimate_fit_samples == 0 and got.pending_samples == 500
        assert got.estimated_accuracy == pytest.approx(q.mean(), abs=1e-9)
        assert got.estimated_positive_rate == pytest.approx(q1.mean(), abs=1e-9)
        half = NormalDist().inv_cdf(0.95) * np.sqrt(np.sum(q * (1 - q))) / 500
        assert got.estimated_accuracy_lower == pytest.approx(q.mean() - half, abs=1e-9)
        assert got.estimated_accuracy_upper == pytest.approx(q.mean() + half, abs=1e-9)


def test_reliability_shows_each_estimate_with_its_band_and_basis() -> None:
    from calmon.io import reliability

    rng = np.random.default_rng(11)
    engine = Engine(from_dict(config()))
    _, _, _, raws = labelled_binary(rng, 1500, T0, 50 * 60, "a")
    _, praws = pending_binary(rng, 300, T0 + 50 * 60, 60, "b")
    engine.feed(raws + praws)
    got = estimates(engine)
    body = reliability.page(engine.cfg, full_snapshot(engine), None, {})[2].decode()
    band = f"[{got.estimated_accuracy_lower:.3f}, {got.estimated_accuracy_upper:.3f}]"
    assert (f"estimated {got.estimated_accuracy:.3f} {band} for 300 predictions awaiting "
            "labels, read through its estimation map of 1,500 labelled samples") in body


def test_the_last_map_is_kept_with_the_state(tmp_path) -> None:
    from calmon.io.checkpoint import CheckpointStore

    rng = np.random.default_rng(12)
    cfg = from_dict(config())
    engine = Engine(cfg)
    p, y, _, raws = labelled_binary(rng, 2000, T0, 50 * 60, "a")
    engine.feed(raws)
    assert estimates(engine).estimate_basis == "series"  # a refresh fits the map
    # labels pause past the largest window: only the last map is left
    later, lraws = pending_binary(rng, 300, T0 + 48 * HOUR, HOUR, "z")
    engine.feed(lraws)
    before = estimates(engine, window="1h")
    assert before.estimate_basis == "last"
    store = CheckpointStore(tmp_path)
    store.save(engine.snapshot(), {}, 0.0)
    loaded = store.load()
    assert loaded is not None
    restored = Engine(cfg)
    restored.restore(loaded.state)
    after = estimates(restored, window="1h")
    assert after == before  # the same map, fit and band
    assert_reference(after, fine_sums(p, y), later, (later < 0.5).astype(int))
    # a crafted map is refused, not served
    bad = loaded.state
    bad["maps"][0][5] = np.array(bad["maps"][0][5])[::-1]  # values no longer increase
    with pytest.raises(ValueError, match="not an isotonic fit"):
        Engine(cfg).restore(bad)
