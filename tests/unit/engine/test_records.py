"""Record parsing: every reason code, timestamps, field paths, and property tests
that no input makes the parser or the engine raise."""

from __future__ import annotations

import json
import math
from datetime import datetime

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from calmon.config import FieldsConfig, LimitsConfig, ModelConfig, from_dict
from calmon.engine.decisions import ClassNames
from calmon.engine.engine import Engine
from calmon.engine.records import REASONS, Kind, Label, Parser, Prediction, Raw, Reject
from calmon.engine.snapshot import full_snapshot
from tests.oracle import T0, L, P, label_bytes

MAX_BYTES = 1000
LIMITS = LimitsConfig(max_models=3, max_classes=50, max_id_bytes=32, max_name_bytes=16)
PARSER = Parser(FieldsConfig(), MAX_BYTES, LIMITS, max_clock_skew=3600.0)

PROPS = settings(max_examples=200, deadline=None, database=None,
                 suppress_health_check=[HealthCheck.too_slow])


def pred(**obj) -> bytes:
    return json.dumps({"id": "a", "model": "m", "ts": T0, "prob": 0.5, **obj}).encode()


def pred_without(*keys: str, **obj) -> bytes:
    full = {"id": "a", "model": "m", "ts": T0, "prob": 0.5, **obj}
    return json.dumps({k: v for k, v in full.items() if k not in keys}).encode()


