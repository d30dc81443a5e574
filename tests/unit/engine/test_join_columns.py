"""``Join.run_all`` (decisions over columns, the odd records one by one) against
``Join.run`` (every record one by one), batch by batch.

Two engines take the same batches; one has the columnar decisions switched off. After
every batch their snapshots must be equal as they are, not normalised: the same dict
orders, the same remembered ids in the same order, the sample buffers in the same
order. That holds only if the joined samples, the pending predictions and the
remembered ids come out in the order a whole-batch ``run`` makes them.

The streams draw ids from a pool wide enough that most batches have each id at most
once per kind (the columnar path's condition), and mix in what makes a record odd:
labels before their prediction, a label for an id pending from an earlier batch,
duplicates, ids joined before, labels out of range, overdue predictions and rejects.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from calmon.engine.engine import Engine
from calmon.engine.join import Join
from calmon.engine.records import Kind
from tests.unit.engine.columnar import INDEX_MODES, index_mode, plain
from tests.unit.engine.test_columnar_join import (
    CLASSES,
    Junk,
    Lab,
    Pred,
    config,
    render,
)

IDS = [f"i{k}" for k in range(60)]
MODELS = sorted(CLASSES)


@st.composite
def streams(draw: st.DrawFn) -> list[Any]:
    """Each id gets a story (mostly one prediction and one label, sometimes none or two
    of either, at times near each other), and the stories are interleaved at random."""
    events: list[Any] = []
    for pid in draw(st.lists(st.sampled_from(IDS), min_size=4, max_size=45, unique=True)):
        model = draw(st.sampled_from(MODELS))
        t = draw(st.integers(0, 30))
        n_pred = draw(st.sampled_from([1] * 10 + [0, 2]))
        n_lab = draw(st.sampled_from([1] * 8 + [0, 0, 2]))
        events += [Pred(pid, model, t + draw(st.integers(0, 2)),
                        draw(st.sampled_from([None, "US", "DE"]))) for _ in range(n_pred)]
        events += [Lab(pid, draw(st.sampled_from([0, 0, 1, 1, 1, 2, 3])),
                       draw(st.one_of(st.none(), st.integers(t, t + 14))),
                       draw(st.sampled_from([None, None, model, "ghost"])))
                   for _ in range(n_lab)]
    events += draw(st.lists(st.builds(Junk, st.sampled_from([Kind.PREDICTION, Kind.LABEL])),
                            max_size=3))
    # a first prediction, fed alone: later batches have a now (see below)
    return [Pred("i99", "b", 0, None), *draw(st.permutations(events))]


@contextmanager
def counting() -> Iterator[dict[str, int]]:
    """Counts the batches ``_run_columns`` decided (True) and the records of them
    it sent through ``run`` one by one."""
    seen = {"columns": 0, "odd": 0}
    columns, odd = Join._run_columns, Join._run_odd

    def run_columns(self: Join, *args: Any) -> bool:
        out = columns(self, *args)
        seen["columns"] += out
        return out

    def run_odd(self: Join, b: Any, records: list[int], *args: Any) -> Any:
        seen["odd"] += len(records)
        return odd(self, b, records, *args)

    Join._run_columns = run_columns  # type: ignore[method-assign]
    Join._run_odd = run_odd  # type: ignore[method-assign]
    try:
        yield seen
    finally:
        Join._run_columns = columns  # type: ignore[method-assign]
        Join._run_odd = odd  # type: ignore[method-assign]


def one_by_one(e: Engine) -> Engine:
    e.join._run_columns = lambda b: False  # type: ignore[method-assign]
    return e


def same_after_every_batch(events: list[Any], size: int | list[int],
                           max_pending: int = 1000) -> None:
    """Feed both engines batches of ``size`` records (or of the given sizes) and compare
    them after each."""
    cfg = config(False, max_pending)
    raws = render(events)
    sizes = size if isinstance(size, list) else [size] * -(-len(raws) // size)
    a, b = Engine(cfg), one_by_one(Engine(cfg))
    a.join.columns_from = 0  # however small the batch
    i = 0
    for n in sizes:
        ra = a.feed(raws[i:i + n])
        rb = b.feed(raws[i:i + n])
        assert ra == rb
        assert plain(vars(a.last_delta)) == plain(vars(b.last_delta))
        assert plain(a.snapshot()) == plain(b.snapshot()), f"after the batch at {i}"
        i += n
    assert i >= len(raws)
    assert a.counters == b.counters


@pytest.mark.parametrize("mode", sorted(INDEX_MODES))
@settings(max_examples=150, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(streams(), st.sampled_from([5, 17, 40, 120]))
def test_columns_equal_one_by_one(mode: str, events: list[Any], size: int) -> None:
    with index_mode(INDEX_MODES[mode]):
        same_after_every_batch(events, [1] + [size] * -(-len(events) // size))


@pytest.mark.parametrize("max_pending", [3, 40])
def test_near_the_bounds_it_is_one_by_one(max_pending: int) -> None:
    """Far from join.max_pending the columns decide; near it, run does (capacity is
    enforced record by record) and the outcome is still the same."""
    events = [Pred(f"i{k}", "b", k, "US") for k in range(30)]
    events += [Lab(f"i{k}", k % 2, 31, None) for k in range(30)]
    with counting() as seen:
        same_after_every_batch(events, 20, max_pending)
    # the first batch has no now yet (an undated label would be dated by the first
    # prediction): one by one; the one-by-one engine never reaches the columns
    assert seen["columns"] == (0 if max_pending == 3 else 2)


def test_a_plain_stream_takes_the_columns_and_odd_records_run_one_by_one() -> None:
    """Predictions joined by later labels in the batch and in later ones are plain; a
    label before its prediction, a duplicate and a label of an unknown id are odd."""
    events: list[Any] = [Pred("i39", "b", 0, None)]  # a now for the first batch
    events += [Pred(f"i{k}", "b", 10 + k % 5, "US") for k in range(20)]  # due at 22+
    events += [Lab(f"i{k}", 1, 21, None) for k in range(0, 20, 2)]
    events += [Lab("i30", 1, 21, None), Pred("i30", "b", 21, None),  # label first
               Pred("i1", "b", 21, None),  # a duplicate of a pending prediction
               Lab("i31", 0, None, "b")]  # waits
    events += [Lab(f"i{k}", 0, 22, None) for k in range(1, 20, 2)]
    with counting() as seen:
        same_after_every_batch(events, [1, 30, len(events) - 31])  # 1: a now
    assert seen["columns"] == 2
    assert seen["odd"] == 5  # the label and prediction of i30, i1 twice, i31
