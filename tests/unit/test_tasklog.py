"""Group mode's incremental changelog, without a broker (``calmon.tasklog``,
``calmon.engine.sections``, contract §8): each checkpoint writes the head, the index
when it changed, and only the groups of series that changed; a restore after several
incremental checkpoints, with an aborted one in between, equals the engine that was
written (the same snapshot: bins and pending exactly)."""

from __future__ import annotations

import json
import random
from typing import Any

import numpy as np

from calmon.config import from_dict
from calmon.engine import sections
from calmon.engine.engine import Engine
from calmon.engine.records import Kind, Raw
from calmon.io.changelog import Restored, TaskWrite, _records, _Versions
from calmon.tasklog import TaskLog

CFG = from_dict({"segments": {"slices": [["country"]], "max_values": 50},
                 "metrics": {"classwise": True},
                 "recalibration": {"enabled": True, "per_segment": True}})
T0 = 1_764_460_800.0


def records(rng: random.Random, n: int, start: int, models: int = 3,
            countries: int = 40, labels: bool = True) -> list[Raw]:
    out = []
    for i in range(start, start + n):
        m = rng.randrange(models)
        rec: dict[str, Any] = {"id": f"r{i}", "model": f"m{m}", "ts": T0 + i,
                               "segment": {"country": f"c{rng.randrange(countries)}"}}
        if m == 2:
            p = rng.random()
            rec["probs"] = [p, 1 - p]
        else:
            rec["prob"] = rng.random()
        out.append(Raw(Kind.PREDICTION, json.dumps(rec).encode()))
        if labels and rng.random() < 0.7:
            out.append(Raw(Kind.LABEL, json.dumps({"id": f"r{i}",
                                                   "label": rng.randrange(2)}).encode()))
    return out


class Log:
    """A changelog partition: what commits wrote, with the aborted ones in between."""

    def __init__(self) -> None:
        self.records: list[tuple[bytes, bytes | None, dict[str, bytes]]] = []

    def put(self, write: TaskWrite) -> list[bytes]:
        keys = []
        for key, value, heads in _records(0, write):
            self.records.append((key, value, dict(heads)))
            keys.append(key)
        return keys

    def restore(self, name: str) -> Restored:
        held = _Versions(0)
        for at, (key, value, heads) in enumerate(self.records):
            held.add(key, heads, value, at)
        found = held.committed(name, 0)
        assert found is not None
        values, holders = held.chain(found[1].lineage or [])
        return Restored(values, holders, found[1].lineage or [], found[0], 0)


def same(a: Any, b: Any, path: str = "") -> None:
    if isinstance(a, dict):
        assert set(a) == set(b), path
        for k in a:
            same(a[k], b[k], f"{path}/{k}")
    elif isinstance(a, list | tuple):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            same(x, y, f"{path}[{i}]")
    elif isinstance(a, np.ndarray):
        assert np.array_equal(a, np.asarray(b), equal_nan=a.dtype.kind == "f"), path
    elif isinstance(a, float) and np.isnan(a):
        assert np.isnan(b), path
    else:
        assert a == b, (path, a, b)


def checkpoint(log: Log, tl: TaskLog, engine: Engine, at: int, *, commit: bool = True
               ) -> tuple[TaskWrite, list[bytes]]:
    w = tl.write(engine, {"predictions": at, "labels": at}, at)
    keys = log.put(w)
    if commit:
        tl.committed()
    else:
        tl.failed()
    return w, keys


def test_checkpoints_write_what_changed_and_restore_equals_the_engine() -> None:
    rng = random.Random(5)
    engine, log, tl = Engine(CFG), Log(), TaskLog()
    engine.feed(records(rng, 3000, 0), not_after=2e9)
    first, _ = checkpoint(log, tl, engine, 1)
    total = len(sections.live_groups(engine))
    assert {sections.HEAD, sections.INDEX} < set(first.sections)
    assert sum(k.startswith("g") for k in first.sections) == total > 3

    # one new sample of model m0 in country c7: m0's __all__ and m0/country=c7 change
    one = {"id": "one", "model": "m0", "ts": T0 + 2999, "prob": 0.3,
           "segment": {"country": "c7"}}
    engine.feed([Raw(Kind.PREDICTION, json.dumps(one).encode()),
                 Raw(Kind.LABEL, json.dumps({"id": "one", "label": 1}).encode())],
                not_after=2e9)
    small, _ = checkpoint(log, tl, engine, 2)
    sids = {engine.index.find("m0", "__all__"), engine.index.find("m0", "country=c7")}
    done = {k: v for k, v in small.sections.items() if k.startswith(sections.DONE)}
    assert set(small.sections) - set(done) == {sections.HEAD} | {
        sections.group_name(k) for k in sections.groups_of(s for s in sids if s is not None)}
    # the joined-id memory (~2,100 ids): only its last piece, which the new id joined,
    # is written again (and the one it replaces removed)
    assert [v is None for v in done.values()].count(False) == 1
    assert [v is None for v in done.values()].count(True) <= 1
    whole = sum(len(v or b"") for k, v in first.sections.items() if k.startswith(sections.DONE))
    assert sum(len(v or b"") for v in done.values()) < whole / 2

    # an aborted checkpoint (its transaction refused), then more incremental ones
    engine.feed(records(rng, 500, 5000), not_after=2e9)
    checkpoint(log, tl, engine, 3, commit=False)
    engine.feed(records(rng, 500, 6000, countries=60), not_after=2e9)
    last, _ = checkpoint(log, tl, engine, 4)
    engine.feed(records(rng, 200, 7000, labels=False), not_after=2e9)
    last, _ = checkpoint(log, tl, engine, 5)

    restored = Engine(CFG)
    positions = TaskLog.restore(restored, log.restore(last.name))
    assert positions == {"predictions": 5, "labels": 5}
    same(engine.snapshot(), restored.snapshot())
    assert restored.join.pending == engine.join.pending > 0


def test_an_aborted_checkpoint_of_a_zombie_never_enters_a_restore() -> None:
    """A member restores the task from the committed checkpoint and goes on; the
    member it took over from (a zombie) writes one more checkpoint, aborted, after."""
    rng = random.Random(9)
    engine, log, tl = Engine(CFG), Log(), TaskLog()
    engine.feed(records(rng, 2000, 0), not_after=2e9)
    w1, _ = checkpoint(log, tl, engine, 1)
    # the new owner
    mine = Engine(CFG)
    TaskLog.restore(mine, log.restore(w1.name))
    tl2 = TaskLog.of(mine, log.restore(w1.name))
    more = records(rng, 800, 3000)
    mine.feed(more, not_after=2e9)
    w2, _ = checkpoint(log, tl2, mine, 2)
    # the zombie feeds other records and writes, aborted (it is fenced)
    engine.feed(records(random.Random(1), 800, 9000, countries=45), not_after=2e9)
    checkpoint(log, tl, engine, 2, commit=False)
    # the reference: one engine fed everything the chain holds
    ref = Engine(CFG)
    ref.feed(records(random.Random(9), 2000, 0), not_after=2e9)
    ref.feed(more, not_after=2e9)
    restored = Engine(CFG)
    TaskLog.restore(restored, log.restore(w2.name))
    same(ref.snapshot(), restored.snapshot())