# (expected reason, kind, value, broker timestamp)
PARSER_CASES: list[tuple[str, Kind, bytes | None, float | None]] = [
    ("oversize", Kind.PREDICTION, pred(pad="x" * MAX_BYTES), None),
    ("oversize", Kind.LABEL, b'{"id":"a","label":1,"x":"' + b"y" * MAX_BYTES + b'"}', None),
    ("empty", Kind.PREDICTION, b"", None),
    ("empty", Kind.LABEL, None, None),  # a tombstone
    ("not_utf8", Kind.PREDICTION, b'{"id": "\xff\xfe", "model": "m"}', None),
    ("not_utf8", Kind.LABEL, b"\x80abc", None),
    ("not_json", Kind.PREDICTION, b'{"id": "a", ', None),
    ("not_json", Kind.LABEL, b"label=1", None),
    ("not_object", Kind.PREDICTION, b"[1, 2]", None),
    ("not_object", Kind.LABEL, b'"a"', None),
    ("not_object", Kind.LABEL, b"null", None),
    ("missing_id", Kind.PREDICTION, pred_without("id"), None),
    ("missing_id", Kind.LABEL, b'{"label": 1}', None),
    ("missing_id", Kind.PREDICTION, pred(id=None), None),
    ("bad_id", Kind.PREDICTION, pred(id=1.5), None),
    ("bad_id", Kind.PREDICTION, pred(id=""), None),
    ("bad_id", Kind.LABEL, b'{"id": true, "label": 1}', None),
    ("bad_id", Kind.LABEL, b'{"id": ["a"], "label": 1}', None),
    ("missing_model", Kind.PREDICTION, pred_without("model"), None),
    ("bad_model", Kind.PREDICTION, pred(model=3), None),
    ("bad_model", Kind.PREDICTION, pred(model=""), None),
    ("missing_ts", Kind.PREDICTION, pred_without("ts"), None),
    ("bad_ts", Kind.PREDICTION, pred(ts="yesterday"), None),
    ("bad_ts", Kind.PREDICTION, pred(ts=True), None),
    ("bad_ts", Kind.PREDICTION, pred(ts=[1]), None),
    ("bad_ts", Kind.PREDICTION, b'{"id":"a","model":"m","ts":NaN,"prob":0.5}', None),
    ("bad_ts", Kind.PREDICTION, b'{"id":"a","model":"m","ts":Infinity,"prob":0.5}', None),
    ("bad_ts", Kind.LABEL, b'{"id":"a","label":1,"ts":"2025-13-45"}', None),
    ("no_score", Kind.PREDICTION, pred_without("prob"), None),
    ("no_score", Kind.PREDICTION, pred(prob=None), None),
    ("multiple_scores", Kind.PREDICTION, pred(logit=0.3), None),
    ("multiple_scores", Kind.PREDICTION, pred_without("prob", probs=[0.5, 0.5],
                                                      logits=[0, 1]), None),
    ("bad_score", Kind.PREDICTION, pred(prob="0.5"), None),
    ("bad_score", Kind.PREDICTION, pred(prob=True), None),
    ("bad_score", Kind.PREDICTION, pred_without("prob", probs=[1.0]), None),
    ("bad_score", Kind.PREDICTION, pred_without("prob", probs=0.5), None),
    ("bad_score", Kind.PREDICTION, pred_without("prob", logits=[1, "2"]), None),
    ("bad_score", Kind.PREDICTION, pred_without("prob", logits=[[1], [2]]), None),
    ("not_finite", Kind.PREDICTION, b'{"id":"a","model":"m","ts":1,"prob":NaN}', None),
    ("not_finite", Kind.PREDICTION, b'{"id":"a","model":"m","ts":1,"logit":Infinity}', None),
    ("not_finite", Kind.PREDICTION, b'{"id":"a","model":"m","ts":1,"logits":[0,-Infinity]}',
     None),
    ("not_finite", Kind.PREDICTION, b'{"id":"a","model":"m","ts":1,"probs":[NaN,0.5]}', None),
    ("prob_out_of_range", Kind.PREDICTION, pred(prob=1.5), None),
    ("prob_out_of_range", Kind.PREDICTION, pred(prob=-0.01), None),
    ("prob_out_of_range", Kind.PREDICTION, pred_without("prob", probs=[1.2, -0.2]), None),
    ("probs_not_normalized", Kind.PREDICTION, pred_without("prob", probs=[0.5, 0.6]), None),
    ("probs_not_normalized", Kind.PREDICTION, pred_without("prob", probs=[0.2, 0.3, 0.4]),
     None),
    ("probs_not_normalized", Kind.PREDICTION, pred_without("prob", probs=[0.5, 0.502]), None),
    ("bad_segment", Kind.PREDICTION, pred(segment="US"), None),
    ("bad_segment", Kind.PREDICTION, pred(segment={"country": ["US"]}), None),
    ("bad_segment", Kind.PREDICTION, pred(segment={"country": {"iso": "US"}}), None),
    ("missing_label", Kind.LABEL, b'{"id": "a"}', None),
    ("missing_label", Kind.LABEL, b'{"id": "a", "label": null}', None),
    ("bad_label", Kind.LABEL, b'{"id": "a", "label": {"name": "x"}}', None),
    # v5: a string is a class name; one no model can list is out of range on arrival
    ("label_out_of_range", Kind.LABEL, b'{"id": "a", "label": ""}', None),
    ("bad_label", Kind.LABEL, b'{"id": "a", "label": 0.5}', None),
    ("bad_label", Kind.LABEL, b'{"id": "a", "label": NaN}', None),
    ("bad_label", Kind.LABEL, b'{"id": "a", "label": [1]}', None),
    ("label_out_of_range", Kind.LABEL, b'{"id": "a", "label": -1}', None),
    # v2: names and ids bounded in bytes, no control characters, no lone surrogates
    ("bad_id", Kind.PREDICTION, pred(id="i" * 33), None),
    ("bad_id", Kind.LABEL, json.dumps({"id": "é" * 17, "label": 1}).encode(), None),
    ("bad_id", Kind.PREDICTION, pred(id=10**32), None),  # 33 digits
    ("bad_model", Kind.PREDICTION, pred(model="m" * 17), None),
    ("bad_model", Kind.PREDICTION, pred(model="ü" * 9), None),  # 18 bytes in UTF-8
    ("bad_model", Kind.PREDICTION, pred(model="m\nINFO forged"), None),
    ("bad_model", Kind.PREDICTION, pred(model="m\u2028x"), None),
    ("bad_model", Kind.PREDICTION, pred(model="\x7f"), None),
    ("bad_segment", Kind.PREDICTION, pred(segment={"country": "U\rS"}), None),
    ("bad_segment", Kind.PREDICTION, pred(segment={"country": "x" * 17}), None),
    ("bad_segment", Kind.PREDICTION, pred(segment={"country": 10**400}), None),
    ("not_utf8", Kind.PREDICTION, b'{"id":"a","model":"\\udc00","ts":1,"prob":0.5}', None),
    ("not_utf8", Kind.LABEL, b'{"id":"a","label":1,"model":"\\ud800"}', None),
    ("not_utf8", Kind.PREDICTION, b'{"id":"a","model":"m","ts":1,"prob":NaN,'
                                  b'"segment":{"\\udfff":"x"}}', None),
    ("too_many_classes", Kind.PREDICTION, pred_without("prob", probs=[0] * 50 + [1]), None),
    # a ts past the record's Kafka time + max_clock_skew would move "now" for everyone
    ("bad_ts", Kind.PREDICTION, pred(ts=253402300799), T0),
    ("bad_ts", Kind.PREDICTION, pred(ts=T0 + 3601), T0),
    ("bad_ts", Kind.LABEL, json.dumps({"id": "a", "label": 1, "ts": T0 + 7200}).encode(), T0),
    # numbers too large for a float are not finite, never an exception
    ("not_finite", Kind.PREDICTION, b'{"id":"a","model":"m","ts":1,"prob":1' + b"0" * 400 + b"}",
     None),
    ("not_finite", Kind.PREDICTION,
     b'{"id":"a","model":"m","ts":1,"logits":[1,2' + b"0" * 400 + b"]}", None),
    ("bad_ts", Kind.PREDICTION, b'{"id":"a","model":"m","ts":1' + b"0" * 400 + b',"prob":0.5}',
     None),
    ("probs_not_normalized", Kind.PREDICTION,
     b'{"id":"a","model":"m","ts":1,"probs":[1e308,1e308]}', None),
]


