"""Scores as given -> the model's own probabilities, exactly as the windows read them."""

from __future__ import annotations

import numpy as np

from calmon.engine.records import MULTICLASS, ScoreKind
from calmon.names import sigmoid


def raw_probs(raw: np.ndarray, code: int) -> np.ndarray:
    """Scores of kind ``SCORE_KINDS[code]`` as probabilities: (n,) P(y=1) for a binary
    kind, (n, K) for a multiclass one."""
    if code < MULTICLASS:
        return sigmoid(raw) if code == ScoreKind.LOGIT else raw
    return probs_of(raw, np.full(len(raw), code))


def probs_of(given: np.ndarray, kind: np.ndarray) -> np.ndarray:
    """(n, K) scores as given, of kinds ``kind`` (probs or logits), as probabilities."""
    probs = given.copy()
    logits = kind == ScoreKind.LOGITS
    probs[logits] = softmax(probs[logits])
    probs[~logits] /= probs[~logits].sum(axis=1, keepdims=True)
    return probs


def softmax(z: np.ndarray) -> np.ndarray:
    # not calibrators.scores.softmax: that one clips logits to +-1e6 for safety, and the
    # contract's numbers are the plain softmax of whatever finite logits arrive
    with np.errstate(over="ignore"):  # -1e308 - 1e308 is -inf, and exp(-inf) is 0: right
        e = np.exp(z - z.max(axis=1, keepdims=True))
    out: np.ndarray = e / e.sum(axis=1, keepdims=True)
    return out
