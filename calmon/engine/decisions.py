"""The model's own decision (contract v5 §1, §2): reading a prediction's ``decision``,
class names in labels and decisions, and the decision realized accuracy scores.

A decision is a class index held as an int: ``NONE`` (-1) where the prediction gave
none (then binary ``p >= models.<m>.threshold``, multiclass argmax decide). A label
given as a name is ``NAMED`` in the parsed label column (its name beside it) until it
meets its prediction, whose model says what the name means; a name the model does not
list resolves to ``UNLISTED``, past every class count, so the join's range check calls
it ``label_out_of_range`` exactly as an index out of range.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from calmon.config import EVERY_MODEL, Config, ModelConfig

NONE = -1  # a prediction without a decision
BAD = -2  # a decision that breaks the rules: reason bad_decision
NAMED = -1  # a label given as a class name, in the parsed label column
UNLISTED = 2**62  # a name the model does not list: out of range for every prediction


class ClassNames:
    """``models.<m>.classes`` as name -> index, per model name (its own entry over
    ``"*"``); only configured entries are held, so the map is bounded by the config."""

    def __init__(self, models: Mapping[str, ModelConfig] | None = None) -> None:
        models = models or {}
        every = models.get(EVERY_MODEL, ModelConfig())
        self._every = _index(every.classes)
        self._own = {m: _index(c.over(every).classes) for m, c in models.items()
                     if m != EVERY_MODEL}

    @classmethod
    def of(cls, cfg: Config) -> ClassNames:
        return cls(cfg.models)

    def __bool__(self) -> bool:
        return self._every is not None or any(v is not None for v in self._own.values())

    def names(self, model: str) -> Mapping[str, int] | None:
        """Model ``model``'s classes by name, None when it lists none."""
        return self._own.get(model, self._every)

    def index(self, model: str, name: str) -> int:
        """The class index of a label's name for this model, or ``UNLISTED``."""
        names = self._own.get(model, self._every)
        return UNLISTED if names is None else names.get(name, UNLISTED)


def _index(classes: tuple[str, ...] | None) -> dict[str, int] | None:
    return None if classes is None else {c: i for i, c in enumerate(classes)}


def decision_of(v: Any, classes: int, names: Mapping[str, int] | None) -> int:
    """A prediction's decision as read (JSON-decoded; None: absent) for a model of
    ``classes`` classes (0: binary): its class index, ``NONE`` or ``BAD``. Binary: 0/1,
    true/false or a name; multiclass: an index below K or a name. An integral float
    counts as its integer, as in a label."""
    if v is None:
        return NONE
    t = type(v)
    if t is bool:
        return int(v) if classes == 0 else BAD
    if t is int:
        d = v
    elif t is str:
        d = BAD if names is None else names.get(v, BAD)
    elif t is float and v.is_integer():
        d = int(v)
    else:
        return BAD
    return d if 0 <= d < (classes or 2) else BAD


def binary_decided(p: np.ndarray, threshold: np.ndarray | float,
                   decision: np.ndarray) -> np.ndarray:
    """Binary: the class decided (0/1), the prediction's decision where it gave one,
    else ``p >= threshold`` (p the reported probability). A decision no parser gives
    (a crafted checkpoint) counts as none."""
    given = (decision == 0) | (decision == 1)
    out: np.ndarray = np.where(given, decision, p >= threshold).astype(np.int64)
    return out


def multi_decided(probs: np.ndarray, decision: np.ndarray) -> np.ndarray:
    """Multiclass: the class decided, the prediction's decision else the argmax."""
    given = (decision >= 0) & (decision < probs.shape[1])
    out: np.ndarray = np.where(given, decision, probs.argmax(axis=1))
    return out


def thresholds(cfg: Config, models: list[str]) -> np.ndarray:
    """``models.<m>.threshold`` per model index (0.5 unless set)."""
    return np.array([cfg.model(m).threshold or 0.5 for m in models] or [0.5], np.float64)


def no_names(model: int, name: str) -> int:
    """The join's class index of a name before the engine says what models list."""
    return UNLISTED


def gathered(slot_col: np.ndarray, batch_col: np.ndarray, old: np.ndarray,
             slots: np.ndarray, ords: np.ndarray) -> np.ndarray:
    """The join's decisions of what joined: those held in slots (where ``old``) and the
    batch's own (``NONE`` where the batch gave no column)."""
    out = np.full(len(old), NONE, np.int64)
    out[old] = slot_col[slots]
    if len(batch_col):
        out[~old] = batch_col[ords]
    return out
