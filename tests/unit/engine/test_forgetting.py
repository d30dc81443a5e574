"""Issue 35 point 1, the mechanism: the engine tells every reader what it forgot (a
model dropped as idle, a class count reset), and the statistics refresher forgets it
at once; one series whose statistics raise is counted and skipped, the others go on.
Expected numbers are counted from the records sent, never by calmon."""

from __future__ import annotations

from typing import Any

import pytest

from calmon.config import from_dict
from calmon.engine import snapshot as snapshot_mod
from calmon.engine.engine import Engine
from calmon.engine.forgotten import DROPPED, RESET
from calmon.engine.snapshot import Refresher
from tests.oracle import T0, L, P

DAY = 86400.0


def _rows(r: Refresher, model: str) -> dict[str, Any]:
    return {x.window: x for x in r.latest.rows if x.model == model and x.segment == "__all__"}


def test_the_engine_tells_each_reader_what_it_dropped_and_reset() -> None:
    e = Engine(from_dict({}))
    first, late = e.class_counts.forgotten.cursor(), e.class_counts.forgotten.cursor()
    assert first.take() is None  # a reader's first look: it syncs with the engine
    e.feed([P("a", T0, "old", prob=0.5), P("b", T0, "flip", prob=0.5), L("b", 1)])
    e.feed([P("c", T0 + 2 * DAY, "flip", probs=[0.2, 0.3, 0.5])])  # not live: a reset
    e.feed([P("d", T0 + 15 * DAY, "keep", prob=0.5)])  # "old" and "flip" are idle
    assert first.take() == [("flip", RESET), ("old", DROPPED)]
    assert first.take() == []
    assert late.take() is None
    f = Engine(from_dict({}))
    mine = f.class_counts.forgotten.cursor()
    mine.take()
    f.restore(e.snapshot())
    assert mine.take() is None  # a restored engine: every reader syncs again


def test_a_dropped_models_series_ids_carry_nothing_of_it_to_the_next_model() -> None:
    """A model dropped with unlabelled predictions; a new model takes its series ids in
    the next feed: a refresher that keeps running shows none of the old model's
    pending predictions under the new name, before its next round as after."""
    e = Engine(from_dict({"metrics": {"refresh": "1h"}}))
    clock = [0.0]
    r = Refresher(e, clock=lambda: clock[0])
    e.feed([P("a", T0, "old", prob=0.5), P("a2", T0, "old", prob=0.5),
            P("a3", T0, "old", prob=0.5), L("a", 1), P("k", T0, "keep", prob=0.5), L("k", 0)])
    r.update(full=True)
    assert _rows(r, "old")["7d"].estimates.pending_samples == 2
    e.feed([P("k2", T0 + 15 * DAY, "keep", prob=0.5), L("k2", 1)])  # "old" is dropped
    e.feed([P("n", T0 + 15 * DAY, "new", prob=0.9), L("n", 1)])  # takes its ids
    r.update()  # within metrics.refresh: no new round of estimates yet
    assert "old" not in {x.model for x in r.latest.rows}
    assert _rows(r, "new")["7d"].stats.samples == 1
    assert _rows(r, "new")["7d"].estimates.pending_samples == 0  # none of old's 2


def test_one_series_whose_statistics_raise_is_skipped_and_counted(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    e = Engine(from_dict({}))
    r = Refresher(e)
    real = snapshot_mod.plugin_stats

    def broken(vec: Any, lay: Any, binary: bool, mce_min: int) -> Any:
        if not binary:  # the multiclass model's series, say a bug in its numbers
            raise RuntimeError("a bug in one series")
        return real(vec, lay, binary, mce_min)

    monkeypatch.setattr(snapshot_mod, "plugin_stats", broken)
    e.feed([P("m", T0, "multi", probs=[0.2, 0.3, 0.5]), L("m", 2)])
    for i in range(1, 4):  # "good" keeps moving, update after update
        e.feed([P(f"g{i}", T0 + i, "good", prob=0.8), L(f"g{i}", 1)])
        r.update()
        assert _rows(r, "good")["1h"].stats.samples == i
        assert "multi" not in {x.model for x in r.latest.rows}
    assert r.latest.series_errors >= 3  # each of its windows, each update
    assert len([x for x in caplog.records if "a bug in one series" in str(x.exc_info)]) == 1
