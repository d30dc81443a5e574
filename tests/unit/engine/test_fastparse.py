"""BatchParser against its reference: for any batch, any config, any limits and clock,
``BatchParser.parse(raws)`` equals ``Parsed.from_records(Parser.parse(r) for r in raws)``.

Hypothesis feeds batches mixing valid records (the fast path) with hostile ones
(arbitrary bytes, arbitrary JSON, near-valid records, multiclass rows at the
normalisation tolerance, timestamps at the clock-skew and not_after edges), under
plain and dotted field configs and tight limits. Example tests pin each known trap.
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from calmon.config import FieldsConfig, LimitsConfig, ModelConfig
from calmon.engine import fastparse
from calmon.engine.decisions import ClassNames
from calmon.engine.fastparse import BatchParser
from calmon.engine.parsed import LABEL, PRED, REJECT, Parsed
from calmon.engine.records import Kind, Parser, Raw
from tests.unit.engine.test_property import (
    any_number,
    deep,
    dumps,
    hostile_text,
    json_value,
    near_valid_label,
    near_valid_prediction,
)

SETTINGS = settings(max_examples=120, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
P, L = Kind.PREDICTION, Kind.LABEL
T0 = 1_764_460_800.0
SKEW = 3600.0

FIELD_CONFIGS = [
    FieldsConfig(),
    FieldsConfig(id="meta.id", model="meta.model", ts="meta.ts", segment="ctx",
                 prob="out.p", logit="out.z", probs="out.ps", logits="out.zs", label="y.v",
                 decision="out.d"),
    FieldsConfig(id="a.b.c", model="m", ts="when", segment="a.seg", label="a.b.l",
                 decision="a.dec"),
    FieldsConfig(id="meta", model="meta.model"),  # one path inside another: always slow
    FieldsConfig(prob="score", logit="score"),  # two fields at one path: always slow
    FieldsConfig(id="", segment="x..y", ts="."),  # empty keys
    FieldsConfig(decision="decision"),
]
LIMITS = [
    None,
    LimitsConfig(max_models=3, max_classes=8, max_id_bytes=16, max_name_bytes=8),
    LimitsConfig(max_classes=2, max_id_bytes=1, max_name_bytes=1),
    LimitsConfig(max_id_bytes=5, max_name_bytes=6),
]


DEFAULT_FIELDS = FieldsConfig()


# v5: class names of models.<m>.classes ("*" for every model, "ctr" its own)
NAMES = ClassNames({"*": ModelConfig(("a", "b", "c")), "ctr": ModelConfig(("neg", "pos"))})


def both(raws: list[Raw], fields: FieldsConfig = DEFAULT_FIELDS, max_bytes: int = 100_000,
         limits: LimitsConfig | None = None, skew: float | None = SKEW,
         not_after: float = math.inf, names: ClassNames | None = NAMES
         ) -> tuple[Parsed, Parsed, BatchParser]:
    """(fast, reference, the BatchParser) for one batch."""
    fast = BatchParser(fields, max_bytes, limits, skew, names)
    fast.not_after = not_after
    ref = Parser(fields, max_bytes, limits, skew, names)
    ref.not_after = not_after
    return fast.parse(raws), Parsed.from_records([ref.parse(r) for r in raws]), fast


def assert_same(raws: list[Raw], **kw: Any) -> BatchParser:
    got, want, fast = both(raws, **kw)
    if not got.same(want):  # say which column differs
        for f in ("kinds", "reasons", "p_id", "p_model", "p_ts", "p_segment", "p_kind",
                  "p_classes", "p_score", "p_decision", "l_id", "l_label", "l_name", "l_ts",
                  "l_model", "l_raw", "l_source"):
            assert getattr(got, f) == getattr(want, f), f
        assert got.p_vec.keys() == want.p_vec.keys()
        raise AssertionError("p_vec rows differ")
    # equal segment keys always mean equal segments
    seen: dict[Any, dict[str, str]] = {}
    for key, seg in zip(got.p_segkey, got.p_segment):
        assert seen.setdefault(key, seg) == seg
        hash(key)
    return fast


# ------------------------------------------------------------------ generators


def place(rec: dict[str, Any], fields: FieldsConfig) -> dict[str, Any]:
    """A record given by logical field names, written at the configured (dotted) paths;
    a field whose path runs into another field's value is left out."""
    out: dict[str, Any] = {}
    for name, v in rec.items():
        path = getattr(fields, name, None) or name
        parts = path.split(".") if "." in path else [path]
        node = out
        for p in parts[:-1]:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                break
        else:
            node[parts[-1]] = v
    return out


