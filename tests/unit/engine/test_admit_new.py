"""A batch that brings new models admits them up front and joins as one common batch
(``Admission._admit_new``: each task's first batch in group mode) only where that
leaves exactly what the record-by-record path leaves: the same state byte for byte (the
changelog's full write), the same rejected records and the same ``last_delta`` of every
feed, compared here against the same engine with the shortcut taken out."""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from calmon.config import Config, from_dict
from calmon.engine.admission import Admission
from calmon.engine.engine import Engine
from calmon.engine.records import Kind, Raw
from calmon.tasklog import TaskLog
from tests.oracle import T0
from tests.unit.engine.columnar import plain
from tests.unit.engine.test_columnar_join import SETTINGS, config, render, score_fields, streams


@contextmanager
def counted(monkeypatch: pytest.MonkeyPatch, shortcut: bool) -> Iterator[list[int]]:
    """Feeds made inside go with (``shortcut``) or without ``_admit_new``; yields the
    number of record-by-record batches, counted as they come."""
    calls = [0]
    one_by_one = Admission._one_by_one

    def counting(self: Any, *a: Any) -> Any:
        calls[0] += 1
        return one_by_one(self, *a)

    with monkeypatch.context() as m:
        m.setattr(Admission, "_one_by_one", counting)
        if not shortcut:
            m.setattr(Admission, "_admit_new", lambda self, b: None)
        yield calls


def fed(cfg: Config, batches: list[list[Raw]]) -> tuple[list[Any], list[bytes]]:
    """Each feed's rejected records and delta, and the state's full write at the end."""
    e = Engine(cfg)
    out = []
    for b in batches:
        rejected = e.feed(b)
        d = e.last_delta
        out.append(plain([rejected, dict(d.predictions), dict(d.labels), dict(d.joined),
                          dict(d.expired), d.labels_expired, dict(d.duplicates),
                          dict(d.invalid), d.bins, d.delays, dict(e.counters)]))
    w = TaskLog().write(e, {}, 0, full=True)
    return out, [k.encode() + (v or b"") for k, v in sorted(w.sections.items())]


def both(monkeypatch: pytest.MonkeyPatch, cfg: Config,
         batches: list[list[Raw]]) -> tuple[list[int], list[int]]:
    """Fed with and without the shortcut: the same; their record-by-record counts."""
    with counted(monkeypatch, True) as fast:
        got = fed(cfg, batches)
    with counted(monkeypatch, False) as slow:
        want = fed(cfg, batches)
    assert got[0] == want[0]
    assert got[1] == want[1]
    return fast, slow


@SETTINGS
@given(streams, st.sampled_from([(None, 1000), (2, 1000), (None, 2), (1, 3)]),
       st.sampled_from([1, 4, 1000]))
def test_new_models_admitted_up_front_leave_what_one_by_one_leaves(
        events: list[Any], limits: tuple[int | None, int], size: int) -> None:
    """Random streams (three models of two class counts, labels before and after their
    predictions, hints naming new, old and unknown models, duplicates, junk), under
    ``limits.max_models`` 1 and 2 (some new models rejected) and tiny capacity."""
    max_models, max_pending = limits
    cfg = config(max_pending=max_pending)
    if max_models is not None:
        cfg = from_dict({**_as_dict(max_pending), "limits": {"max_models": max_models}})
    raws = render(events)
    with pytest.MonkeyPatch.context() as mp:
        both(mp, cfg, [raws[i:i + size] for i in range(0, len(raws), size)])


def _as_dict(max_pending: int) -> dict[str, Any]:
    """``test_columnar_join.config`` as a dict, to add limits to."""
    return {"metrics": {"windows": ["1h", "24h"]},
            "segments": {"slices": [["country"]], "max_values": 5},
            "join": {"ttl": "1h", "label_ttl": "30m", "max_pending": max_pending}}


def test_each_tasks_first_batch_joins_as_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """Group mode's case: a stream of 30 models split by a hash of the id over 4 tasks,
    each task's batch of 150 records; every task's first batch brings all its models.
    With the shortcut no batch goes record by record; without, each first one does."""
    cfg = from_dict({"segments": {"slices": [["country"]]}})
    tasks: list[list[Raw]] = [[] for _ in range(4)]
    for i in range(1200):
        pid = f"r{i}"
        pred = {"id": pid, "model": f"m{i % 30}", "ts": T0 + i, "prob": (i % 97) / 97,
                "segment": {"country": f"c{i % 11}"}}
        part = tasks[zlib.crc32(pid.encode()) % 4]
        part.append(Raw(Kind.PREDICTION, json.dumps(pred).encode()))
        part.append(Raw(Kind.LABEL, json.dumps({"id": pid, "label": i % 3 % 2}).encode()))
    for part in tasks:
        fast, slow = both(monkeypatch, cfg, [part[i:i + 150] for i in range(0, len(part), 150)])
        assert fast == [0]
        assert slow == [1]


def test_a_new_model_meeting_another_class_count_goes_record_by_record(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A new model whose first batch also holds predictions of another class count, or
    an old model's prediction of another count beside a new model: record by record,
    as before (the other count is rejected or resets the model, prediction by
    prediction), and the same either way."""
    def pred(i: int, model: str, shape: str) -> Raw:
        obj = {"id": f"r{i}", "model": model, "ts": T0 + 60 * i, **score_fields(shape, i)}
        return Raw(Kind.PREDICTION, json.dumps(obj).encode())

    def lab(i: int) -> Raw:
        return Raw(Kind.LABEL, json.dumps({"id": f"r{i}", "label": i % 2}).encode())

    first = [pred(0, "n", "b"), lab(0), pred(1, "n", "mc"), pred(2, "n", "b"), lab(2)]
    second = [pred(3, "n", "mc"), pred(4, "o", "b"), lab(4), lab(3)]
    fast, slow = both(monkeypatch, config(), [first, second])
    assert fast == slow == [2]
