"""Group mode (contract §8) exports every statistic one instance would: the tasks'
engines read through ``calmon.engine.summed.SummedEngine`` by the regular ``Refresher``
give, row for row and field for field, the full snapshot of one engine fed the whole
stream (the reference here), the expensive statistics, the label-free estimates and
their band, PSI and the classwise ECE included; and so after a task is replaced by a
restored copy of its engine (a rebalance)."""

from __future__ import annotations

import math
import zlib
from dataclasses import fields, is_dataclass
from typing import Any

import numpy as np
import pytest

from calmon.config import from_dict
from calmon.engine.engine import Engine
from calmon.engine.records import Raw
from calmon.engine.rows import Row, Snapshot
from calmon.engine.snapshot import Refresher, full_snapshot
from calmon.engine.summed import SummedEngine
from tests.oracle import T0, L, P

CFG = {"metrics": {"windows": ["1h", "24h"], "classwise": True},
       "recalibration": {"window": "24h"},
       "estimates": {"min_samples": 120, "samples": 400}}
TASKS = 3
N = 3000
SPAN = 3 * 3600.0  # the 1h window slides; the 24h one holds everything
COUNTRIES = ("US", "DE", "FR")
SHARES = (0.7, 0.25, 0.05)  # FR's series holds too few labels for its own map


def stream(seed: int) -> list[tuple[float, str, Raw]]:
    """(arrival time, id, record) of two models in arrival order: predictions, their
    labels a little later (about one in ten first), about one in six never labelled."""
    rng = np.random.default_rng(seed)
    ts = T0 + np.sort(rng.uniform(0, SPAN, N))
    out: list[tuple[float, str, Raw]] = []
    for i in range(N):
        pid = f"id{i}"
        seg = {"country": COUNTRIES[rng.choice(3, p=SHARES)],
               "device": "ios" if rng.random() < 0.5 else "web"}
        if i % 2:
            z = rng.normal(0, 1.5)
            p = 1 / (1 + math.exp(-z))
            y = int(rng.random() < min(1.0, p * 1.15))  # a little off: the map matters
            pred = P(pid, float(ts[i]), "bin", prob=p, segment=seg)
        else:
            probs = rng.dirichlet([1.0, 0.7, 0.4])
            y = int(rng.choice(3, p=probs))
            pred = P(pid, float(ts[i]), "multi", probs=probs.tolist(), segment=seg)
        out.append((float(ts[i]), pid, pred))
        if rng.random() < 1 / 6:
            continue  # pending for good
        first = rng.random() < 0.1
        at = ts[i] - rng.uniform(1, 900) if first else ts[i] + rng.uniform(1, 600)
        out.append((float(at), pid, L(pid, y, float(at))))
    out.sort(key=lambda r: r[0])
    return out


def task_of(pid: str) -> int:
    """The partition an id's records go to (both topics keyed by id)."""
    return zlib.crc32(pid.encode()) % TASKS


def feed(engine: Engine, records: list[Raw]) -> None:
    for i in range(0, len(records), 700):
        assert engine.feed(records[i:i + 700], not_after=T0 + 10 * SPAN) == []


def same(a: Any, b: Any, path: str) -> None:
    """Every field equal; numbers within 1e-9."""
    if is_dataclass(a) and not isinstance(a, type):
        assert type(a) is type(b), path
        for f in fields(a):
            same(getattr(a, f.name), getattr(b, f.name), f"{path}.{f.name}")
    elif isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        np.testing.assert_allclose(np.asarray(a, float), np.asarray(b, float), rtol=0,
                                   atol=1e-9, err_msg=path)
    elif isinstance(a, float) or isinstance(b, float):
        assert a is not None and b is not None, f"{path}: {a} != {b}"
        assert (math.isnan(a) and math.isnan(b)) or a == b or abs(a - b) <= 1e-9, \
            f"{path}: {a} != {b}"
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


def assert_equal_snapshots(got: Snapshot, want: Snapshot) -> None:
    def key(r: Row) -> tuple[str, str, str]:
        return r.model, r.segment, r.window

    assert [key(r) for r in got.rows] == [key(r) for r in want.rows]
    for g, w in zip(got.rows, want.rows):
        same(g, w, "/".join(key(w)))
    assert got.counters == want.counters
    assert (got.pending, got.pending_labels) == (want.pending, want.pending_labels)
    assert got.now == want.now
    assert sorted(s for s in got.series if s[0]) == sorted(s for s in want.series if s[0])


