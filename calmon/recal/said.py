"""What a publish line says: the evidence the gate weighed, so that a calibrated ECE
above the raw one reads as what it is (noise of a small holdout, or not)."""

from __future__ import annotations

import math

from calmon.recal.refit import Refit


def evidence(result: Refit) -> str:
    """``held-out NLL gain: log e-value 7.3 >= 5.3 needed; holdout ECE 0.0880 ->
    0.1230 on 240 samples, within noise (a calibrated model shows up to 0.1400)``."""
    parts = []
    if result.log_e is not None and result.need is not None:
        parts.append(f"held-out NLL gain: log e-value {result.log_e:.1f} >= "
                     f"{result.need:.1f} needed")
    if result.after is not None:
        before = result.before.ece if result.before is not None else math.nan
        text = (f"holdout ECE {before:.4f} -> {result.after.ece:.4f} on "
                f"{result.holdout_samples} samples")
        if result.ece_noise is not None:
            within = result.after.ece <= result.ece_noise
            text += (f", {'within' if within else 'above'} noise (a calibrated model shows "
                     f"up to {result.ece_noise:.4f} on these bins)")
        parts.append(text)
    return "; ".join(parts) or "no evidence recorded"