@pytest.mark.parametrize(("reason", "kind", "value", "broker_ts"), PARSER_CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(PARSER_CASES)])
def test_parser_reason(reason: str, kind: Kind, value: bytes | None,
                       broker_ts: float | None) -> None:
    assert reason in REASONS
    assert PARSER.parse(Raw(kind, value, broker_ts)) == Reject(reason)


def test_deeply_nested_json_is_not_json() -> None:
    deep = b"[" * 100_000 + b"]" * 100_000
    big = Parser(FieldsConfig(), 10**6)
    assert big.parse(Raw(Kind.PREDICTION, deep)) == Reject("not_json")
    nested = b'{"id": "a", "label": ' + b"[" * 50_000 + b"]" * 50_000 + b"}"
    assert big.parse(Raw(Kind.LABEL, nested)) == Reject("not_json")


def engine_reasons() -> dict[str, list[tuple[Kind, str]]]:
    """Reasons only the engine can decide: they need an earlier record."""
    out: dict[str, list[tuple[Kind, str]]] = {}
    e = Engine(from_dict({"limits": {"max_models": 3}}))
    rej = e.feed([P("b1", T0, "bin", prob=0.5), L("b1", 2, T0),  # binary: 0/1 only
                  P("k1", T0, "k3", probs=[0.2, 0.3, 0.5]), L("k1", 3, T0),
                  # ten predictions each in the longest window make bin and k3 live
                  *[P(f"b{i}", T0, "bin", prob=0.5) for i in range(2, 11)],
                  *[P(f"k{i}", T0, "k3", probs=[0.2, 0.3, 0.5]) for i in range(2, 11)],
                  P("x1", T0, "bin", probs=[0.5, 0.5]),  # bin is binary
                  P("x2", T0, "k3", probs=[0.5, 0.5]),  # k3 has 3 classes
                  P("x3", T0, "k3", logit=1.0),
                  P("m3", T0, "third", prob=0.5),
                  P("m4", T0, "fourth", prob=0.5),  # past limits.max_models
                  L("m5", 1, T0, model="fifth")])  # a label never creates a model
    for r in rej:
        out.setdefault(r.reason, []).append((r.kind, r.value))
    assert e.models == ["bin", "k3", "third"]
    return out


def test_engine_reasons() -> None:
    got = engine_reasons()
    assert {k: [kind for kind, _ in v] for k, v in got.items()} == {
        "label_out_of_range": [Kind.LABEL, Kind.LABEL],
        "classes_mismatch": [Kind.PREDICTION] * 3,
        "too_many_models": [Kind.PREDICTION],
    }


def test_a_huge_class_count_costs_nothing() -> None:
    big = Parser(FieldsConfig(), 10**7, LimitsConfig(max_classes=1000))
    value = pred_without("prob", logits=[0] * 200_000)
    assert big.parse(Raw(Kind.PREDICTION, value)) == Reject("too_many_classes")


