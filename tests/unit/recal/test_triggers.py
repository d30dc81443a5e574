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