def test_the_tasks_read_as_one_engine_fed_every_record() -> None:
    cfg = from_dict(CFG)
    records = stream(37)
    half = len(records) // 2
    one = Engine(cfg)
    tasks = [Engine(cfg) for _ in range(TASKS)]
    summed = Refresher(SummedEngine(cfg, lambda: tasks))

    def feed_all(part: list[tuple[float, str, Raw]]) -> None:
        feed(one, [r for _, _, r in part])
        for t in range(TASKS):
            feed(tasks[t], [r for _, pid, r in part if task_of(pid) == t])

    feed_all(records[:half])
    want = full_snapshot(one)
    assert_equal_snapshots(summed.update(full=True), want)
    # the test reads what it means to: every family filled, every basis met
    rows = want.rows
    assert all(r.stats.smece is not None and r.stats.ece_upper is not None
               for r in rows if r.stats.samples)
    assert all(r.estimates.pending_samples and r.estimates.estimated_accuracy_lower
               is not None for r in rows)
    assert all(r.estimates.score_psi is not None for r in rows if r.window == "1h")
    assert {r.estimates.estimate_basis for r in rows} >= {"series", "model"}
    assert all(r.classwise_ece is not None and r.worst_class is not None
               for r in rows if r.model == "multi" and r.stats.samples)
    assert want.pending and want.pending_labels

    # a rebalance: task 1 moves to a new owner, restored from its checkpoint
    moved = Engine(cfg)
    moved.restore(tasks[1].snapshot())
    tasks[1] = moved
    feed_all(records[half:])
    want = full_snapshot(one)
    assert_equal_snapshots(summed.update(full=True), want)
    assert_equal_snapshots(full_snapshot(SummedEngine(cfg, lambda: tasks)), want)


def test_a_task_fed_alone_or_gone_is_read_again() -> None:
    """The rows follow the tasks between updates: records fed to one task only, then a
    task dropped (its partition revoked) read as one engine fed the records of the
    tasks still held."""
    cfg = from_dict(CFG)
    records = stream(5)
    cut = len(records) // 3
    tasks = [Engine(cfg) for _ in range(TASKS)]
    # a clock that stands still: no refresh round is due unless asked for
    summed = Refresher(SummedEngine(cfg, lambda: tasks), clock=lambda: T0)
    fed: list[tuple[float, str, Raw]] = []

    def give(part: list[tuple[float, str, Raw]], to: set[int]) -> None:
        mine = [r for r in part if task_of(r[1]) in to]
        fed.extend(mine)
        for t in to:
            feed(tasks[t], [r for _, pid, r in mine if task_of(pid) == t])

    def reference(held: set[int]) -> Snapshot:
        one = Engine(cfg)
        feed(one, [r for _, pid, r in sorted(fed, key=lambda x: x[0]) if task_of(pid) in held])
        return full_snapshot(one)

    give(records[:cut], {0, 1, 2})
    summed.update()
    give(records[cut:cut + 300], {0})  # minutes: no label waits join.label_ttl
    assert_equal_snapshots(summed.update(full=True), reference({0, 1, 2}))
    del tasks[2]
    # before the next round the rows keep their expensive statistics (as of the counts
    # they were computed on: said stale), a rebalance does not empty the families
    between = summed.update()
    assert between.stale_since is not None
    assert all(r.stats.ece_upper is not None and r.stats.smece is not None
               for r in between.rows if r.stats.samples)
    assert_equal_snapshots(summed.update(full=True), reference({0, 1}))


@pytest.mark.parametrize("calibration", ["labelled", "live"])
def test_live_calibrators_and_a_regime_change_read_as_one_engine(calibration: str) -> None:
    """With live calibrators (one with a reference histogram for PSI) and the start of a
    new regime set on every engine alike, the estimates read through maps, through the
    calibrator or raw (too few labels since the change) are those of one engine."""
    cfg = from_dict({**CFG, "estimates": {**CFG["estimates"], "calibration": calibration}})
    records = stream(11)
    one = Engine(cfg)
    tasks = [Engine(cfg) for _ in range(TASKS)]
    ref = np.arange(1, cfg.metrics.bins + 1)
    live = {("bin", "country=DE"): (lambda s, k: s ** 1.2, ref),
            ("bin", "__all__"): (lambda s, k: np.clip(0.9 * s, 0, 1), None)}
    for e in [one, *tasks]:
        e.set_calibrators(live)
        e.set_changes({("multi", "__all__"): T0 + SPAN - 600.0})
    feed(one, [r for _, _, r in records])
    for t in range(TASKS):
        feed(tasks[t], [r for _, pid, r in records if task_of(pid) == t])
    want = full_snapshot(one)
    bases = {(r.model, r.segment): r.estimates.estimate_basis for r in want.rows}
    assert {b for (m, _), b in bases.items() if m == "multi"} == {"raw"}
    assert bases[("bin", "country=DE")] == ("series" if calibration == "labelled" else "live")
    assert bases[("bin", "country=US")] == ("series" if calibration == "labelled" else "live")
    assert_equal_snapshots(full_snapshot(SummedEngine(cfg, lambda: tasks)), want)