def test_a_bug_while_scoring_a_joined_sample_is_isolated_to_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import calmon.engine.counting as engine_module  # where joined samples are scored

    real = engine_module.sigmoid

    def flaky(x: np.ndarray) -> np.ndarray:
        if np.any(np.asarray(x) == 7.0):
            raise RuntimeError("a bug")
        return real(x)

    monkeypatch.setattr(engine_module, "sigmoid", flaky)
    e = Engine(from_dict({}))
    rej = e.feed([P("a", T0, "m", logit=0.5), P("boom", T0, "m", logit=7.0),
                  P("c", T0, "m", logit=-1.0), L("a", 1, T0), L("boom", 1, T0), L("c", 0, T0)])
    assert rej == []
    st = e.status()["counters"]
    # the two others are counted; the one the bug hits is counted as internal
    assert (st["predictions"], st["joined"], st["invalid"]) == (3, 2, 1)
    assert {r.stats.samples for r in full_snapshot(e).rows if r.segment == "__all__"} == {2}


def test_a_bug_in_the_join_is_raised_for_the_daemon_to_isolate(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # the daemon rolls back to its checkpoint and finds the record one by one
    # (tests/unit/test_daemon_inprocess.py); the engine must not swallow it
    e = Engine(from_dict({}))

    def boom(*args: object) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(e.join, "run", boom)
    with pytest.raises(RuntimeError):
        e.feed([P("a", T0, "m", prob=0.5)])


def test_class_count_resets_only_while_the_model_is_not_live() -> None:
    e = Engine(from_dict({}))
    # one early 7-class record does not lock the model in
    assert e.feed([P("odd", T0, "m", probs=[1 / 7] * 7), L("odd", 3, T0)]) == []
    assert e.feed([P("a", T0 + 1, "m", prob=0.9), L("a", 1, T0 + 1)]) == []
    st = e.status()["counters"]
    assert (st["class_resets"], st["joined"]) == (1, 2)
    # what the model kept under 7 classes is forgotten: one binary sample in its windows
    assert {r.stats.samples for r in full_snapshot(e).rows if r.segment == "__all__"} == {1}
    # ten admitted binary predictions in the longest window make it live: K is fixed now
    e.feed([P(f"b{i}", T0 + 2, "m", prob=0.5) for i in range(9)])
    rej = e.feed([P("c", T0 + 3, "m", probs=[0.5, 0.5])])
    assert [r.reason for r in rej] == ["classes_mismatch"]
    # until the window slides past them (the longest default window is 7d)
    rej = e.feed([P("d", T0 + 8 * 86400, "m", probs=[0.5, 0.5])])
    assert rej == [] and e.status()["counters"]["class_resets"] == 2


def test_a_class_reset_forgets_the_same_whichever_topic_came_first() -> None:
    """The label of a binary prediction read before or after the reset that makes its
    model 3-class: counted as joined both ways, in no window either way."""
    f1, f2 = P("f1", T0, "m", prob=0.7), P("f2", T0 + 1, "m", probs=[0.2, 0.3, 0.5])
    y1 = L("f1", 1, T0 + 2)
    outcomes = []
    for batches in ([[f1], [y1], [f2]], [[f1], [f2], [y1]], [[f1, y1, f2]], [[f1, f2, y1]]):
        e = Engine(from_dict({}))
        for batch in batches:
            e.feed(batch)
        outcomes.append((e.status()["counters"], sorted(
            (r.model, r.segment, r.window, r.stats.samples) for r in full_snapshot(e).rows)))
    assert all(o == outcomes[0] for o in outcomes[1:]), outcomes
    assert outcomes[0][0]["joined"] == 1 and outcomes[0][0]["class_resets"] == 1


# v5: the model's own decision at fields.decision, names from models.<m>.classes
DECIDING = Parser(FieldsConfig(decision="d"), MAX_BYTES, LIMITS,
                  names=ClassNames({"k": ModelConfig(("x", "y", "z"))}))
DECISIONS = [  # (score, decision, the class decided or a reason)
    ({"prob": 0.2}, 1, 1), ({"prob": 0.2}, True, 1), ({"logit": 3.0}, False, 0),
    ({"prob": 0.2}, None, -1), ({"prob": 0.2}, 1.0, 1), ({"probs": [0.2, 0.3, 0.5]}, 0, 0),
    ({"probs": [0.2, 0.3, 0.5]}, "y", 1), ({"logits": [1, 2, 3]}, 2, 2),
    ({"prob": 0.2}, 2, "bad_decision"), ({"prob": 0.2}, -1, "bad_decision"),
    ({"prob": 0.2}, "y", "bad_decision"), ({"prob": 0.2}, 0.5, "bad_decision"),
    ({"probs": [0.2, 0.3, 0.5]}, 3, "bad_decision"),
    ({"probs": [0.2, 0.3, 0.5]}, "w", "bad_decision"),
    ({"probs": [0.2, 0.3, 0.5]}, True, "bad_decision"),
    ({"probs": [0.2, 0.3, 0.5]}, [1], "bad_decision"),
]


@pytest.mark.parametrize(("score", "decision", "want"), DECISIONS)
def test_a_decision_is_a_class_of_the_prediction(score: dict, decision: object,
                                                 want: int | str) -> None:
    model = "k" if "probs" in score or "logits" in score else "b"
    got = DECIDING.parse(P("a", T0, model, d=decision, **score))
    if isinstance(want, str):
        assert got == Reject(want)
    else:
        assert isinstance(got, Prediction) and got.decision == want
    # a model without classes knows no name
    if decision == "y":
        assert DECIDING.parse(P("a", T0, "other", d="y", **score)) == Reject("bad_decision")


def test_every_reason_is_produced() -> None:
    produced = {c[0] for c in PARSER_CASES} | set(engine_reasons())
    produced |= {w for _, _, w in DECISIONS if isinstance(w, str)}
    # internal is produced by a bug only: test_internal_error_is_isolated_to_its_record;
    # the batch reasons by the consumer, before any record is parsed (io/batch_guard.py,
    # tests/unit/io/test_batch_guard.py)
    assert produced | {"internal", "bad_batch", "batch_oversize"} == set(REASONS)


def test_engine_counts_invalid_by_topic_and_reason() -> None:
    e = Engine(from_dict({"kafka": {"max_record_bytes": MAX_BYTES, "max_clock_skew": "1h"},
                          "limits": {"max_models": 3, "max_classes": 50, "max_id_bytes": 32,
                                     "max_name_bytes": 16}}))
    raws = [Raw(kind, value, ts) for _, kind, value, ts in PARSER_CASES]
    rejected = e.feed(raws)
    assert [r.reason for r in rejected] == [c[0] for c in PARSER_CASES]
    assert [r.value for r in rejected] == [c[2] for c in PARSER_CASES]  # forwarded unchanged
    v = full_snapshot(e)
    assert v.counters["invalid"] == len(PARSER_CASES)
    assert v.counters["predictions"] == 0 and v.counters["labels"] == 0
    expected: dict[tuple[str, str], int] = {}
    for reason, kind, _, _ in PARSER_CASES:
        key = ("predictions" if kind is Kind.PREDICTION else "labels", reason)
        expected[key] = expected.get(key, 0) + 1
    assert dict(e.last_delta.invalid) == expected


# ---------------------------------------------------------------- valid records


@pytest.mark.parametrize(("ts", "expected"), [
    (T0, T0),
    (int(T0), T0),
    (T0 + 0.25, T0 + 0.25),
    ("2025-11-30T00:00:00Z", T0),
    ("2025-11-30T00:00:00+00:00", T0),
    ("2025-11-30T01:30:00+01:30", T0),
    ("2025-11-29T19:00:00-05:00", T0),
    ("2025-11-30T00:00:00.250Z", T0 + 0.25),
    ("2025-11-30T00:00:00", T0),  # naive: UTC
    ("2025-11-30 00:00:07", T0 + 7),
    (0, 0.0),
])
def test_timestamps(ts, expected: float) -> None:
    out = PARSER.parse(Raw(Kind.PREDICTION, pred(ts=ts)))
    assert isinstance(out, Prediction)
    assert out.ts == expected
    lab = PARSER.parse(Raw(Kind.LABEL, json.dumps({"id": "a", "label": 1, "ts": ts}).encode()))
    assert isinstance(lab, Label) and lab.ts == expected


def test_iso_timestamps_agree_with_datetime() -> None:
    for text in ("2024-02-29T23:59:59.999999+00:00", "1970-01-01T00:00:00Z",
                 "2030-06-15T12:00:00+09:00"):
        expected = datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
        out = PARSER.parse(Raw(Kind.PREDICTION, pred(ts=text)))
        assert isinstance(out, Prediction) and out.ts == expected


def test_kafka_timestamp_fallback() -> None:
    no_ts = pred_without("ts")
    out = PARSER.parse(Raw(Kind.PREDICTION, no_ts, 1234.5))
    assert isinstance(out, Prediction) and out.ts == 1234.5
    out = PARSER.parse(Raw(Kind.PREDICTION, pred(ts=None), 99.0))
    assert isinstance(out, Prediction) and out.ts == 99.0
    out = PARSER.parse(Raw(Kind.PREDICTION, pred(ts=T0), T0 + 1234.5))  # the record's ts wins
    assert isinstance(out, Prediction) and out.ts == T0
    lab = PARSER.parse(Raw(Kind.LABEL, b'{"id": "a", "label": 1}', 77.0))
    assert isinstance(lab, Label) and lab.ts == 77.0
    lab = PARSER.parse(Raw(Kind.LABEL, b'{"id": "a", "label": 1}'))  # optional for labels
    assert isinstance(lab, Label) and lab.ts is None


def test_scores_and_labels() -> None:
    out = PARSER.parse(Raw(Kind.PREDICTION, pred_without("prob", logit=2.0)))
    assert isinstance(out, Prediction) and out.classes == 0  # binary
    assert (out.kind, out.score) == ("logit", 2.0)
    out = PARSER.parse(Raw(Kind.PREDICTION, pred_without("prob", probs=[0.5, 0.5005])))
    assert isinstance(out, Prediction) and out.classes == 2  # within 1e-3: kept as given
    assert out.kind == "probs" and out.score.tolist() == [0.5, 0.5005]
    out = PARSER.parse(Raw(Kind.PREDICTION, pred_without("prob", logits=[1, 2, 3, 4])))
    assert isinstance(out, Prediction) and out.classes == 4
    assert out.score.dtype == np.float64 and out.score.tolist() == [1.0, 2.0, 3.0, 4.0]
    out = PARSER.parse(Raw(Kind.PREDICTION, pred(id=91, segment={
        "country": "US", "n": 3, "mobile": True, "gone": None})))
    assert isinstance(out, Prediction)
    assert out.id == "91"
    assert out.segment == {"country": "US", "n": "3", "mobile": "true"}
    for raw, expected in ((b'{"id":"a","label":true}', 1), (b'{"id":"a","label":false}', 0),
                          (b'{"id":"a","label":2}', 2), (b'{"id":"a","label":1.0}', 1)):
        lab = PARSER.parse(Raw(Kind.LABEL, raw))
        assert isinstance(lab, Label) and lab.label == expected


def test_integer_and_string_ids_join() -> None:
    e = Engine(from_dict({}))
    assert e.feed([P(91, T0, prob=0.5), L("91", 1), P("92", T0, prob=0.5), L(92, 0)]) == []
    assert full_snapshot(e).counters["joined"] == 2


@pytest.mark.parametrize("big", [10**18, 2**63, 2**64 - 1, 2**64, 2**100, -(2**100)])
def test_integer_ids_of_64_and_100_bits_join_as_their_decimal_string(big: int) -> None:
    # snowflake ids are 64-bit; orjson reads integers past 64 bits as floats, the
    # msgspec fast path reads them exactly: both must give the same decimal string
    e = Engine(from_dict({}))
    preds = [Raw(Kind.PREDICTION, json.dumps({"id": big + i, "model": "m", "ts": T0,
                                              "prob": 0.5}).encode()) for i in range(3)]
    labels = [Raw(Kind.LABEL, json.dumps({"id": str(big + i) if i % 2 else big + i,
                                          "label": 1}).encode()) for i in range(3)]
    assert e.feed(preds + labels) == []
    assert full_snapshot(e).counters["joined"] == 3
    assert e.join.pending == 0
    parsed = PARSER.parse(preds[0])
    assert isinstance(parsed, Prediction) and parsed.id == str(big)


def test_integer_ids_longer_than_max_id_bytes_digits_are_bad_ids() -> None:
    assert PARSER.parse(Raw(Kind.PREDICTION, pred(id=10**31))).id == "1" + "0" * 31
    for v in (10**32, -(10**31), 10**5000):
        value = b'{"id":' + str(v).encode() if v != 10**5000 else b'{"id":1' + b"0" * 5000
        value += b',"model":"m","ts":1764460800,"prob":0.5}'
        out = PARSER.parse(Raw(Kind.PREDICTION, value))
        assert isinstance(out, Reject) and out.reason in ("bad_id", "oversize"), v


def test_configurable_dotted_field_paths() -> None:
    cfg = from_dict({"fields": {"id": "meta.request_id", "model": "meta.model",
                                "ts": "meta.time", "segment": "ctx", "label": "outcome.y",
                                "prob": "out.p"}})
    e = Engine(cfg)
    p = json.dumps({"meta": {"request_id": "r1", "model": "ctr", "time": T0},
                    "ctx": {"country": "FR"}, "out": {"p": 0.75}}).encode()
    lab = json.dumps({"meta": {"request_id": "r1"}, "outcome": {"y": 1}}).encode()
    assert e.feed([Raw(Kind.PREDICTION, p), Raw(Kind.LABEL, lab)]) == []
    v = full_snapshot(e)
    assert v.counters["joined"] == 1
    rows = {(r.segment, r.window): r.stats for r in v.rows if r.model == "ctr"}
    assert rows[("country=FR", "1h")].samples == 1
    assert abs(rows[("__all__", "1h")].mean_confidence - 0.75) < 1e-9
    parsed = Parser(cfg.fields, 1000).parse(Raw(Kind.PREDICTION, p))
    assert isinstance(parsed, Prediction) and parsed.ts == T0
    # the default paths do not find these fields
    assert PARSER.parse(Raw(Kind.PREDICTION, p)) == Reject("missing_id")
    # a path through a non-object is simply missing
    bad = json.dumps({"meta": "r1", "out": {"p": 0.5}}).encode()
    assert Parser(cfg.fields, 1000).parse(Raw(Kind.PREDICTION, bad)) == Reject("missing_id")


# ---------------------------------------------------------------- properties

json_scalars = (st.none() | st.booleans() | st.integers() | st.floats()
                | st.text(max_size=12))
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner,
                                                                  max_size=4),
    max_leaves=12,
)
timestamps = (st.floats() | st.integers() | st.datetimes().map(lambda d: d.isoformat())
              | st.just("2025-11-30T00:00:00Z") | st.floats(T0, T0 + 86400))
