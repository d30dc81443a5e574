"""Held, not published (contract section 6, v4): a refit that passed the gate waits
while the predictions made after its newest sample (joined or not: most have no label
yet) no longer look like its fit data.

A drift that reverts (an upstream fix lands while the labels of the drift are still
coming) leaves a refit fitted on a regime that has ended; publishing it would serve a
calibrator wrong for the regime in force. The unlabelled predictions made since show
it first: their raw-score histogram against the fit's reference (the document's
``reference``: bin counts of the fit samples' raw confidences, as ``score_psi`` reads
it). When their PSI exceeds ``HOLD_PSI`` with at least ``HOLD_MIN`` of them, the refit
is held (a ``held`` event) and the series is refitted, once their labels have come,
on the samples predicted after the held fit's data only: the newest regime.

``HOLD_PSI`` 0.1 is the usual "moderate shift" line of the population stability
index; with ``HOLD_MIN`` 300 predictions in 15 bins a calibrated stream's PSI against
a reference of over 1,000 samples is about 14 x (1/300 + 1/1000) = 0.06 on average and
above 0.1 with probability ~1% (chi-square with 14 degrees of freedom), and a false
hold costs only a later refit, never a wrong publish.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from calmon.engine.estimates import psi

HOLD_PSI = 0.1
HOLD_MIN = 300

# (model, segment, since) -> the bin counts of the raw confidences (binary P(y=1),
# multiclass top label; ``metrics.bins`` equal-width bins) of the series' predictions
# made after ``since``, joined or not; None when unknown (then nothing is held)
ScoresOf = Callable[[str, str, float], np.ndarray | None]


def moved(newer: np.ndarray | None, reference: Sequence[int] | None) -> tuple[float, int] | None:
    """(PSI, count) of the newer predictions against the fit's reference when they have
    moved (at least HOLD_MIN of them, PSI above HOLD_PSI); None otherwise."""
    if newer is None or reference is None or len(newer) != len(reference):
        return None
    n = int(np.sum(newer))
    if n < HOLD_MIN:
        return None
    value = psi(np.asarray(newer, np.float64), np.asarray(reference, np.float64))
    return None if value is None or value <= HOLD_PSI else (value, n)
