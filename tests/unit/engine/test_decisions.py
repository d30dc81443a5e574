"""The model's own decision and class names through the engine (contract v5 §1, §2):
realized accuracy scores the decision (the prediction's, else ``p >= threshold`` or
the argmax) against numpy to 1e-9 while the calibration metrics stay those of the
probabilities; labels and decisions given as class names join as their index; a name
no model lists is ``label_out_of_range``, a bad decision ``bad_decision``, and the
valid records around them join exactly; estimates read the decided class; pending
decisions survive a checkpoint, and one written before them restores."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from calmon.config import from_dict
from calmon.engine.engine import Engine
from calmon.engine.records import Raw
from calmon.engine.rows import Row
from calmon.engine.snapshot import full_snapshot
from tests.oracle import T0, L, P, ece
from tests.unit.engine.test_estimation_maps import assert_reference, fine_sums
from tests.unit.engine.test_estmap import F

CLASSES = ["cash", "card", "prepaid_card"]


def engine_for(**over: object) -> Engine:
    cfg: dict = {"metrics": {"windows": ["1h", "24h"]}, "recalibration": {"window": "24h"},
                 "fields": {"decision": "decision"}}
    cfg.update(over)
    return Engine(from_dict(cfg))


def row(engine: Engine, model: str = "m", window: str = "24h") -> Row:
    [r] = [r for r in full_snapshot(engine).rows
           if (r.model, r.segment, r.window) == (model, "__all__", window)]
    return r


def binary_stream(rng: np.random.Generator, n: int, decide: bool = True
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[Raw]]:
    """(p, decision or -1, y, records): a prediction then its label, a third of the
    decisions away from p >= 0.5 and a fifth not given (null or absent)."""
    p = rng.uniform(0, 1, n)
    y = (rng.random(n) < p).astype(int)
    d = np.where(rng.random(n) < 0.3, p < 0.5, p >= 0.5).astype(int)
    d[rng.random(n) < 0.2] = -1
    raws = []
    for i in range(n):
        extra = {} if not decide or d[i] < 0 else {
            "decision": [int(d[i]), bool(d[i])][i % 2]}  # 0/1 and false/true
        if decide and d[i] < 0 and i % 2:
            extra = {"decision": None}
        raws.append(P(f"a{i}", T0 + i, prob=float(p[i]), **extra))
        raws.append(L(f"a{i}", int(y[i]), T0 + i + 1))
    return p, d, y, raws


def test_binary_accuracy_scores_the_decision_and_ece_the_probabilities() -> None:
    rng = np.random.default_rng(1)
    p, d, y, raws = binary_stream(rng, 3000)
    engine = engine_for()
    assert engine.feed(raws) == []
    decided = np.where(d >= 0, d, p >= 0.5)
    got = row(engine).stats
    assert got.samples == 3000
    assert got.accuracy == pytest.approx(np.mean(decided == y), abs=1e-9)
    assert got.accuracy != pytest.approx(np.mean((p >= 0.5) == y), abs=1e-3)
    assert got.ece == pytest.approx(ece(p, y), abs=1e-9)


@pytest.mark.parametrize("kind", ["prob", "logit"])
def test_a_threshold_decides_where_no_decision_is_given(kind: str) -> None:
    rng = np.random.default_rng(2)
    z = rng.normal(-1.5, 1.5, 2000)
    p = 1 / (1 + np.exp(-z))
    y = (rng.random(2000) < p).astype(int)
    raws = []
    for i in range(2000):
        raws.append(P(f"a{i}", T0 + i, **{kind: float(p[i] if kind == "prob" else z[i])}))
        raws.append(L(f"a{i}", int(y[i]), T0 + i + 1))
    engine = engine_for(models={"*": {"threshold": 0.1}})
    engine.feed(raws)
    got = row(engine).stats.accuracy
    assert got == pytest.approx(np.mean((p >= 0.1) == y), abs=1e-9)
    assert got != pytest.approx(np.mean((p >= 0.5) == y), abs=1e-3)


def multiclass_stream(rng: np.random.Generator, n: int, names: bool
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[Raw]]:
    """(probs, decision or -1, y, records) of a 3-class model; decisions off the argmax
    on a quarter, as names on every other record when ``names``; labels too."""
    probs = rng.dirichlet([1.0, 1.0, 1.0], n)
    y = np.array([rng.choice(3, p=r) for r in probs])
    d = np.where(rng.random(n) < 0.25, rng.integers(0, 3, n), probs.argmax(axis=1))
    d[rng.random(n) < 0.2] = -1
    raws = []
    for i in range(n):
        named = names and i % 2 == 0
        extra = {} if d[i] < 0 else {"decision": CLASSES[d[i]] if named else int(d[i])}
        raws.append(P(f"k{i}", T0 + i, "k", probs=probs[i].tolist(), **extra))
        raws.append(L(f"k{i}", CLASSES[y[i]] if named else int(y[i]), T0 + i + 1))
    return probs, d, y, raws


def test_multiclass_accuracy_scores_the_decision_given_by_index_or_name() -> None:
    rng = np.random.default_rng(3)
    probs, d, y, raws = multiclass_stream(rng, 2500, names=True)
    engine = engine_for(models={"k": {"classes": CLASSES}})
    assert engine.feed(raws) == []
    decided = np.where(d >= 0, d, probs.argmax(axis=1))
    got = row(engine, "k").stats
    assert got.samples == 2500
    assert got.accuracy == pytest.approx(np.mean(decided == y), abs=1e-9)
    onehot = np.eye(3)[y]
    assert got.brier == pytest.approx(np.mean(((probs - onehot) ** 2).sum(axis=1)), abs=1e-9)
    assert got.ece == pytest.approx(ece(probs.max(axis=1), probs.argmax(axis=1) == y),
                                    abs=1e-9)


@pytest.mark.parametrize("order", ["predictions_first", "labels_first", "one_by_one"])
def test_labels_given_as_names_join_as_their_index(order: str) -> None:
    """Names resolve wherever a label meets its prediction: in a batch's columns, one
    record at a time, and when the label waited for its prediction."""
    rng = np.random.default_rng(4)
    probs, _, y, raws = multiclass_stream(rng, 1500, names=True)
    preds, labels = raws[0::2], raws[1::2]
    engine = engine_for(models={"k": {"classes": CLASSES}}, fields={})
    if order == "labels_first":
        engine.feed(preds[:1])  # a prediction starts the clock; the rest come after
        engine.feed(labels)
        engine.feed(preds[1:])
    elif order == "one_by_one":
        for r in raws:
            engine.feed([r])
    else:  # the model known first, so the big batch is decided over columns
        engine.feed(raws[:2])
        engine.feed(raws[2:])
    got = row(engine, "k").stats
    assert got.samples == 1500
    assert got.accuracy == pytest.approx(np.mean(probs.argmax(axis=1) == y), abs=1e-9)
    assert got.nll == pytest.approx(np.mean(-np.log(probs[np.arange(1500), y])), abs=1e-9)


@pytest.mark.parametrize("waits", [False, True])
def test_an_unlisted_name_and_a_bad_decision_are_rejected_and_the_rest_join(waits: bool
                                                                            ) -> None:
    rng = np.random.default_rng(5)
    probs, d, y, raws = multiclass_stream(rng, 1200, names=True)
    bad = [P("x1", T0 + 5, "k", probs=[0.2, 0.3, 0.5], decision="bitcoin"),
           P("x2", T0 + 6, "k", probs=[0.2, 0.3, 0.5], decision=3),
           P("x3", T0 + 7, "k", probs=[0.2, 0.3, 0.5], decision=1.5),
           P("x4", T0 + 8, "k", probs=[0.2, 0.3, 0.5], decision=True),
           P("x5", T0 + 9, "k", probs=[0.2, 0.3, 0.5]),
           L("x5", "bitcoin", T0 + 10),  # not listed: the prediction still waits
           L("x5", "card", T0 + 11),  # and joins this one
           P("x6", T0 + 9, "other", prob=0.7),
           L("x6", "card", T0 + 10),  # a model without classes
           P("x7", T0 + 9, "other", prob=0.7, decision="yes"),
           P("x8", T0 + 9, "other", prob=0.7, decision=2)]
    if waits:  # the names wait for their predictions
        bad = [bad[5], bad[8], *bad[:5], *bad[6:8], *bad[9:]]
    engine = engine_for(models={"k": {"classes": CLASSES}})
    # both models known first: the big batch is decided over columns where it can be
    assert engine.feed([*raws[:2], P("o0", T0, "other", prob=0.5), L("o0", 1, T0)]) == []
    rejected = engine.feed(raws[2:600] + bad + raws[600:])
    reasons = sorted(r.reason for r in rejected)
    assert reasons == ["bad_decision"] * 6 + ["label_out_of_range"] * 2
    assert engine.counters["invalid"] == 8
    decided = np.where(d >= 0, d, probs.argmax(axis=1))
    got = row(engine, "k").stats
    assert got.samples == 1201  # x5 joined with "card"
    x5 = np.argmax([0.2, 0.3, 0.5]) == CLASSES.index("card")
    assert got.accuracy == pytest.approx(np.mean(np.append(decided == y, x5)), abs=1e-9)
    assert full_snapshot(engine).pending == 1  # x6 waits: its label was rejected
    assert row(engine, "other").stats.samples == 1


def test_binary_estimates_read_the_decided_side() -> None:
    rng = np.random.default_rng(6)
    p, _, y, raws = binary_stream(rng, 3000, decide=False)
    pend = rng.uniform(0, 1, 700)
    d = np.where(rng.random(700) < 0.4, pend < 0.5, pend >= 0.5).astype(int)
    praws = [P(f"b{i}", T0 + 3000 + i, prob=float(pend[i]), decision=int(d[i]))
             for i in range(700)]
    engine = engine_for(estimates={"min_samples": 1000, "samples": 50_000},
                        metrics={"windows": ["1h", "24h"], "fine_bins": F})
    engine.feed(raws + praws)
    got = row(engine).estimates
    assert got.estimate_basis == "series"
    assert_reference(got, fine_sums(p, y), pend, 1 - d)


def test_multiclass_decisions_off_the_argmax_are_estimated_on_the_decided_class() -> None:
    rng = np.random.default_rng(7)
    _probs, _, _, raws = multiclass_stream(rng, 2000, names=False)
    pend = rng.dirichlet([1.0, 1.0, 1.0], 400)
    d = np.where(rng.random(400) < 0.3, rng.integers(0, 3, 400), pend.argmax(axis=1))
    praws = [P(f"q{i}", T0 + 3000 + i, "k", probs=pend[i].tolist(), decision=int(d[i]))
             for i in range(400)]
    engine = engine_for(estimates={"min_samples": 1000, "samples": 50_000})
    engine.feed(raws + praws)
    got = row(engine, "k").estimates
    assert got.estimate_basis == "raw"
    assert got.pending_samples == 400
    assert got.estimated_accuracy == pytest.approx(
        np.mean(pend[np.arange(400), d]), abs=1e-6)  # fixed-point sums: 1e-9 a sample


def test_pending_decisions_survive_a_checkpoint_and_an_older_one_restores() -> None:
    rng = np.random.default_rng(8)
    p, d, y, raws = binary_stream(rng, 1000)
    preds, labels = raws[0::2], raws[1::2]
    engine = engine_for()
    engine.feed(preds)
    snap = engine.snapshot()
    again = engine_for()
    again.restore(copy.deepcopy(snap))
    again.feed(labels)
    decided = np.where(d >= 0, d, p >= 0.5)
    assert row(again).stats.accuracy == pytest.approx(np.mean(decided == y), abs=1e-9)
    # a checkpoint from before decisions: its pending predictions have none
    del snap["join"]["decision"]
    older = engine_for()
    older.restore(snap)
    older.feed(labels)
    assert row(older).stats.accuracy == pytest.approx(np.mean((p >= 0.5) == y), abs=1e-9)


def test_labels_waiting_by_name_survive_a_checkpoint() -> None:
    rng = np.random.default_rng(9)
    probs, d, y, raws = multiclass_stream(rng, 300, names=True)
    engine = engine_for(models={"k": {"classes": CLASSES}})
    engine.feed(raws[:2])  # the clock starts; every other label then waits, by name or index
    engine.feed(raws[3::2])
    again = engine_for(models={"k": {"classes": CLASSES}})
    again.restore(copy.deepcopy(engine.snapshot()))
    again.feed(raws[2::2])
    got = row(again, "k").stats
    assert got.samples == 300
    decided = np.where(d >= 0, d, probs.argmax(axis=1))
    assert got.accuracy == pytest.approx(np.mean(decided == y), abs=1e-9)


def test_a_binary_model_names_exactly_two_classes() -> None:
    """Binary classes are exactly [negative, positive]: a binary model configured with
    a third name joins the first two as 0 and 1 and rejects the third, as a label or a
    decision, as it would the index 2 (check-config cannot tell a binary model from
    its config; its records do)."""
    engine = engine_for(models={"m": {"classes": ["no", "yes", "maybe"]}})
    rejected = engine.feed([
        P("a", T0, prob=0.7), L("a", "yes", T0 + 1),
        P("b", T0 + 2, prob=0.7, decision="no"), L("b", "no", T0 + 3),
        P("c", T0 + 4, prob=0.2), L("c", "maybe", T0 + 5),
        P("d", T0 + 6, prob=0.7, decision="maybe"),
        P("e", T0 + 7, prob=0.7, decision=2)])
    assert sorted(r.reason for r in rejected) == (["bad_decision"] * 2
                                                  + ["label_out_of_range"])
    got = row(engine).stats
    assert got.samples == 2  # a (yes: right at 0.7) and b (decided no, was no)
    assert got.accuracy == pytest.approx(1.0, abs=1e-12)
    assert full_snapshot(engine).pending == 1  # c still waits for a valid label