plausible = {
    "id": st.sampled_from(["a", "b", "c", 1, 2]) | json_values,
    "model": st.sampled_from(["m", "n"]) | json_values,
    "ts": timestamps | json_values,
    "segment": st.dictionaries(st.sampled_from(["country", "device"]),
                               json_scalars, max_size=2) | json_values,
    "label": st.integers(-2, 12) | st.booleans() | json_values,
    "prob": st.floats(0, 1) | json_values,
    "logit": st.floats() | json_values,
    "probs": st.lists(st.floats(0, 1), min_size=0, max_size=5)
    | st.integers(2, 4).map(lambda k: [1.0 / k] * k) | json_values,
    "logits": st.lists(st.floats(), min_size=0, max_size=5) | json_values,
}
records = st.fixed_dictionaries({}, optional=plausible)


def to_bytes(obj) -> bytes:
    return json.dumps(obj).encode()  # NaN and Infinity as JSON literals


def check_result(out) -> None:
    assert type(out) in (Prediction, Label, Reject)
    if isinstance(out, Reject):
        assert out.reason in REASONS
    elif isinstance(out, Prediction):
        assert isinstance(out.id, str) and out.id
        assert math.isfinite(out.ts)
        if out.kind == "prob":
            assert 0.0 <= out.score <= 1.0
        elif out.kind == "logit":
            assert math.isfinite(out.score)
        else:
            assert len(out.score) >= 2 and np.isfinite(out.score).all()
            if out.kind == "probs":
                assert out.score.min() >= 0.0 and abs(out.score.sum() - 1.0) <= 1e-3
    else:
        assert isinstance(out.id, str) and out.id
        assert isinstance(out.label, int) and out.label >= 0


