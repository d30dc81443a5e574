"""Effect-size triggers (calmon.recal.triggers): which fire on given bins, checked
against the contract's formulas computed here."""

from __future__ import annotations

import numpy as np
from scipy.stats import binom

from calmon.config import RecalibrationConfig, Triggers
from calmon.engine.metrics import Bins
from calmon.recal.triggers import Reading, decide


def bins(count: list[float], conf_mean: list[float], acc: list[float]) -> Bins:
    c = np.array(count, dtype=float)
    return Bins(c, c * np.array(conf_mean), c * np.array(acc))


def test_ece_above_and_observed_over_expected() -> None:
    cfg = RecalibrationConfig()
    b = bins([100, 100], [0.1, 0.6], [0.2, 0.9])  # ECE 0.2, O/E 110/70
    d = decide(cfg, Reading(b, True, None))
    assert abs(d.ece - 0.2) < 1e-12
    assert abs(d.observed_over_expected - 110 / 70) < 1e-12
    assert d.fired == ("ece_above", "observed_over_expected")


def _floor(count: list[int], p: list[float]) -> float:
    """Mean ECE of a calibrated model on these bins: sum_b E|Bin(n_b, p_b) - n_b p_b| / N."""
    total = sum(float(np.sum(binom.pmf(np.arange(n + 1), n, q) * np.abs(np.arange(n + 1) - n * q)))
                for n, q in zip(count, p))
    return total / sum(count)


def test_ece_increase_compares_bias_corrected_ece_with_the_baseline() -> None:
    """Both sides less their noise floor: the baseline is the live document's
    bias-corrected holdout ECE; the current plug-in ECE 0.03 counts as 0.03 - floor."""
    cfg = RecalibrationConfig(triggers=Triggers(ece_above=None, ece_increase=0.02,
                                                observed_over_expected=None))
    big = bins([10_000, 10_000], [0.2, 0.8], [0.23, 0.83])  # ECE 0.03, floor ~0.003
    corrected = 0.03 - _floor([10_000, 10_000], [0.2, 0.8])
    assert 0.025 < corrected < 0.028
    assert decide(cfg, Reading(big, True, corrected - 0.021)).fired == ("ece_increase",)
    assert decide(cfg, Reading(big, True, corrected - 0.019)).fired == ()
    assert decide(cfg, Reading(big, True, None)).fired == ()
    # 200 samples: the same plug-in 0.03 is mostly noise (floor ~0.03) and does not fire
    small = bins([100, 100], [0.2, 0.8], [0.23, 0.83])
    assert _floor([100, 100], [0.2, 0.8]) > 0.025
    assert decide(cfg, Reading(small, True, 0.0)).fired == ()


def test_multiclass_has_no_observed_over_expected_and_no_triggers_means_evidence() -> None:
    b = bins([50], [0.9], [0.9])
    d = decide(RecalibrationConfig(), Reading(b, False, None))
    assert d.observed_over_expected is None and d.fired == ()
    none = RecalibrationConfig(triggers=Triggers(None, None, None))
    assert decide(none, Reading(b, False, None)).fired == ("evidence",)


def test_ece_above_reads_the_bias_corrected_ece() -> None:
    """314 samples whose plug-in ECE is 0.069 but whose noise floor is ~0.04: the
    bias-corrected reading (0.069 - floor) is under 0.05, so ece_above stays silent;
    10,000 samples with the same plug-in ECE fire it."""
    cfg = RecalibrationConfig(triggers=Triggers(ece_above=0.05, ece_increase=None,
                                                observed_over_expected=None))
    small = bins([157, 157], [0.15, 0.45], [0.15 + 0.069, 0.45 - 0.069])
    floor = _floor([157, 157], [0.15, 0.45])
    assert 0.02 < floor < 0.05
    d = decide(cfg, Reading(small, True, None))
    assert abs(d.ece - 0.069) < 1e-12 and abs(d.ece_debiased - (0.069 - floor)) < 1e-9
    assert d.fired == ()
    big = bins([5000, 5000], [0.15, 0.45], [0.15 + 0.069, 0.45 - 0.069])
    assert decide(cfg, Reading(big, True, None)).fired == ("ece_above",)


