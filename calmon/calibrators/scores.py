"""Safe conversions between raw model scores and probabilities.

Every function here returns finite numbers whatever finite or infinite input it gets:
probabilities are clipped before any log, logits are clipped before any exp, and
softmax subtracts the row maximum first. NaN input is rejected, never propagated.
"""

from __future__ import annotations

from typing import Final

import numpy as np
from numpy.typing import ArrayLike

from calmon.errors import CalibratorError
from calmon.names import BINARY_KINDS, MULTICLASS_KINDS, SCORE_KINDS
from calmon.names import FINITE as _FINITE
from calmon.names import sigmoid as sigmoid  # re-exported: the links live below every layer
from calmon.names import softmax as softmax

EPS: Final = 1e-15
"""Probabilities are clipped to [EPS, 1 - EPS] before log/logit (logit(1 - EPS) ~ 34.5)."""

LOGIT_CAP: Final = 1e6
"""Input logits are clipped to +-LOGIT_CAP. sigmoid saturates at ~37 in float64, so a
larger logit carries no extra information, and the cap keeps s*z finite while fitting."""

BINARY_INPUTS: Final = BINARY_KINDS
MULTICLASS_INPUTS: Final = MULTICLASS_KINDS
INPUTS: Final = SCORE_KINDS


def check_input(input: str) -> str:
    if input not in INPUTS:
        raise CalibratorError(f"input must be one of {', '.join(INPUTS)}, got {input!r}")
    return input


def is_binary(input: str) -> bool:
    return check_input(input) in BINARY_INPUTS


