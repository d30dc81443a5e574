"""Event time per model (contract v3 §2): no record of one model moves another's
windows, finalises its implicit negatives, expires its predictions, or evicts them
for capacity. Expected numbers are counted by hand from the input, not by the engine."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from calmon.config import from_dict
from calmon.engine.engine import Engine
from calmon.engine.rows import Snapshot as View
from calmon.engine.snapshot import full_snapshot
from tests.oracle import T0, L, P

H = 3600.0


def rows(view: View, model: str) -> dict[str, Any]:
    return {r.window: r.stats for r in view.rows if r.model == model and r.segment == "__all__"}


def feed(e: Engine, batch: list[Any], size: int) -> None:
    for i in range(0, len(batch), size):
        assert e.feed(batch[i:i + size]) == []


@pytest.mark.parametrize("size", [1, 7, 5000])  # one by one, small batches, the columns
def test_a_future_record_of_one_model_leaves_another_models_windows(size: int) -> None:
    rng = np.random.default_rng(3)
    p = rng.uniform(0.05, 0.95, 1000)
    y = (rng.uniform(size=1000) < p).astype(int)
    e = Engine(from_dict({}))
    batch = [P(f"a{i}", T0 + i, "good", prob=float(p[i])) for i in range(1000)]
    batch += [L(f"a{i}", int(y[i])) for i in range(1000)]
    feed(e, batch, size)
    before = rows(full_snapshot(e), "good")
    assert before["1h"].samples == 1000
    # a made-up model, 59 minutes ahead (within kafka.max_clock_skew)
    feed(e, [P("x", T0 + 1000 + 59 * 60, "made-up", prob=0.5)], size)
    after = rows(full_snapshot(e), "good")
    assert after["1h"].samples == 1000
    assert after["1h"].ece == pytest.approx(before["1h"].ece, abs=0)
    # the plain-numpy ECE of the same samples, 15 right-closed bins
    b = np.clip(np.ceil(p * 15).astype(int) - 1, 0, 14)
    ece = sum(abs(p[b == k].mean() - y[b == k].mean()) * (b == k).sum() / 1000
              for k in range(15) if (b == k).any())
    assert after["1h"].ece == pytest.approx(ece, abs=1e-9)
    assert e.now == T0 + 1000 + 59 * 60  # the instance's clock did move
    assert e.now_of("good") == T0 + 999


@pytest.mark.parametrize("size", [1, 5000])
def test_a_future_record_does_not_finalise_another_models_implicit_negatives(size: int) -> None:
    e = Engine(from_dict({"join": {"missing_label": {"value": 0, "after": "30m"}}}))
    feed(e, [P(f"a{i}", T0 + i, "good", prob=0.3) for i in range(1000)], size)
    feed(e, [P("x", T0 + 1000 + 59 * 60, "made-up", prob=0.5)], size)
    assert rows(full_snapshot(e), "good")["1h"].samples == 0  # nothing finalised early
    assert e.counters["joined"] == 0
    # the real labels arrive: 1,000 positives, none discarded as duplicates
    feed(e, [L(f"a{i}", 1) for i in range(1000)], size)
    assert e.counters["duplicates"] == 0
    feed(e, [P("later", T0 + 1000 + 31 * 60, "good", prob=0.3)], size)  # good's own now
    v = full_snapshot(e)
    good = rows(v, "good")["1h"]
    assert good.samples == 1000 and good.observed_rate == 1.0
    assert e.counters["joined"] == 1000


def test_a_future_record_does_not_expire_another_models_predictions() -> None:
    e = Engine(from_dict({"join": {"ttl": "1h"}}))
    e.feed([P(f"a{i}", T0 + i, "good", prob=0.4) for i in range(100)])
    e.feed([P("x", T0 + 100 + 3599, "made-up", prob=0.5)])
    assert e.counters["expired"] == 0 and e.join.pending == 101
    e.feed([L(f"a{i}", 1) for i in range(100)])
    assert e.counters["joined"] == 100
    e.feed([P("y", T0 + 100 + 3600, "good", prob=0.5)])  # good's own clock expires by ttl
    assert e.counters["expired"] == 0  # nothing of good's was left to expire


@pytest.mark.parametrize(("size", "flooded"), [(1, 4000), (500, 20_000), (5000, 20_000)])
def test_a_flood_from_one_model_leaves_another_models_joins_exact(size: int,
                                                                   flooded: int) -> None:
    # one record a feed costs ~1.4 ms of fixed work: 4x max_pending floods as surely there
    e = Engine(from_dict({"join": {"max_pending": 1000}}))
    quiet = [P(f"q{i}", T0 + i, "quiet", prob=0.2) for i in range(500)]
    flood = [P(f"s{i}", T0 + 500 + i, "spam", prob=0.9) for i in range(flooded)]
    labels = [L(f"q{i}", i % 2) for i in range(500)]
    feed(e, quiet + flood + labels, size)
    v = full_snapshot(e)
    assert rows(v, "quiet")["1h"].samples == 500  # 500 of 500 joined
    assert e.last_delta is not None
    assert e.join.pending == 500  # what is left: spam's newest, within its share
    assert e.counters["expired"] == flooded - 500  # all of them spam's


def test_a_model_under_its_share_is_not_evicted_but_the_largest_is() -> None:
    e = Engine(from_dict({"join": {"max_pending": 10}}))
    e.feed([P("a0", T0, "a", prob=0.5), P("a1", T0 + 1, "a", prob=0.5)]
           + [P(f"b{i}", T0 + 2 + i, "b", prob=0.5) for i in range(9)])
    # 11 pending past 10: b (9) is the largest: its oldest goes, not a's older ones
    e.feed([L("a0", 1), L("a1", 0), L("b0", 1), L("b1", 1)])
    assert e.counters["joined"] == 3  # a0, a1 and b1; b0 was evicted
    assert e.counters["expired"] == 1


def test_per_model_now_survives_a_snapshot() -> None:
    e = Engine(from_dict({}))
    e.feed([P("a", T0, "good", prob=0.5), L("a", 1), P("x", T0 + 3500, "made-up", prob=0.5)])
    snap = e.snapshot()
    f = Engine(from_dict({}))
    f.restore(snap)
    assert f.now_of("good") == T0 and f.now_of("made-up") == T0 + 3500
    assert rows(full_snapshot(f), "good")["1h"].samples == 1
    old = dict(snap)
    del old["model_now"]  # a checkpoint from before v3: one "now" for all
    g = Engine(from_dict({}))
    g.restore(old)
    assert g.now_of("good") == T0  # its latest prediction, kept in the refit buffer
    assert g.now_of("made-up") == T0 + 3500  # pending


DAY = 86400.0


def test_model_names_rotating_through_max_models_are_all_admitted() -> None:
    """200 model names, a new one every 6 hours of event time for 50 days (a version in
    each name), through max_models: 100: every name is admitted, since a name idle for
    longer than its largest window (7d) + join.ttl (7d) is dropped and frees its slot."""
    e = Engine(from_dict({"limits": {"max_models": 100}}))
    for k in range(200):
        t = T0 + k * DAY / 4
        batch = [P(f"m{k}-{i}", t + i, f"ctr-v{k}", prob=0.25) for i in range(5)]
        batch += [L(f"m{k}-{i}", i % 2) for i in range(4)]  # the fifth never gets one
        assert e.feed(batch) == []  # nothing rejected: no too_many_models
    assert e.counters["invalid"] == 0 and e.counters["joined"] == 200 * 4
    live = [m for m in e.models if m]
    # the names of the last 14 days (56) plus those not yet past it at the last batch
    assert 56 <= len(live) <= 58
    assert set(live) == {f"ctr-v{k}" for k in range(200 - len(live), 200)}  # the newest
    assert len(e.models) <= 100  # slots reused, not appended
    assert len(e.index.series) <= 100 and e.index.held == len(live)
    # the dropped models' pending predictions went with them, counted as expired by ttl
    assert e.counters["expired"] == 200 - len(live)
    assert e.join.pending == len(live)
    assert {r.model for r in full_snapshot(e).rows} <= set(live)


def test_a_dropped_models_slot_survives_a_snapshot_and_its_name_comes_back_fresh() -> None:
    e = Engine(from_dict({"limits": {"max_models": 2}}))
    e.feed([P("a", T0, "old", prob=0.5), L("a", 1), P("b", T0, "keep", prob=0.5), L("b", 0)])
    e.feed([P("c", T0 + 15 * DAY, "keep", prob=0.5)])  # "old" is 15 days behind: dropped
    assert e.models.count("") == 1
    f = Engine(from_dict({"limits": {"max_models": 2}}))
    f.restore(e.snapshot())
    for eng in (e, f):
        assert eng.feed([P("d", T0 + 15 * DAY, "new", prob=0.9), L("d", 1)]) == []
        assert eng.feed([P("e", T0 + 15 * DAY, "old", prob=0.9)])[0].reason == "too_many_models"
    assert e.snapshot()["models"] == f.snapshot()["models"]
    assert (rows(full_snapshot(e), "new")["7d"].samples
            == rows(full_snapshot(f), "new")["7d"].samples == 1)
    assert "old" not in {r.model for r in full_snapshot(f).rows}


def test_max_series_folds_new_segments_into_other_and_counts_them() -> None:
    cfg = {"limits": {"max_series": 5}, "segments": {"slices": [["country"]]}}
    e = Engine(from_dict(cfg))
    countries = "ABCDEFGHIJ"
    folded = 0
    for i, c in enumerate(countries):
        e.feed([P(f"p{i}", T0 + i, "m", prob=0.5, segment={"country": c}), L(f"p{i}", 1)])
        folded += e.last_delta.series_folded
    # __all__ and country=A..D fill the 5; E..J fold into country=__other__ (made anyway)
    segments = {r.segment: r.stats.samples for r in full_snapshot(e).rows if r.window == "1h"}
    assert segments == {"__all__": 10, "country=A": 1, "country=B": 1, "country=C": 1,
                        "country=D": 1, "country=__other__": 6}
    assert folded == 6 and full_snapshot(e).series_held == 6
    f = Engine(from_dict(cfg))
    f.restore(e.snapshot())
    f.feed([P("again", T0 + 20, "m", prob=0.5, segment={"country": "E"}), L("again", 0)])
    segments = {r.segment: r.stats.samples for r in full_snapshot(f).rows if r.window == "1h"}
    assert segments["country=__other__"] == 7 and "country=E" not in segments


def test_an_idle_segment_frees_its_series_for_a_new_one() -> None:
    """max_series: 3 holds __all__ and two countries; once country=A has had no
    prediction for longer than 7d + 7d while its model lives on, its series (and its
    pending prediction) go, and a new country takes the freed slot instead of folding."""
    cfg = {"limits": {"max_series": 3}, "segments": {"slices": [["country"]]}}
    e = Engine(from_dict(cfg))
    e.feed([P("a", T0, "m", prob=0.5, segment={"country": "A"}), L("a", 1),
            P("a2", T0, "m", prob=0.5, segment={"country": "A"}),  # stays pending
            P("b", T0, "m", prob=0.5, segment={"country": "B"}), L("b", 1)])
    for day in range(1, 16):  # country B, daily
        e.feed([P(f"b{day}", T0 + day * DAY, "m", prob=0.5, segment={"country": "B"}),
                L(f"b{day}", 0)])
    assert e.index.find("m", "country=A") is None  # dropped after 14 days idle
    assert e.counters["expired"] == 1  # a2 went with it
    e.feed([P("c", T0 + 15 * DAY, "m", prob=0.5, segment={"country": "C"}), L("c", 1)])
    segments = {r.segment: r.stats.samples for r in full_snapshot(e).rows if r.window == "7d"}
    assert segments == {"__all__": 8, "country=B": 7, "country=C": 1}
    assert full_snapshot(e).series_held == 3 and e.last_delta.series_folded == 0
    f = Engine(from_dict(cfg))
    f.restore(e.snapshot())
    assert f.index.series == e.index.series and list(f._combo_last) == list(e._combo_last)