def test_observed_over_expected_reads_the_minority_class() -> None:
    """A 99.9%-positive series whose negatives doubled: sum y / sum p is 0.999, inside
    the band, but the negatives' observed / expected is 2.0; its mirror image (0.1%
    positives doubled) reads 2.0 too. The Decision keeps sum y / sum p for the gauge."""
    cfg = RecalibrationConfig(triggers=Triggers(None, None, (0.9, 1.1)))
    n = 100_000.0
    rare_neg = Bins(np.array([n]), np.array([0.999 * n]), np.array([n - 200.0]))
    rare_pos = Bins(np.array([n]), np.array([0.001 * n]), np.array([200.0]))
    for b in (rare_neg, rare_pos):
        d = decide(cfg, Reading(b, True, None))
        assert d.fired == ("observed_over_expected",)
        assert abs(d.minority_ratio - 2.0) < 1e-9
    assert abs(decide(cfg, Reading(rare_neg, True, None)).observed_over_expected
               - (n - 200) / (0.999 * n)) < 1e-12


def test_the_worst_class_is_read_with_a_test_behind_it() -> None:
    """100 classes, 20,000 samples: class 7's one-vs-rest frequency is 3x what the model
    says. worst_class_ece names it, with its plug-in ECE less its noise floor (checked by
    brute force here); calibrated classes, however noisy their ECE, are not named (each
    is held to a chi-square over its bins at alpha / K)."""
    from scipy.special import softmax
    from scipy.stats import chi2

    from calmon.recal.triggers import worst_class_ece

    rng = np.random.default_rng(9)
    k, n = 100, 20_000
    p = softmax(rng.normal(0, 1.5, (n, k)), axis=1)
    truth = p.copy()
    truth[:, 7] *= 3.0
    truth /= truth.sum(axis=1, keepdims=True)
    y = np.minimum((np.cumsum(truth, axis=1) < rng.random(n)[:, None]).sum(axis=1), k - 1)
    value, which = worst_class_ece(p, y, 15, 0.01)
    assert which == 7
    conf, hit = p[:, 7], (y == 7).astype(float)
    b = np.clip(np.ceil(conf * 15).astype(int) - 1, 0, 14)
    count = np.bincount(b, minlength=15)
    csum, ksum = np.bincount(b, conf, 15), np.bincount(b, hit, 15)
    plug = np.abs(csum - ksum).sum() / n
    floor = _floor(count[count > 0].tolist(), (csum[count > 0] / count[count > 0]).tolist())
    assert abs(value - (plug - floor)) < 1e-9
    # the calibrated version: no class significant at alpha / K (the statistic computed
    # here against scipy's chi-square)
    y0 = np.minimum((np.cumsum(p, axis=1) < rng.random(n)[:, None]).sum(axis=1), k - 1)
    assert worst_class_ece(p, y0, 15, 0.01) == (0.0, None)
    conf, hit = p[:, 7], (y0 == 7).astype(float)
    b = np.clip(np.ceil(conf * 15).astype(int) - 1, 0, 14)
    e, o, m = np.bincount(b, conf, 15), np.bincount(b, hit, 15), np.bincount(b, minlength=15)
    ok = m > 0
    stat = (((o - e) ** 2)[ok] / (e * (1 - e / np.maximum(m, 1)))[ok]).sum()
    assert stat < chi2.ppf(1 - 0.01 / k, ok.sum())


def test_chi2_quantile_is_close_to_scipy() -> None:
    from scipy.stats import chi2

    from calmon.recal.triggers import chi2_quantile

    for df in (3, 8, 15):
        for q in (0.99, 0.9999):  # within a few percent, and never much below
            assert 0.99 <= chi2_quantile(q, df) / chi2.ppf(q, df) <= 1.04