@PROPS
@given(value=json_values, kind=st.sampled_from(Kind))
@example(value=10**400, kind=Kind.PREDICTION)
@example(value={"id": "a", "model": "m", "ts": 1, "prob": 10**400}, kind=Kind.PREDICTION)
@example(value={"id": "a", "label": 10**400}, kind=Kind.LABEL)
def test_parse_never_raises_on_json(value, kind: Kind) -> None:
    check_result(PARSER.parse(Raw(kind, to_bytes(value))))


@PROPS
@given(obj=records, kind=st.sampled_from(Kind), broker_ts=st.none() | st.floats(0, 2e9))
@example(obj={"id": "a", "model": "m", "ts": 10**30, "probs": [1e308, 1e308]},
         kind=Kind.PREDICTION, broker_ts=None)
def test_parse_never_raises_on_plausible_records(obj, kind: Kind, broker_ts) -> None:
    check_result(PARSER.parse(Raw(kind, to_bytes(obj), broker_ts)))


@PROPS
@given(value=st.binary(max_size=400), kind=st.sampled_from(Kind))
def test_parse_never_raises_on_bytes(value: bytes, kind: Kind) -> None:
    check_result(PARSER.parse(Raw(kind, value)))


batches = st.lists(
    st.tuples(st.sampled_from(Kind), st.binary(max_size=80) | records.map(to_bytes)),
    max_size=20,
)


