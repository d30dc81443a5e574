"""Alternation (calmon.recal.cycle): a rollback to the calibrator live two publishes
before marks a cycle once it happens twice among the last publishes."""

from __future__ import annotations

from typing import Any

from calmon.recal.cycle import Cycles, alternations
from calmon.recal.registry import Registry


def _doc(method: str, trigger: str, **params: float) -> dict[str, Any]:
    return {"model": "m", "segment": "__all__", "method": method, "input": "logit",
            "params": params, "trigger": trigger, "fitted_at": "2026-01-01T00:00:00Z"}


AFTERNOON = _doc("temperature", "ece_above", temperature=0.6)
IDENTITY = _doc("identity", "rollback")
BACK = {**AFTERNOON, "trigger": "rollback", "rollback_of": 1}


def test_two_rollbacks_to_the_calibrator_live_two_publishes_before_are_a_cycle() -> None:
    # v1 afternoon fit, v2 identity (live before v1), v3 the afternoon fit again
    docs = {1: AFTERNOON, 2: IDENTITY, 3: BACK}
    assert alternations(docs, [1, 2, 3]) == 2
    reg = Registry(None)
    cycles = Cycles(reg)
    for d in (AFTERNOON, IDENTITY):
        reg.publish(d)
    assert not cycles.cyclic("m", "__all__")  # one rollback: a drift undone, not a cycle
    reg.publish(BACK)
    assert cycles.cyclic("m", "__all__")


def test_a_rollback_elsewhere_or_a_new_fit_is_no_alternation() -> None:
    other = _doc("temperature", "ece_above", temperature=0.8)
    # v3 rolls back to the identity, but v1 (two publishes before) was a fit: no swing
    docs = {1: AFTERNOON, 2: other, 3: IDENTITY}
    assert alternations(docs, [1, 2, 3]) == 0
    # a refit that happens to land near the old one is not a rollback
    docs = {1: AFTERNOON, 2: IDENTITY, 3: AFTERNOON}
    assert alternations(docs, [1, 2, 3]) == 1
