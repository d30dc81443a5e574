"""Effect-size triggers: pure decisions on the samples after an estimated change.

Significance comes from the sequential detector (calmon.recal.detect); these
triggers say whether the change is large enough to act on. They read the samples
predicted since the estimated change time, after the live calibrator:
``ece_above`` (ECE over a threshold), ``ece_increase`` (over the live calibrator's
holdout ECE at publish time plus a margin), ``observed_over_expected`` (binary:
sum y / sum p outside a band), ``classwise_ece_above`` (multiclass with
``metrics.classwise``: the mean over classes of the ECE of p_k against [y = k] over a
threshold; a class-prior shift shows there while the top-label ECE hardly moves).
"""

from __future__ import annotations

from dataclasses import dataclass

from calmon.config import RecalibrationConfig
from calmon.engine.metrics import Bins, ece, noise_floor

TRIGGERS = ("ece_above", "ece_increase", "observed_over_expected", "classwise_ece_above")


@dataclass(frozen=True)
class Reading:
    """What the triggers look at for one model/segment."""

    bins: Bins  # after the live calibrator, samples since the estimated change
    binary: bool
    # the live calibrator's holdout ECE at publish, bias-corrected (less its noise floor),
    # as ``ece_increase`` compares it with the bias-corrected ECE of these bins
    last_publish_ece: float | None
    classwise_ece: float | None = None  # multiclass with metrics.classwise, same samples

    @property
    def samples(self) -> int:
        return int(self.bins.count.sum())


@dataclass(frozen=True)
class Decision:
    ece: float
    fired: tuple[str, ...]
    observed_over_expected: float | None


def decide(cfg: RecalibrationConfig, r: Reading) -> Decision:
    """Which triggers' effect sizes are exceeded (call only once the detector alarms)."""
    t = cfg.triggers
    if r.samples == 0:
        return Decision(0.0, (), None)
    b = r.bins
    value = ece(b.count, b.conf, b.correct)
    sum_p = float(b.conf.sum())
    oe = float(b.correct.sum()) / sum_p if r.binary and sum_p > 0 else None
    fired: list[str] = []
    if t.ece_above is not None and value > t.ece_above:
        fired.append("ece_above")
    # like with like: the plug-in ECE of a few hundred samples sits well above the true
    # one, so both sides are bias-corrected (less the calibrated model's mean ECE)
    if (t.ece_increase is not None and r.last_publish_ece is not None
            and value - noise_floor(b.count, b.conf) > r.last_publish_ece + t.ece_increase):
        fired.append("ece_increase")
    band = t.observed_over_expected
    if band is not None and oe is not None and not band[0] <= oe <= band[1]:
        fired.append("observed_over_expected")
    if (t.classwise_ece_above is not None and r.classwise_ece is not None
            and r.classwise_ece > t.classwise_ece_above):
        fired.append("classwise_ece_above")
    if (t.ece_above is None and t.ece_increase is None and band is None
            and t.classwise_ece_above is None):
        fired.append("evidence")  # no effect-size triggers configured: the detector decides
    return Decision(value, tuple(fired), oe)