@st.composite
def valid_prediction(draw: st.DrawFn) -> dict[str, Any]:
    rec: dict[str, Any] = {
        "id": draw(st.one_of(st.text(min_size=1, max_size=12), st.integers(-10**19, 10**19))),
        "model": draw(st.sampled_from(["ctr", "cls", "m\u00e9", "a" * 9, "x\u2028"])),
    }
    if draw(st.booleans()):
        rec["ts"] = draw(st.one_of(st.floats(T0 - 10, T0 + 10), st.integers(0, 2 * 10**9),
                                   st.none()))
    if draw(st.booleans()):
        rec["segment"] = draw(st.one_of(
            st.none(),
            st.fixed_dictionaries({"country": st.sampled_from(["US", "DE", "\u00fc\u00fc"])}),
            st.dictionaries(st.text(max_size=3), st.one_of(
                st.text(max_size=10), st.none(), st.booleans(), st.integers(), st.floats()),
                max_size=3)))
    which = draw(st.sampled_from(["prob", "logit", "probs", "logits"]))
    if which == "prob":
        rec["prob"] = draw(st.one_of(st.floats(0, 1), st.sampled_from([0, 1, -0.0])))
    elif which == "logit":
        rec["logit"] = draw(st.one_of(st.floats(-50, 50), st.integers(-5, 5)))
    elif which == "logits":
        rec["logits"] = draw(st.lists(st.floats(-10, 10), min_size=2, max_size=12))
    if draw(st.booleans()):  # v5: the model's own decision, valid or not
        rec["decision"] = draw(st.one_of(st.none(), st.integers(-1, 12), st.booleans(),
                                         st.sampled_from(["neg", "pos", "a", "c", "zz", "",
                                                          1.0, 1.5, [1], "\u00e9" * 40])))
    else:
        rec["probs"] = draw(near_normalised())
    return rec


@st.composite
def near_normalised(draw: st.DrawFn) -> list[float]:
    """Probabilities summing to 1, or to just inside or outside the 1e-3 tolerance."""
    k = draw(st.integers(2, 12))
    w = draw(st.lists(st.floats(0.01, 1.0), min_size=k, max_size=k))
    total = math.fsum(w)
    off = draw(st.one_of(
        st.just(0.0),
        st.sampled_from([1e-3, -1e-3]).flatmap(
            lambda e: st.floats(-1e-12, 1e-12).map(lambda d: e + d)),
        st.floats(-2e-3, 2e-3)))
    return [x / total * (1.0 + off) for x in w]


@st.composite
def valid_label(draw: st.DrawFn) -> dict[str, Any]:
    rec: dict[str, Any] = {"id": draw(st.one_of(st.text(min_size=1, max_size=12),
                                                st.integers(0, 10**6))),
                           "label": draw(st.one_of(st.integers(0, 9), st.booleans(),
                                                   st.sampled_from([1.0, -1, 2**63, 2**64]),
                                                   # v5: class names, listed or not
                                                   st.sampled_from(["neg", "b", "zz", "",
                                                                    "\u00e9" * 40, "x\n"])))}
    if draw(st.booleans()):
        rec["ts"] = draw(st.one_of(st.floats(T0 - 10, T0 + 10), st.none()))
    if draw(st.booleans()):
        rec["model"] = draw(st.one_of(st.sampled_from(["ctr", "", "a" * 9]), hostile_text))
    return rec


def stamp_near(ts: Any) -> st.SearchStrategy[float | None]:
    """Kafka times putting ``ts`` just inside or outside the clock-skew bound."""
    if not isinstance(ts, float):
        return st.one_of(st.none(), st.floats(T0 - 10, T0 + 10))
    return st.one_of(st.none(), st.sampled_from([ts - SKEW, ts - SKEW - 1e-6, ts - SKEW + 1e-6,
                                                  ts, math.nan, math.inf]),
                     st.floats(T0 - 2 * SKEW, T0 + 10))


