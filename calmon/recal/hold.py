"""Held, not published (contract section 6, v4): a refit that passed the gate waits
while the predictions made after its newest sample (joined or not: most have no label
yet) no longer look like its fit data.

A drift that reverts (an upstream fix lands while the labels of the drift are still
coming) leaves a refit fitted on a regime that has ended; publishing it would serve a
calibrator wrong for the regime in force. The unlabelled predictions made since show
it first: their raw-score histogram against the fit's reference (the document's
``reference``: bin counts of the fit samples' raw confidences, as ``score_psi`` reads
it). When their PSI exceeds ``HOLD_PSI``, and what two samples of their sizes from one
distribution show with probability ``HOLD_LEVEL`` (below), with at least ``HOLD_MIN``
of them, the refit is held (a ``held`` event) and the series is refitted, once their
labels have come, on the samples predicted after the held fit's data only: the newest
regime.

``HOLD_PSI`` 0.1 is the usual "moderate shift" line of the population stability
index. PSI is noisy on small samples, most of all through sparse tail bins (a bin
holding 1 of 300 newer predictions and none of the reference adds 0.01 on its own),
so the hold reads it on the fit's bins merged left to right until each group holds at
least ``GROUP`` of both samples. Then, for two samples of sizes n and m from one
distribution, PSI is about (1/n + 1/m) times a chi-square with (groups - 1) degrees
of freedom (PSI ~ sum (c - r)^2 / r), and the bar is the larger of ``HOLD_PSI`` and
that chi-square's 1 - ``HOLD_LEVEL`` quantile times (1/n + 1/m): 300 predictions
against a 210-sample reference of a steady stream were held 13% of the time on the
plain bins at that bar, 0.75% on the groups (400 draws). A false hold costs a later
refit on newer samples, never a wrong publish.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from calmon.engine.estimates import psi
from calmon.recal.triggers import chi2_quantile

HOLD_PSI = 0.1
HOLD_MIN = 300
HOLD_LEVEL = 0.01  # how often a steady stream may read above the bar
GROUP = 10  # predictions of each sample a group of bins holds at least

# (model, segment, since) -> the bin counts of the raw confidences (binary P(y=1),
# multiclass top label; ``metrics.bins`` equal-width bins) of the series' predictions
# made after ``since``, joined or not; None when unknown (then nothing is held)
ScoresOf = Callable[[str, str, float], np.ndarray | None]


def grouped(newer: np.ndarray, reference: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Both histograms on the bins merged left to right until a group holds at least
    GROUP of each (a short remainder joins the last group)."""
    a: list[float] = []
    b: list[float] = []
    ca = cb = 0.0
    for x, y in zip(newer.tolist(), reference.tolist()):
        ca, cb = ca + x, cb + y
        if ca >= GROUP and cb >= GROUP:
            a.append(ca)
            b.append(cb)
            ca = cb = 0.0
    if a:
        a[-1], b[-1] = a[-1] + ca, b[-1] + cb
    else:
        a, b = [ca], [cb]
    return np.array(a), np.array(b)


def bar(newer: np.ndarray, reference: np.ndarray) -> float:
    """The PSI (on groups) above which the newer predictions have moved: HOLD_PSI, or
    the noise of two samples of these sizes from one distribution, if larger."""
    n, m = float(newer.sum()), float(reference.sum())
    df = max(1, len(newer) - 1)
    return max(HOLD_PSI, chi2_quantile(1.0 - HOLD_LEVEL, df) * (1.0 / n + 1.0 / m))


def moved(newer: np.ndarray | None, reference: Sequence[int] | None
          ) -> tuple[float, int, float] | None:
    """(PSI on groups, count, bar) of the newer predictions against the fit's reference
    when they have moved (at least HOLD_MIN of them, PSI above ``bar``); None
    otherwise."""
    if newer is None or reference is None or len(newer) != len(reference):
        return None
    n = int(np.sum(newer))
    ref = np.asarray(reference, np.float64)
    if n < HOLD_MIN or ref.sum() <= 0:
        return None
    cur, ref = grouped(np.asarray(newer, np.float64), ref)
    value, need = psi(cur, ref), bar(cur, ref)
    return None if value is None or value <= need else (value, n, need)
