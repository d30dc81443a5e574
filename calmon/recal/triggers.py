"""Drift triggers: pure decisions from window statistics.

A trigger *fires* only with enough samples and when the ECE is significant:
above the (1 - alpha) quantile of the ECE a perfectly calibrated model would
show with the same bins (so small segments do not raise false alarms).
Cooldown only holds back refits, not the ``calmon_drift`` signal.
"""

from __future__ import annotations

from dataclasses import dataclass

from calmon.config import RecalibrationConfig
from calmon.engine.metrics import Bins, ece, null_ece_quantile

TRIGGERS = ("ece_above", "ece_increase", "observed_over_expected")


@dataclass(frozen=True)
class Reading:
    """What the triggers look at for one model/segment in the trigger window."""

    bins: Bins  # the bins whose ECE is monitored (after the live calibrator, if any)
    binary: bool
    last_publish_ece: float | None  # holdout ECE of the live calibrator when it was published

    @property
    def samples(self) -> int:
        return int(self.bins.count.sum())


@dataclass(frozen=True)
class Decision:
    ece: float
    null_quantile: float
    significant: bool
    fired: tuple[str, ...]
    observed_over_expected: float | None


def decide(cfg: RecalibrationConfig, r: Reading) -> Decision:
    t = cfg.triggers
    n = r.samples
    if n == 0:
        return Decision(0.0, 0.0, False, (), None)
    b = r.bins
    value = ece(b.count, b.conf, b.correct)
    q = null_ece_quantile(b.count, b.conf, 1.0 - cfg.alpha)
    significant = value > q
    sum_p = float(b.conf.sum())
    oe = float(b.correct.sum()) / sum_p if r.binary and sum_p > 0 else None
    fired: list[str] = []
    if n >= cfg.min_samples and significant:
        if t.ece_above is not None and value > t.ece_above:
            fired.append("ece_above")
        if (t.ece_increase is not None and r.last_publish_ece is not None
                and value > r.last_publish_ece + t.ece_increase):
            fired.append("ece_increase")
        band = t.observed_over_expected
        if band is not None and oe is not None and not band[0] <= oe <= band[1]:
            fired.append("observed_over_expected")
    return Decision(value, q, significant, tuple(fired), oe)