@st.composite
def record(draw: st.DrawFn, fields: FieldsConfig) -> Raw:
    choice = draw(st.integers(0, 9))
    if choice == 0:
        return Raw(draw(st.sampled_from([P, L])), draw(st.one_of(st.none(), st.binary(
            max_size=60))), draw(st.one_of(st.none(), st.floats(T0 - 10, T0 + 10))), "b/0/0")
    if choice == 1:
        return Raw(draw(st.sampled_from([P, L])), dumps(draw(json_value)), None, "j/0/0")
    if choice == 2:
        rec = draw(near_valid_prediction())
        return Raw(P, dumps(place(rec, fields)), draw(stamp_near(rec.get("ts"))), "n/0/0")
    if choice == 3:
        rec = draw(near_valid_label())
        return Raw(L, dumps(place(rec, fields)), draw(stamp_near(rec.get("ts"))), "n/1/0")
    if choice == 4:  # a valid record with one field replaced by anything
        rec = draw(st.one_of(valid_prediction(), valid_label()))
        rec[draw(st.sampled_from(sorted(rec)))] = draw(st.one_of(json_value, any_number))
        kind = L if "label" in rec else P
        return Raw(kind, dumps(place(rec, fields)), draw(stamp_near(rec.get("ts"))), "h/0/0")
    if choice == 5:  # a record of the other topic
        rec = draw(valid_prediction())
        return Raw(L, dumps(place(rec, fields)), None, "x/0/0")
    rec = draw(st.one_of(valid_prediction(), valid_label()))
    kind = L if "label" in rec else P
    text = dumps(place(rec, fields))
    if draw(st.integers(0, 9)) == 0:  # the same record spelled with spaces or padding
        text = json.dumps(json.loads(text), indent=1).encode() + b" \n"
    return Raw(kind, text, draw(stamp_near(rec.get("ts"))), f"v/0/{choice}")


@st.composite
def setup(draw: st.DrawFn) -> dict[str, Any]:
    fields = draw(st.sampled_from(FIELD_CONFIGS))
    raws = draw(st.lists(record(fields), max_size=30))
    return {"raws": raws, "fields": fields, "limits": draw(st.sampled_from(LIMITS)),
            "max_bytes": draw(st.sampled_from([100_000, 120, 60])),
            "skew": draw(st.sampled_from([SKEW, None, 0.5])),
            "names": draw(st.sampled_from([NAMES, None])),
            "not_after": draw(st.one_of(st.just(math.inf), st.floats(T0 - 5, T0 + 5)))}


# ------------------------------------------------------------------ properties


@SETTINGS
@given(setup())
def test_same_as_parser_on_mixed_batches(case: dict[str, Any]) -> None:
    assert_same(**case)


@SETTINGS
@given(st.lists(st.binary(max_size=200), max_size=20), st.sampled_from([P, L]))
def test_same_as_parser_on_arbitrary_bytes(values: list[bytes], kind: Kind) -> None:
    assert_same([Raw(kind, v, None, "") for v in values])


@SETTINGS
@given(st.lists(st.one_of(valid_prediction(), valid_label()), min_size=1, max_size=30),
       st.sampled_from(FIELD_CONFIGS[:3]))
def test_same_as_parser_on_valid_batches(recs: list[dict[str, Any]],
                                         fields: FieldsConfig) -> None:
    raws = [Raw(L if "label" in r else P, dumps(place(r, fields)), T0, "") for r in recs]
    assert_same(raws, fields=fields)


@SETTINGS
@given(st.lists(near_normalised(), min_size=1, max_size=30), st.booleans())
def test_multiclass_at_the_tolerance(rows: list[list[float]], as_logits: bool) -> None:
    key = "logits" if as_logits else "probs"
    raws = [Raw(P, json.dumps({"id": str(i), "model": "m", "ts": T0, key: r}).encode(), None, "")
            for i, r in enumerate(rows)]
    assert_same(raws)


# ------------------------------------------------------------------ examples


def pred(**obj: Any) -> bytes:
    return json.dumps({"id": "a", "model": "m", "ts": T0, "prob": 0.5, **obj}).encode()


def pred_without(*keys: str) -> bytes:
    full = {"id": "a", "model": "m", "ts": T0, "prob": 0.5}
    return json.dumps({k: v for k, v in full.items() if k not in keys}).encode()


def lab(**obj: Any) -> bytes:
    return json.dumps({"id": "a", "label": 1, "ts": T0, **obj}).encode()


