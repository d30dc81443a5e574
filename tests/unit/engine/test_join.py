"""The join: either arrival order, TTLs on event time, capacity, implicit
negatives, duplicates, labels out of range, late labels."""

from __future__ import annotations

import random
import tracemalloc
from typing import Any

import numpy as np

from calmon.config import from_dict
from calmon.engine.engine import Engine, Rejected
from calmon.engine.records import Kind
from calmon.engine.rows import Snapshot as View
from calmon.engine.snapshot import full_snapshot
from calmon.io.totals import ProcessTotals
from tests.oracle import T0, L, P, binary_terms, expected_row

H = 3600.0


class CountingEngine(Engine):
    """An engine whose feeds' deltas are added up, as the daemon's process counters are."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.process = ProcessTotals()

    def feed(self, *args: Any, **kwargs: Any) -> list[Rejected]:
        out = super().feed(*args, **kwargs)
        self.process.add(self.last_delta)
        return out


def engine(**sections: Any) -> CountingEngine:
    return CountingEngine(from_dict(sections))


def samples(view: View, model: str = "m", segment: str = "__all__") -> dict[str, int]:
    out = {"1h": 0, "24h": 0, "7d": 0}
    for r in view.rows:
        if r.model == model and r.segment == segment:
            out[r.window] = r.stats.samples
    return out


def rows_key(view: View) -> list[tuple]:
    """Every row with every number, bins included, for exact comparison."""
    return [(r.model, r.segment, r.window, tuple(r.stats.as_row().values()),
             tuple(r.estimates.as_row().values()),
             r.stats.bins.count.tobytes(), r.stats.bins.conf.tobytes(),
             r.stats.bins.correct.tobytes()) for r in view.rows]


# ---------------------------------------------------------------- arrival order


def _records(n: int, rng: random.Random):
    preds, labels = [], []
    for i in range(n):
        ts = T0 + rng.uniform(0, 1500)
        if i % 3 == 0:
            preds.append(P(f"id{i}", ts, "bin", prob=rng.random()))
            labels.append(L(f"id{i}", rng.randint(0, 1), ts + rng.uniform(0, 60)))
        elif i % 3 == 1:
            preds.append(P(f"id{i}", ts, "bin", logit=rng.gauss(0, 2)))
            labels.append(L(f"id{i}", rng.randint(0, 1), ts + rng.uniform(0, 60)))
        else:
            w = [rng.random() for _ in range(3)]
            preds.append(P(f"id{i}", ts, "mc", probs=[x / sum(w) for x in w],
                           segment={"country": rng.choice("AB")}))
            labels.append(L(f"id{i}", rng.randint(0, 2), ts + rng.uniform(0, 60)))
    return preds, labels


def test_label_first_and_prediction_first_give_the_same_view() -> None:
    rng = random.Random(1)
    preds, labels = _records(600, rng)
    a = engine()
    a.feed(preds)
    a.feed(labels)
    b = engine()
    b.feed(labels)
    b.feed(preds)
    c = engine()  # per id, a coin decides which comes first; one record per batch
    for p, lab in zip(preds, labels):
        for r in ((p, lab) if rng.random() < 0.5 else (lab, p)):
            c.feed([r])
    va, vb, vc = full_snapshot(a), full_snapshot(b), full_snapshot(c)
    assert va.counters["joined"] == 600
    assert va.counters == vb.counters == vc.counters
    assert rows_key(va) == rows_key(vb) == rows_key(vc)
    assert samples(va, "bin") == {"1h": 400, "24h": 400, "7d": 400}
    assert va.pending == vb.pending == vc.pending == 0
    assert va.pending_labels == vb.pending_labels == vc.pending_labels == 0


# ---------------------------------------------------------------- TTLs


def test_prediction_ttl_expires_on_event_time() -> None:
    e = engine(join={"ttl": "1h"})
    e.feed([P("a", T0, prob=0.3), P("b", T0 + 10, prob=0.3)])
    e.feed([P("x", T0 + H - 1, prob=0.5)])  # now = T0 + 3599: a still waits
    v = full_snapshot(e)
    assert (v.counters["expired"], v.pending) == (0, 3)
    e.feed([P("y", T0 + H, prob=0.5)])  # now = a's deadline: a expires, b does not
    v = full_snapshot(e)
    assert (v.counters["expired"], v.pending) == (1, 3)
    assert e.process.expired == {("m", "ttl"): 1}
    e.feed([L("a", 1), L("b", 0)])  # too late for a; b still joins
    v = full_snapshot(e)
    assert v.counters["joined"] == 1
    # b's bucket [T0, T0 + 225) has just left the 1h window (now = T0 + 3600)
    assert samples(v) == {"1h": 0, "24h": 1, "7d": 1}
    assert v.pending_labels == 1  # a's label now waits for a prediction that is gone


def test_expiry_is_exact_within_one_batch() -> None:
    """The deadline is checked at the lookup, not only by the end-of-batch sweep."""
    e = engine(join={"ttl": "1h"})
    e.feed([P("a", T0, prob=0.3), P("y", T0 + H, prob=0.5), L("a", 1)])
    v = full_snapshot(e)
    assert (v.counters["joined"], v.counters["expired"]) == (0, 1)


def test_label_ttl() -> None:
    e = engine(join={"label_ttl": "1h"})
    e.feed([L("early", 1, T0), L("ok", 0, T0 + 100)])
    assert full_snapshot(e).pending_labels == 2
    e.feed([P("other", T0 + H, prob=0.5)])  # now reaches early's deadline
    v = full_snapshot(e)
    assert v.pending_labels == 1
    assert v.counters["labels_expired"] == 1
    assert e.process.labels_expired == 1
    e.feed([P("early", T0 + H, prob=0.2), P("ok", T0 + H, prob=0.2)])
    v = full_snapshot(e)
    assert v.counters["joined"] == 1  # only "ok": "early"'s label had expired
    assert v.pending == 2  # "other" and "early"


def test_label_without_ts_waits_label_ttl_from_now() -> None:
    e = engine(join={"label_ttl": "1h"})
    e.feed([P("z", T0, prob=0.5), L("a", 1)])  # no ts: the clock is now = T0
    e.feed([P("z2", T0 + H - 1, prob=0.5)])
    assert full_snapshot(e).pending_labels == 1
    e.feed([P("z3", T0 + H, prob=0.5)])
    assert full_snapshot(e).pending_labels == 0


# ---------------------------------------------------------------- capacity


def _no_label_batches(start: int, stop: int, batch: int = 500):
    for s in range(start, stop, batch):
        yield [P(f"id-{i}", T0 + i * 0.01, prob=0.25) for i in range(s, min(stop, s + batch))]


def test_capacity_expires_oldest_and_bounds_memory() -> None:
    max_pending = 1000
    tracemalloc.start()
    try:
        e = engine(join={"max_pending": max_pending})
        for b in _no_label_batches(0, 2000):  # warm up: pending full, arrays grown
            e.feed(b)
            assert e.join.pending <= max_pending
        base = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        for b in _no_label_batches(2000, 20_000):  # 10x more ids than fit
            e.feed(b)
            assert e.join.pending <= max_pending
        current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # 18,000 more ids, each >= 100 bytes if kept: retained growth stays far below
    assert current - base < 64 * 1024, current - base
    assert peak - base < 1024 * 1024, peak - base
    v = full_snapshot(e)
    assert v.counters["expired"] == 20_000 - max_pending
    assert e.process.expired == {("m", "capacity"): 20_000 - max_pending}
    assert v.pending == max_pending
    # the oldest went first: the newest 1000 ids still join
    e.feed([L(f"id-{i}", 1) for i in range(19_000, 20_000)] + [L("id-18999", 1)])
    v = full_snapshot(e)
    assert v.counters["joined"] == max_pending
    assert v.pending == 0
    assert v.pending_labels == 1  # id-18999 was expired: its label waits in vain


# ---------------------------------------------------------------- implicit negatives


def test_implicit_negatives_hold_everything_until_ts_plus_after() -> None:
    e = engine(join={"missing_label": {"value": 0, "after": "30m"}})
    rng = np.random.default_rng(5)
    p = rng.random(100)
    positives = {i for i in range(100) if rng.random() < 0.3}
    e.feed([P(f"p{i}", T0 + i, prob=float(p[i])) for i in range(100)])
    e.feed([L(f"p{i}", 1, T0 + i + 5) for i in sorted(positives)])  # positives arrive early
    v = full_snapshot(e)
    assert samples(v) == {"1h": 0, "24h": 0, "7d": 0}
    assert v.counters["joined"] == 0 and v.pending == 100

    e.feed([P("adv1", T0 + 49 + 1800 - 0.5, prob=0.5)])  # just before p49's ts + 30m
    assert full_snapshot(e).counters["joined"] == 49
    e.feed([P("adv2", T0 + 49 + 1800, prob=0.5)])  # p0..p49 are final now
    v = full_snapshot(e)
    assert v.counters["joined"] == 50
    y = np.array([1 if i in positives else 0 for i in range(50)])
    row = {r.window: r.stats for r in v.rows if r.segment == "__all__"}["24h"]
    exp = expected_row(binary_terms(p[:50], y), 15, 1000)
    assert row.samples == 50
    for name in ("ece", "brier", "nll", "observed_rate", "mean_confidence"):
        assert abs(getattr(row, name) - exp[name]) <= 1e-9, name

    e.feed([P("adv3", T0 + 99 + 1800, prob=0.5)])
    v = full_snapshot(e)
    assert v.counters["joined"] == 100  # p0..p99; adv1..adv3 wait for their own 30m
    assert v.pending == 3
    row = {r.window: r.stats for r in v.rows if r.segment == "__all__"}["24h"]
    assert row.samples == 100
    assert abs(row.observed_rate - len(positives) / 100) <= 1e-12
    # a label for a finalised prediction is a duplicate: it joined (as a negative)
    e.feed([L("p0", 1)])
    assert full_snapshot(e).counters["duplicates"] == 1
    assert full_snapshot(e).counters["expired"] == 0


def test_implicit_negatives_apply_to_binary_only() -> None:
    e = engine(join={"missing_label": {"value": 0, "after": "30m"}})
    e.feed([P("k", T0, "mc", probs=[0.2, 0.8]), L("k", 1), P("u", T0, "mc", probs=[0.6, 0.4])])
    assert samples(full_snapshot(e), "mc")["1h"] == 1  # multiclass joins at once
    e.feed([P("later", T0 + H, "mc", probs=[0.5, 0.5])])
    v = full_snapshot(e)
    assert v.counters["joined"] == 1  # u is not given an implicit label
    assert v.pending == 2 and v.counters["expired"] == 0


# ---------------------------------------------------------------- duplicates


def test_duplicates_are_counted_and_ignored() -> None:
    e = engine()
    e.feed([P("d", T0, prob=0.9), P("d", T0 + 1, prob=0.1)])  # second: pending id
    v = full_snapshot(e)
    assert (v.counters["duplicates"], v.pending, v.counters["predictions"]) == (1, 1, 2)
    e.feed([L("d", 1)])
    before = full_snapshot(e)
    assert before.counters["joined"] == 1
    # the first prediction's score joined: mean confidence 0.9
    st = {r.window: r.stats for r in before.rows}["1h"]
    assert abs(st.mean_confidence - 0.9) < 1e-9
    e.feed([L("d", 0)])  # second label for a joined id
    e.feed([P("d", T0 + 2, prob=0.5)])  # a prediction for an id already joined
    after = full_snapshot(e)
    assert after.counters["duplicates"] == 3
    assert after.counters["joined"] == 1
    assert e.process.duplicates == {"predictions": 2, "labels": 1}
    assert rows_key(after) == rows_key(before)


def test_second_waiting_label_is_a_duplicate() -> None:
    e = engine()
    e.feed([L("w", 1, T0), L("w", 0, T0)])
    e.feed([P("w", T0, prob=0.7)])
    v = full_snapshot(e)
    assert v.counters["duplicates"] == 1
    st = {r.window: r.stats for r in v.rows}["1h"]
    assert st.samples == 1 and st.observed_rate == 1.0  # the first label won


def test_second_label_while_held_for_implicit_negatives_is_a_duplicate() -> None:
    e = engine(join={"missing_label": {"value": 0, "after": "30m"}})
    e.feed([P("h", T0, prob=0.7), L("h", 1), L("h", 0)])
    e.feed([P("adv", T0 + 1800, prob=0.5)])
    v = full_snapshot(e)
    assert v.counters["duplicates"] == 1
    st = {r.window: r.stats for r in v.rows}["1h"]
    assert st.samples == 1 and st.observed_rate == 1.0


# ---------------------------------------------------------------- labels out of range


def _out_of_range(label_first: bool, score: dict, bad: int, good: int) -> None:
    e = engine()
    pred, lab = P("r", T0, **score), L("r", bad, T0 + 1)
    rejected = []
    for rec in ((lab, pred) if label_first else (pred, lab)):
        rejected += e.feed([rec])
    assert [(r.kind, r.reason, r.value) for r in rejected] == [
        (Kind.LABEL, "label_out_of_range", lab.value)]
    v = full_snapshot(e)
    assert v.counters["invalid"] == 1
    assert e.process.invalid == {("labels", "label_out_of_range"): 1}
    assert v.counters["joined"] == 0 and v.pending == 1 and v.pending_labels == 0
    assert v.counters["labels"] == 0  # an invalid label is not a label
    assert e.feed([L("r", good)]) == []  # a valid label still joins
    v = full_snapshot(e)
    assert v.counters["joined"] == 1 and v.counters["duplicates"] == 0
    assert v.counters["labels"] == 1


def test_label_out_of_range_binary_both_orders() -> None:
    for first in (False, True):
        _out_of_range(first, {"prob": 0.4}, 2, 1)
        _out_of_range(first, {"logit": -1.0}, 7, 0)


def test_label_out_of_range_multiclass_both_orders() -> None:
    for first in (False, True):
        _out_of_range(first, {"probs": [0.2, 0.3, 0.5]}, 5, 2)
        _out_of_range(first, {"logits": [0.2, 0.3, 0.5]}, 3, 0)


# ---------------------------------------------------------------- late labels


def test_late_label_lands_in_its_predictions_bucket() -> None:
    e = engine()
    e.feed([P("old", T0, prob=0.8)])
    e.feed([P("now", T0 + 20 * H, prob=0.1)])
    e.feed([L("old", 1, T0 + 20 * H)])  # 20 hours late
    v = full_snapshot(e)
    # bucket of T0: outside the 1h window at now = T0 + 20h, inside 24h and 7d
    assert samples(v) == {"1h": 0, "24h": 1, "7d": 1}
    st = {r.window: r.stats for r in v.rows}["24h"]
    assert abs(st.mean_confidence - 0.8) < 1e-9
    # 24h buckets are 5400 s wide and T0 is a multiple: the bucket of T0 leaves
    # the 24h window exactly when now reaches T0 + 16 * 5400 = T0 + 24h
    e.feed([P("n2", T0 + 24 * H - 1, prob=0.1)])
    assert samples(full_snapshot(e)) == {"1h": 0, "24h": 1, "7d": 1}
    e.feed([P("n3", T0 + 24 * H, prob=0.1)])
    assert samples(full_snapshot(e)) == {"1h": 0, "24h": 0, "7d": 1}