IMPLICIT = from_dict({"join": {"missing_label": {"value": 0, "after": "30m"}}})


@settings(PROPS, max_examples=120)
@given(batch_list=st.lists(batches, min_size=1, max_size=3))
def test_engine_feed_never_raises(batch_list) -> None:
    e = Engine(IMPLICIT)
    rejected = 0
    fed = 0
    for batch in batch_list:
        out = e.feed([Raw(kind, value) for kind, value in batch])
        assert all(r.reason in REASONS for r in out)
        rejected += len(out)
        fed += len(batch)
    v = full_snapshot(e)
    c = v.counters
    assert c["invalid"] == rejected
    # every record is a prediction, a label or invalid (an out-of-range label is both
    # a counted label and an invalid record)
    assert c["predictions"] + c["labels"] + c["invalid"] >= fed
    for row in v.rows:
        for name, value in row.stats.as_row().items():
            assert value is None or math.isfinite(value), name


def test_a_large_waiting_label_is_not_kept_whole() -> None:
    e = Engine(from_dict({}))
    big = label_bytes("z", 5, T0, pad="x" * 100_000)
    assert e.feed([Raw(Kind.LABEL, big)]) == []
    assert e.join._labels.get("z")[0].raw is None  # 100 KB would wait max_pending times over
    rej = e.feed([P("z", T0, "m", prob=0.5)])  # binary: label 5 is out of range
    assert [r.reason for r in rej] == ["label_out_of_range"]
    assert json.loads(rej[0].value) == {"id": "z", "label": 5, "ts": T0}