EXAMPLES: list[tuple[str, Kind, bytes | None, float | None]] = [
    ("nan", P, b'{"id":"a","model":"m","ts":1,"prob":NaN}', None),
    ("nan elsewhere", P, b'{"id":"a","model":"m","ts":1,"prob":0.5,"x":NaN}', None),
    ("infinity", P, b'{"id":"a","model":"m","ts":1,"logit":-Infinity}', None),
    ("1e400", P, b'{"id":"a","model":"m","ts":1,"logit":1e400}', None),
    ("1e400 elsewhere", P, b'{"id":"a","model":"m","ts":1,"logit":1,"x":1e400}', None),
    ("1e400 elsewhere, int segment", P,
     b'{"id":"a","model":"m","ts":1,"logit":1,"x":1e400,"segment":{"a":123456789012345678901}}',
     None),
    ("huge int id", P, pred(id=10**30), None),
    ("int id at the edge", P, pred(id=10**18 - 1), None),
    ("int id over the edge", P, pred(id=10**18), None),
    ("u64 id", P, pred(id=2**64 - 1), None),
    ("id past u64", P, pred(id=2**64), None),
    ("100-bit id", P, pred(id=2**100), None),
    ("negative 100-bit id", P, pred(id=-(2**100)), None),
    ("256-digit id", P, pred(id=10**255), None),
    ("257-digit id", P, pred(id=10**256), None),
    ("5000-digit id", P, b'{"id":1' + b"0" * 5000 + b',"model":"m","ts":1,"prob":0.5}', None),
    ("100-bit label id", L, lab(id=2**100), None),
    ("huge int ts", P, pred(ts=10**400), None),
    ("int ts", P, pred(ts=1_764_460_800), None),
    ("huge int prob", P, pred(prob=10**30), None),
    ("huge int label", L, lab(label=10**30), None),
    ("u64 label", L, lab(label=2**64 - 1), None),
    ("bool id", P, pred(id=True), None),
    ("bool prob", P, pred(prob=True), None),
    ("bool logits", P, pred(prob=None, logits=[True, 0.0]), None),
    ("prob 1", P, pred(prob=1), None),
    ("prob 0", P, pred(prob=0), None),
    ("prob -0.0", P, pred(prob=-0.0), None),
    ("label 1.0", L, lab(label=1.0), None),
    ("label true", L, lab(label=True), None),
    ("label false", L, lab(label=False), None),
    ("label -1", L, lab(label=-1), None),
    ("duplicate keys", P, b'{"id":"a","id":"b","model":"m","model":"n","ts":1,"prob":0.1,'
                          b'"prob":0.2}', None),
    ("duplicate key, then null", P, b'{"id":"a","model":"m","ts":1,"prob":0.1,"prob":null}',
     None),
    ("duplicate segment", P, b'{"id":"a","model":"m","ts":1,"prob":0.1,"segment":{"a":"x"},'
                             b'"segment":{"a":"y","a":"z"}}', None),
    ("lone surrogate", P, pred(model="m\udc00"), None),
    ("lone surrogate elsewhere", P, pred(x="\udc00"), None),
    ("lone surrogate in a key", P, pred(**{"\udc00": 1}), None),
    ("surrogate pair", P, pred(model="m\U0001f600"), None),
    ("not utf-8 elsewhere", P, b'{"id":"a","model":"m","ts":1,"prob":0.5,"x":"\xff"}', None),
    ("not utf-8 key", P, b'{"id":"a","model":"m","ts":1,"prob":0.5,"\xc3":1}', None),
    ("utf-8", P, pred(model="mod\u00e8le", segment={"c": "\u00fc"}), None),
    ("value None", P, None, None),
    ("value empty", L, b"", None),
    ("ts missing, Kafka time", P, pred_without("ts"), T0),
    ("ts missing, no Kafka time", P, pred_without("ts"), None),
    ("ts null, Kafka time", P, pred(ts=None), T0),
    ("label ts missing", L, json.dumps({"id": "a", "label": 0}).encode(), None),
    ("label ts missing, Kafka time", L, json.dumps({"id": "a", "label": 0}).encode(), T0),
    ("ts one skew after Kafka time", P, pred(ts=T0 + SKEW), T0),
    ("ts just past skew", P, pred(ts=T0 + SKEW + 1e-6), T0),
    ("ts iso", P, pred(ts="2025-11-30T00:00:00Z"), None),
    ("Kafka time NaN", P, pred_without("ts"), math.nan),
    ("Kafka time NaN, ts", P, pred(), math.nan),
    ("deep", P, deep(5000), None),
    ("deep 990", P, deep(990), None),
    ("not an object", P, b"[1,2]", None),
    ("control char model", P, pred(model="m\nx"), None),
    ("C1 control segment", P, pred(segment={"c": "\x85"}), None),
    ("long model", P, pred(model="m" * 200), None),
    ("long utf-8 model", P, pred(model="\u00e9" * 40), None),
    ("long utf-8 id", P, pred(id="\u00e9" * 100), None),
    ("long id", P, pred(id="i" * 300), None),
    ("empty id", P, pred(id=""), None),
    ("empty model", P, pred(model=""), None),
    ("two scores", P, pred(logit=0.1), None),
    ("no score", P, pred(prob=None), None),
    ("probs", P, pred(prob=None, probs=[0.25, 0.75]), None),
    ("probs ints", P, pred(prob=None, probs=[0, 1]), None),
    ("probs one class", P, pred(prob=None, probs=[1.0]), None),
    ("probs negative", P, pred(prob=None, probs=[-0.1, 1.1]), None),
    ("probs off", P, pred(prob=None, probs=[0.3, 0.6]), None),
    ("probs huge", P, pred(prob=None, probs=[1e308, 1e308]), None),
    ("logits 1001 classes", P, pred(prob=None, logits=[0.0] * 1001), None),
    ("logits huge int", P, pred(prob=None, logits=[2**70, 0]), None),
    ("logit huge", P, pred(prob=None, logit=1e300), None),
    ("segment list", P, pred(segment=[1]), None),
    ("segment mixed values", P, pred(segment={"a": 1, "b": True, "c": None, "d": "x"}), None),
    ("segment float value", P, pred(segment={"a": 1.5}), None),
    ("segment nested", P, pred(segment={"a": {"b": 1}}), None),
    ("segment null", P, pred(segment=None), None),
    ("segment string", P, pred(segment="US"), None),
    ("label model hint bad", L, lab(model="m\x1b[31m"), None),
    ("label model hint int", L, lab(model=5), None),
    ("label model hint empty", L, lab(model=""), None),
    ("label big raw", L, lab(pad="x" * 5000), None),
    ("oversize", P, pred(pad="x" * 200_000), None),
    ("trailing garbage", P, pred() + b" x", None),
    ("bom", P, b"\xef\xbb\xbf" + pred(), None),
]


