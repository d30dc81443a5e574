"""Effect-size triggers (calmon.recal.triggers): which fire on given bins, checked
against the contract's formulas computed here."""

from __future__ import annotations

import numpy as np

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


def test_ece_increase_reads_the_baseline() -> None:
    cfg = RecalibrationConfig(triggers=Triggers(ece_above=None, ece_increase=0.02,
                                                observed_over_expected=None))
    b = bins([100, 100], [0.2, 0.8], [0.23, 0.83])  # ECE 0.03
    assert decide(cfg, Reading(b, True, 0.005)).fired == ("ece_increase",)
    assert decide(cfg, Reading(b, True, 0.02)).fired == ()
    assert decide(cfg, Reading(b, True, None)).fired == ()


def test_multiclass_has_no_observed_over_expected_and_no_triggers_means_evidence() -> None:
    b = bins([50], [0.9], [0.9])
    d = decide(RecalibrationConfig(), Reading(b, False, None))
    assert d.observed_over_expected is None and d.fired == ()
    none = RecalibrationConfig(triggers=Triggers(None, None, None))
    assert decide(none, Reading(b, False, None)).fired == ("evidence",)
