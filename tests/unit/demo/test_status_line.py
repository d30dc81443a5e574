"""The demo's status row explains its ECEs: the raw one with its interval and noise
floor, the calibrated one said to be within noise when the raw interval holds it."""

from __future__ import annotations

from calmon.demo.run import ece_cell


def test_a_calibrated_ece_inside_the_raw_interval_is_said_to_be_within_noise() -> None:
    # the case: raw 0.059, calibrated 0.106 read as "the fix made it worse"
    assert ece_cell(0.059, 0.031, 0.121, 0.021, 0.106) == (
        "raw 0.059 [0.031, 0.121] (noise 0.021) -> calibrated 0.106, within noise")
    assert ece_cell(0.18, 0.15, 0.21, 0.02, 0.04) == (
        "raw 0.180 [0.150, 0.210] (noise 0.020) -> calibrated 0.040")


def test_missing_numbers_are_left_out_not_invented() -> None:
    assert ece_cell(None, None, None, None, None) == "raw   -  "
    assert ece_cell(0.05, None, None, 0.02, 0.04) == "raw 0.050 (noise 0.020) -> calibrated 0.040"
