"""Event time per model (contract v3 §2): no record of one model moves another's
windows, finalises its implicit negatives, expires its predictions, or evicts them
for capacity. Expected numbers are counted by hand from the input, not by the engine."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from calmon.config import from_dict
from calmon.engine.engine import Engine, View
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
    before = rows(e.view(), "good")
    assert before["1h"].samples == 1000
    # a made-up model, 59 minutes ahead (within kafka.max_clock_skew)
    feed(e, [P("x", T0 + 1000 + 59 * 60, "made-up", prob=0.5)], size)
    after = rows(e.view(), "good")
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
    assert rows(e.view(), "good")["1h"].samples == 0  # nothing finalised early
    assert e.counters["joined"] == 0
    # the real labels arrive: 1,000 positives, none discarded as duplicates
    feed(e, [L(f"a{i}", 1) for i in range(1000)], size)
    assert e.counters["duplicates"] == 0
    feed(e, [P("later", T0 + 1000 + 31 * 60, "good", prob=0.3)], size)  # good's own now
    v = e.view()
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


@pytest.mark.parametrize("size", [1, 500, 5000])
def test_a_flood_from_one_model_leaves_another_models_joins_exact(size: int) -> None:
    e = Engine(from_dict({"join": {"max_pending": 1000}}))
    quiet = [P(f"q{i}", T0 + i, "quiet", prob=0.2) for i in range(500)]
    flood = [P(f"s{i}", T0 + 500 + i, "spam", prob=0.9) for i in range(20_000)]
    labels = [L(f"q{i}", i % 2) for i in range(500)]
    feed(e, quiet + flood + labels, size)
    v = e.view()
    assert rows(v, "quiet")["1h"].samples == 500  # 500 of 500 joined
    assert e.last_delta is not None
    assert e.join.pending == 500  # what is left: spam's newest, within its share
    assert e.counters["expired"] == 20_000 - 500  # all of them spam's


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
    assert rows(f.view(), "good")["1h"].samples == 1
    old = dict(snap)
    del old["model_now"]  # a checkpoint from before v3: every model at the one "now"
    g = Engine(from_dict({}))
    g.restore(old)
    assert g.now_of("good") == T0 + 3500
