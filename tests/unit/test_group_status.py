"""A group member's ``/status`` engine part sums its tasks; a member that owns no task
yet (more members than partitions, or before its first assignment) shows every
counter at 0, as one instance does, not an empty map (a reader summing ``joined``
over the members met a KeyError)."""

from __future__ import annotations

from types import SimpleNamespace

from calmon.config import from_dict
from calmon.engine.engine import Engine
from calmon.group_run import GroupRun

CFG = {"kafka": {"predictions_topic": "p", "labels_topic": "l"}}


def status_of(engines: list[Engine]) -> dict:
    member = SimpleNamespace(tasks=SimpleNamespace(engines=lambda: engines),
                             refresher=SimpleNamespace(latest=SimpleNamespace(version=3)))
    return GroupRun.engine_status(member)  # type: ignore[arg-type]


def test_a_member_without_tasks_shows_every_counter_at_zero() -> None:
    one = Engine(from_dict(CFG)).status()
    out = status_of([])
    assert out["counters"] == {k: 0 for k in one["counters"]}
    assert "joined" in out["counters"] and out["pending"] == 0


def test_the_counters_of_two_tasks_add_up() -> None:
    a, b = Engine(from_dict(CFG)), Engine(from_dict(CFG))
    a.counters["joined"] += 2
    b.counters["joined"] += 5
    b.counters["invalid"] += 1
    out = status_of([a, b])
    assert out["counters"]["joined"] == 7 and out["counters"]["invalid"] == 1
    assert out["counters"]["predictions"] == 0