def test_event_times_past_the_ceiling_are_bad_ts() -> None:
    e = Engine(from_dict({}))
    forged = Raw(Kind.PREDICTION, pred_without("ts"), 253402300799.0)  # Kafka time forged
    rej = e.feed([P("a", T0, "m", prob=0.5), forged, P("b", T0 + 9e6, "m", prob=0.5)],
                 not_after=T0 + 3600)
    assert [r.reason for r in rej] == ["bad_ts", "bad_ts"]
    assert e.now == T0  # "now" did not move


def test_a_label_ahead_of_its_prediction_in_one_batch_counts_under_its_model() -> None:
    """Partitions come in any order within a poll: a label read before its prediction in
    the same batch is that prediction's model's (calmon_labels_total{model}); a label
    whose prediction has not come is the unknown model's ("")."""
    e = Engine(from_dict({}))
    labels = [Raw(Kind.LABEL, f'{{"id": "a{i}", "label": 1}}'.encode(), 1.7e9, f"l/0/{i}")
              for i in range(40)]
    orphans = [Raw(Kind.LABEL, f'{{"id": "z{i}", "label": 0}}'.encode(), 1.7e9, f"l/1/{i}")
               for i in range(3)]
    preds = [Raw(Kind.PREDICTION, f'{{"id": "a{i}", "model": "ctr", "prob": 0.3}}'.encode(),
                 1.7e9, f"p/0/{i}") for i in range(40)]
    e.feed(labels + orphans + preds)
    assert dict(e.last_delta.labels) == {"ctr": 40, "": 3}
    assert full_snapshot(e).counters["labels"] == 43 and full_snapshot(e).counters["joined"] == 40