@pytest.mark.parametrize(("name", "kind", "value", "stamp"), EXAMPLES, ids=[e[0] for e in EXAMPLES])
def test_examples(name: str, kind: Kind, value: bytes | None, stamp: float | None) -> None:
    raw = Raw(kind, value, stamp, "t/0/1")
    good = Raw(P, pred(id="g"), None, "t/0/0")
    assert_same([raw])
    assert_same([good, raw, good, raw])
    assert_same([good, raw], not_after=T0 - 1)


def test_dotted_paths_and_missing_parents() -> None:
    fields = FIELD_CONFIGS[1]
    ok = {"meta": {"id": "a", "model": "m", "ts": T0}, "out": {"p": 0.5}, "ctx": {"c": "US"}}
    recs = [ok, {**ok, "meta": None}, {**ok, "meta": 5}, {**ok, "out": {"p": 0.5, "z": 1.0}},
            {**ok, "out": None}, {**ok, "out": {"zs": [1, 2, 3]}}, {**ok, "ctx": None},
            {**ok, "meta": {"id": 7, "model": "m"}}, {**ok, "meta.id": "flat"}]
    raws = [Raw(P, json.dumps(r).encode(), T0, "") for r in recs]
    raws.append(Raw(L, json.dumps({"meta": {"id": "a"}, "y": {"v": 1}}).encode(), None, ""))
    raws.append(Raw(L, json.dumps({"meta": {"id": "a"}, "y": None}).encode(), None, ""))
    fast = assert_same(raws, fields=fields)
    assert fast.slow_calls < len(raws)


def test_clashing_paths_take_the_slow_path() -> None:
    for fields in FIELD_CONFIGS[3:5]:
        raws = [Raw(P, pred(), None, ""), Raw(P, json.dumps({"id": "a", "meta": {"model": "m"},
                                                             "score": 0.5, "ts": T0}).encode(),
                                              None, "")]
        fast = assert_same(raws, fields=fields)
        assert fast.slow_calls == len(raws)


def test_empty_batch() -> None:
    assert len(BatchParser(FieldsConfig(), 100).parse([])) == 0