def as_scores(scores: ArrayLike, input: str) -> np.ndarray:
    """Validate raw scores of kind ``input``: float64, (n,) binary or (n, K>=2) multiclass,
    no NaN (infinities are allowed: they are clipped by the conversions)."""
    binary = is_binary(input)
    try:
        arr = np.asarray(scores, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise CalibratorError(f"{input} scores are not a numeric array: {exc}") from None
    if binary and arr.ndim != 1:
        raise CalibratorError(f"{input} scores must have shape (n,), got {arr.shape}")
    if not binary and (arr.ndim != 2 or arr.shape[1] < 2):
        raise CalibratorError(f"{input} scores must have shape (n, K>=2), got {arr.shape}")
    if np.isnan(arr).any():
        raise CalibratorError(f"{input} scores contain NaN")
    return arr


PROBS_TOLERANCE: Final = 1e-3
"""Rows of ``probs`` scores sum to 1 within this (as records must, contract §1)."""


def not_probabilities(arr: np.ndarray) -> bool:
    """Whether validated scores of a probability kind cannot be probabilities: an entry
    outside [0, 1], or a multiclass row that does not sum to 1 (logits, most likely)."""
    if not bool(np.all((arr >= 0.0) & (arr <= 1.0))):
        return True
    return arr.ndim == 2 and bool(np.any(np.abs(arr.sum(axis=1) - 1.0) > PROBS_TOLERANCE))


def as_kind(scores: ArrayLike, fitted: str, input: str | None = None) -> np.ndarray:
    """Validated scores for a calibrator fitted on ``fitted`` scores. ``input``, when
    given, is the caller's kind and must be ``fitted``; a probability calibrator refuses
    scores that cannot be probabilities rather than clip logits into some."""
    if input is not None and check_input(input) != fitted:
        raise CalibratorError(f"this calibrator takes {fitted!r} scores, not {input!r}")
    arr = as_scores(scores, fitted)
    if fitted in ("prob", "probs") and not_probabilities(arr):
        logits = "logit" if fitted == "prob" else "logits"
        raise CalibratorError(
            f"this calibrator takes {fitted!r} scores, and these are not probabilities "
            f"(outside [0, 1]{'' if fitted == 'prob' else ' or rows not summing to 1'}): "
            f"{logits} need a calibrator fitted with input={logits!r}")
    return arr


def as_labels(labels: ArrayLike, scores: np.ndarray, input: str) -> np.ndarray:
    """Validate fit labels against validated ``scores``: int64 0/1 (binary, both present)
    or 0..K-1 (multiclass), one per score row, at least two of them."""
    lab = np.asarray(labels)
    if lab.dtype == bool:
        lab = lab.astype(np.int64)
    if lab.ndim != 1 or len(lab) != len(scores):
        raise CalibratorError(f"labels must have shape ({len(scores)},), got {lab.shape}")
    if not np.issubdtype(lab.dtype, np.number):
        raise CalibratorError(f"labels must be integers, got dtype {lab.dtype}")
    if np.issubdtype(lab.dtype, np.floating) and not (
        np.isfinite(lab).all() and (lab == np.round(lab)).all()
    ):
        raise CalibratorError("labels must be integers")
    lab = lab.astype(np.int64)
    if len(lab) < 2:
        raise CalibratorError(f"need at least 2 samples to fit, got {len(lab)}")
    k = 2 if is_binary(input) else scores.shape[1]
    if lab.min() < 0 or lab.max() >= k:
        raise CalibratorError(f"labels must be in 0..{k - 1}")
    if is_binary(input) and lab.min() == lab.max():
        raise CalibratorError(f"only class {lab[0]} present: cannot fit a binary calibrator")
    return lab


def logit(p: np.ndarray) -> np.ndarray:
    p = np.clip(p, EPS, 1.0 - EPS)
    return np.asarray(np.log(p) - np.log1p(-p))


def logsumexp(z: np.ndarray) -> np.ndarray:
    m = z.max(axis=1)
    return np.asarray(m + np.log(np.exp(z - m[:, None]).sum(axis=1)))


def normalize_rows(p: np.ndarray) -> np.ndarray:
    """Clip to [0, 1] and rescale rows to sum to 1; an all-zero row becomes uniform."""
    p = np.clip(p, 0.0, 1.0)
    s = p.sum(axis=1, keepdims=True)
    ok = s > 0
    return np.where(ok, p / np.where(ok, s, 1.0), 1.0 / p.shape[1])


def to_logits(scores: ArrayLike, input: str) -> np.ndarray:
    """Raw scores -> finite logits: (n,) log-odds for binary kinds, (n, K) for multiclass
    (row max subtracted, which softmax ignores, so huge logits lose no information)."""
    arr = as_scores(scores, input)
    if input == "logit":
        return np.asarray(np.clip(arr, -LOGIT_CAP, LOGIT_CAP))
    if input == "prob":
        return logit(np.clip(arr, 0.0, 1.0))
    if input == "logits":
        z = np.clip(arr, -_FINITE, _FINITE)
        return np.asarray(np.maximum(z - z.max(axis=1, keepdims=True), -LOGIT_CAP))
    return np.asarray(np.log(np.clip(normalize_rows(arr), EPS, 1.0 - EPS)))


def to_probs(scores: ArrayLike, input: str) -> np.ndarray:
    """Raw scores -> probabilities: (n,) P(y=1) for binary kinds, (n, K) rows summing to 1
    for multiclass kinds. Never NaN or inf."""
    arr = as_scores(scores, input)
    if input == "prob":
        return np.asarray(np.clip(arr, 0.0, 1.0))
    if input == "probs":
        return normalize_rows(arr)
    z = to_logits(arr, input)
    return sigmoid(z) if input == "logit" else softmax(z)


P_MIN: Final = 1e-7
"""Every calibrated output lies in [P_MIN, 1 - P_MIN] (contract §6: no certainties)."""


def finalize(p: np.ndarray) -> np.ndarray:
    """Calibrated output, away from 0 and 1: binary probabilities clipped into
    [P_MIN, 1 - P_MIN]; multiclass rows renormalised, and a row with a class below P_MIN
    mixed with the uniform distribution just enough to lift it there (rows keep summing
    to 1 and their order of classes; then no class exceeds 1 - P_MIN either)."""
    if p.ndim == 1:
        return np.asarray(np.clip(p, P_MIN, 1.0 - P_MIN))
    p = normalize_rows(p)
    k = p.shape[1]
    low = p.min(axis=1, keepdims=True)
    # the least weight w on uniform with (1 - w) low + w / k = P_MIN; low <= 1/k always
    gap = np.maximum(1.0 / k - low, np.finfo(np.float64).tiny)
    w = np.clip((P_MIN - low) / gap, 0.0, 1.0)
    mixed = np.where(w > 0, (1.0 - w) * p + w / k, p)
    return np.asarray(np.clip(mixed, P_MIN, 1.0 - P_MIN))  # rounding only
