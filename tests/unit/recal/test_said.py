"""A publish line names the gate's evidence: the held-out NLL gain's e-value against
the log(1/alpha) it needed, and whether the holdout ECE is within the noise a
calibrated model shows on the same bins (issue 36 point 5)."""

from __future__ import annotations

import math
import re

import numpy as np
from scipy.special import expit

from calmon.engine.buffer import SampleSet
from calmon.recal.refit import refit
from calmon.recal.said import evidence
from tests.oracle import right_closed_bins


def test_a_publish_says_the_e_value_it_needed_and_the_noise_of_its_holdout_ece() -> None:
    rng = np.random.default_rng(41)
    n, alpha = 3000, 0.01
    z = rng.normal(-1.0, 1.5, n)
    y = (rng.random(n) < expit(z)).astype(np.int64)  # the truth: P(y=1) = sigmoid(z)
    samples = SampleSet(np.arange(n, dtype=float), y, np.ones(n, np.int8), 2.0 * z)
    result = refit(samples, "temperature", None, 0.3, 15, alpha)
    assert result.outcome == "published", result.reason
    assert result.need is not None and math.isclose(result.need, math.log(1 / alpha))
    assert result.log_e is not None and result.log_e >= result.need
    # the noise, independently: the (1 - alpha) quantile of the ECE of labels drawn from
    # the calibrated probabilities themselves, on the holdout's bins (newest 30%)
    hold = np.arange(n) >= n - round(0.3 * n)
    assert result.calibrator is not None
    p = np.asarray(result.calibrator.apply(2.0 * z[hold]), np.float64)
    b = right_closed_bins(p, 15)
    draws = (np.random.default_rng(5).random((8_000, len(p))) < p).astype(float)
    ece = sum(np.abs((draws[:, b == k] - p[b == k]).sum(axis=1)) for k in range(15)
              if (b == k).any()) / len(p)
    want = float(np.quantile(ece, 1 - alpha))
    assert result.ece_noise is not None and abs(result.ece_noise - want) < 0.1 * want
    said = evidence(result)
    assert f"log e-value {result.log_e:.1f} >= {math.log(1 / alpha):.1f} needed" in said
    m = re.search(r"holdout ECE ([\d.]+) -> ([\d.]+) on 900 samples, (within|above) noise "
                  r"\(a calibrated model shows up to ([\d.]+)", said)
    assert m is not None, said
    assert m.group(3) == ("within" if float(m.group(2)) <= float(m.group(4)) else "above")