def test_order_kinds_and_ordinals_are_kept() -> None:
    raws = [Raw(P, pred(id="p0", prob=None, logits=[1.0, 2.0]), None, ""),
            Raw(P, pred(ts="2025-11-30T00:00:00Z", id="slow-valid"), None, ""),
            Raw(L, lab(label=1.0), None, "l/0/1"),  # valid, slow path
            Raw(P, b"garbage", None, ""),
            Raw(P, pred(id="p2", prob=None, probs=[0.5, 0.5]), None, ""),
            Raw(L, lab(), None, "l/0/2"),
            Raw(P, pred(id="p3", prob=None, logits=[1.0, 2.0, 3.0], ts="2025-11-30"), None, "")]
    got, want, fast = both(raws)
    assert got.same(want)
    assert got.kinds == [PRED, PRED, LABEL, REJECT, PRED, LABEL, PRED]
    assert sorted(got.p_vec) == [0, 2, 3]
    assert fast.slow_calls == 4


def test_the_fast_path_is_taken_for_valid_records(monkeypatch: pytest.MonkeyPatch) -> None:
    raws = []
    for i in range(200):
        raws.append(Raw(P, pred(id=f"r{i}", segment={"country": "US", "device": "ios"}),
                        T0 + 1, ""))
        raws.append(Raw(P, pred(id=i, prob=None, logits=[0.1 * i, 0.0, 1.0]), None, ""))
        raws.append(Raw(P, pred(id=f"q{i}", prob=None, probs=[0.2, 0.3, 0.5]), T0, ""))
        raws.append(Raw(L, lab(id=f"r{i}", model="m"), T0 + 2, f"l/0/{i}"))
        raws.append(Raw(L, lab(id=f"r{i}", label=True), None, f"l/0/{i}"))
    want = Parsed.from_records([Parser(FieldsConfig(), 100_000, None, SKEW).parse(r)
                                for r in raws])

    def refuse(self: Parser, raw: Raw) -> None:
        raise AssertionError(f"slow path taken for {raw.value!r}")

    monkeypatch.setattr(Parser, "parse", refuse)
    fast = BatchParser(FieldsConfig(), 100_000, None, SKEW)
    got = fast.parse(raws)
    assert fast.slow_calls == 0
    assert got.same(want)
    assert fast.parse(raws).same(want)  # again, from the caches


def test_segments_equal_bytes_equal_dicts_and_the_cache_is_bounded(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fastparse, "_SEG_CACHE_CAP", 50)
    fast = BatchParser(FieldsConfig(), 100_000)
    for b in range(5):
        raws = [Raw(P, pred(id=str(i), segment={"u": f"{b}-{i}"}), None, "") for i in range(40)]
        long = {f"k{i}": "v" for i in range(200)}  # too long a spelling to cache
        raws.append(Raw(P, pred(segment=long), None, ""))
        raws.append(Raw(P, pred(segment={"u": "0-0"}), None, ""))
        got = fast.parse(raws)
        assert got.p_segment[-1] == {"u": "0-0"}
        assert len(fast._segments) <= 50
        assert all(len(k) <= fastparse._SEG_CACHE_BYTES for k in fast._segments)
    assert fast.slow_calls == 0


def test_model_names_cache_is_bounded() -> None:
    fast = BatchParser(FieldsConfig(), 100_000)
    for b in range(3):
        raws = [Raw(P, pred(model=f"m{b}-{i}"), None, "") for i in range(600)]
        _, want, _ = both(raws)
        assert fast.parse(raws).same(want)
    assert len(fast._names) <= 1024


def test_rows_are_own_arrays() -> None:
    raws = [Raw(P, pred(id=str(i), prob=None, logits=[float(i), 1.0]), None, "")
            for i in range(3)]
    got = BatchParser(FieldsConfig(), 100_000).parse(raws)
    for v in got.p_vec.values():
        assert v.base is None and v.dtype == np.float64 and v.flags.c_contiguous


def test_not_after_is_read_per_batch() -> None:
    fast = BatchParser(FieldsConfig(), 100_000, None, SKEW)
    raws = [Raw(P, pred(), None, ""), Raw(P, pred_without("ts"), T0, "")]
    assert fast.parse(raws).kinds == [PRED, PRED]
    fast.not_after = T0 - 1
    assert fast.parse(raws).reasons == ["bad_ts", "bad_ts"]
