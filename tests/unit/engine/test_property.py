"""Property-based: whatever bytes arrive, the parser and the engine never raise,
and every record is counted exactly once, as valid or as invalid, on its topic.

Three generators: arbitrary bytes, arbitrary JSON (NaN, huge numbers, lone
surrogate escapes and deep nesting included), and near-valid records built from
the schema of CONTRACT.md §1 with one or more fields made hostile. After every
batch all readers (view, status, /metrics exposition, /reliability, snapshot and
restore) must work on the resulting state.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from datetime import UTC, datetime
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.exposition import generate_latest

from calmon.config import Config, from_dict
from calmon.engine.engine import Engine
from calmon.engine.records import REASONS, Kind, Raw
from calmon.engine.snapshot import full_snapshot
from calmon.io import reliability
from calmon.io.exporter import CalmonCollector
from calmon.io.exposition import new_registry

SETTINGS = settings(max_examples=150, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
BASE_TS = 1_764_460_800.0
TOPIC = {Kind.PREDICTION: "predictions", Kind.LABEL: "labels"}

# ------------------------------------------------------------------ generators

# every code point, lone surrogates included (json.dumps writes them as \udXXX escapes)
any_char = st.characters(codec=None, exclude_categories=())
hostile_text = st.one_of(
    st.text(any_char, max_size=20),
    st.sampled_from(["", ".", "..", "../../etc", "a/b", "\udc00", "m\udc00x", "m\nERROR forged",
                     "m\r\x1b[31m", "\x00", "m\u2028x", "CON", "~", "${HOME}", "%s%s%n"]),
    st.integers(min_value=200, max_value=5000).map(lambda n: "x" * n),  # long names
)
finite = st.floats(allow_nan=False, allow_infinity=False)
any_number = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True), st.integers(),
    st.sampled_from([10 ** 400, -(10 ** 400), 253402300799, 253402300800, 1e308, -1e308, 0,
                     -0.0, 5e-324, 2 ** 63, 2 ** 64 + 1]),
)
json_leaf = st.one_of(st.none(), st.booleans(), any_number, hostile_text)
json_value = st.recursive(
    json_leaf,
    lambda kids: st.one_of(st.lists(kids, max_size=5),
                           st.dictionaries(hostile_text, kids, max_size=5)),
    max_leaves=25,
)


def deep(n: int) -> bytes:
    return b'{"id": "d", "model": "m", "prob": 0.5, "x": ' + b"[" * n + b"]" * n + b"}"


def dumps(obj: Any) -> bytes:
    # allow_nan: NaN / Infinity tokens are what a hostile producer can write
    return json.dumps(obj, allow_nan=True).encode("utf-8", "surrogatepass")


@st.composite
def near_valid_prediction(draw: st.DrawFn) -> dict[str, Any]:
    model = draw(st.sampled_from(["ctr", "ctr-logit", "intent3", "intent4"]))
    rec: dict[str, Any] = {"id": f"p-{draw(st.integers(0, 40))}", "model": model,
                           "ts": BASE_TS + draw(st.floats(0, 3600))}
    if draw(st.booleans()):
        rec["segment"] = {"country": draw(st.sampled_from(["US", "DE"])), "device": "ios"}
    if model == "ctr":
        rec["prob"] = draw(st.floats(0, 1))
    elif model == "ctr-logit":
        rec["logit"] = draw(st.floats(-30, 30))
    else:
        k = 3 if model == "intent3" else 4
        z = draw(st.lists(st.floats(-10, 10), min_size=k, max_size=k))
        if draw(st.booleans()):
            rec["logits"] = z
        else:
            e = [math.exp(v) for v in z]
            rec["probs"] = [v / sum(e) for v in e]
    # then break some of it
    for _ in range(draw(st.integers(0, 3))):
        field = draw(st.sampled_from(["id", "model", "ts", "segment", "prob", "logit", "probs",
                                      "logits", "label", "extra", "drop"]))
        if field == "drop":
            rec.pop(draw(st.sampled_from(sorted(rec))), None)
        elif field in ("probs", "logits"):
            rec[field] = draw(st.one_of(
                st.lists(any_number, max_size=8), json_value,
                st.integers(2, 3000).map(lambda k: [1.0 / k] * k)))  # many classes
        elif field == "segment":
            rec[field] = draw(st.one_of(st.dictionaries(hostile_text, json_value, max_size=4),
                                        json_value))
        elif field == "id":
            rec[field] = draw(st.one_of(hostile_text, any_number, json_value,
                                        st.integers(300, 20_000).map(lambda n: "i" * n)))
        elif field == "ts":
            rec[field] = draw(st.one_of(any_number, hostile_text, st.sampled_from(
                ["9999-12-31T23:59:59Z", "0001-01-01T00:00:00", "2025-11-30T00:00:00+14:00",
                 "not a date", "1e309"])))
        else:
            rec[field] = draw(json_value)
    return rec


@st.composite
def near_valid_label(draw: st.DrawFn) -> dict[str, Any]:
    rec: dict[str, Any] = {"id": f"p-{draw(st.integers(0, 40))}",
                           "label": draw(st.integers(0, 3)),
                           "ts": BASE_TS + draw(st.floats(0, 7200))}
    if draw(st.booleans()):  # a label naming a model (maybe one never predicted)
        rec["model"] = draw(st.one_of(st.sampled_from(["ctr", "intent4", "ghost"]),
                                      hostile_text))
    for _ in range(draw(st.integers(0, 2))):
        field = draw(st.sampled_from(["id", "label", "ts", "drop"]))
        if field == "drop":
            rec.pop(draw(st.sampled_from(sorted(rec))), None)
        else:
            rec[field] = draw(st.one_of(json_value, any_number))
    return rec


broker_ts = st.one_of(st.none(), st.floats(BASE_TS - 1e6, BASE_TS + 1e6),
                      st.sampled_from([0.0, 253402300799.0, -1.0]))
kind = st.sampled_from([Kind.PREDICTION, Kind.LABEL])
raw_bytes = st.builds(lambda k, v, t: Raw(k, v, t, "fuzz/0/0"), kind,
                      st.one_of(st.none(), st.binary(max_size=300)), broker_ts)
raw_json = st.builds(lambda k, v, t: Raw(k, dumps(v), t, "fuzz/0/0"), kind, json_value, broker_ts)
raw_near = st.one_of(
    st.builds(lambda v, t: Raw(Kind.PREDICTION, dumps(v), t, "fuzz/0/0"),
              near_valid_prediction(), broker_ts),
    st.builds(lambda v, t: Raw(Kind.LABEL, dumps(v), t, "fuzz/0/0"), near_valid_label(),
              broker_ts),
    st.builds(lambda n: Raw(Kind.PREDICTION, deep(n), None, "fuzz/0/0"),
              st.sampled_from([100, 1000, 5000, 100_000])),
)
batches = st.lists(st.lists(st.one_of(raw_bytes, raw_json, raw_near, raw_near), max_size=25),
                   min_size=1, max_size=3)

# ------------------------------------------------------------------ the property


def small_config(**sections: Any) -> Config:
    base: dict[str, Any] = {"metrics": {"windows": ["1h", "24h"]},
                            "segments": {"slices": [["country"]], "max_values": 5},
                            "join": {"ttl": "2h", "label_ttl": "1h", "max_pending": 1000}}
    base.update(sections)
    return from_dict(base)


def check_readers(engine: Engine) -> None:
    """Everything that reads engine state answers (what /metrics, /status and
    /reliability do), and the state survives a checkpoint round trip."""
    full_snapshot(engine)
    json.dumps(engine.status(), allow_nan=True)
    registry = new_registry()
    registry.register(CalmonCollector(engine))
    text = generate_latest(registry)
    text.decode("utf-8")  # strict: what a Prometheus server parses
    code, _ctype, body = reliability.page(engine.cfg, full_snapshot(engine), None, {})
    assert code == 200
    body.decode("utf-8")
    restored = Engine(engine.cfg)
    restored.restore(engine.snapshot())
    assert restored.status()["counters"] == engine.status()["counters"]


def run_batches(engine: Engine, batches: list[list[Raw]]) -> None:
    fed: Counter[str] = Counter()
    invalid: Counter[tuple[str, str]] = Counter()  # process counters, from each feed's delta
    for batch in batches:
        before = Counter(engine.counters)
        rejected = engine.feed(batch)  # must not raise, whatever the bytes
        invalid.update(engine.last_delta.invalid)
        after = Counter(engine.counters)
        fed.update(TOPIC[r.kind] for r in batch)
        # each record once: valid (a prediction or a label, duplicates included) or invalid
        grew = {k: after[k] - before[k] for k in ("predictions", "labels", "invalid")}
        assert sum(grew.values()) == len(batch), (grew, len(batch))
        assert grew["invalid"] == len(rejected)
        assert {r.reason for r in rejected} <= set(REASONS)
        check_readers(engine)
    # ... and on the topic it came from
    invalid_by_topic: Counter[str] = Counter()
    for (topic, _reason), n in invalid.items():
        invalid_by_topic[topic] += n
    assert engine.counters["predictions"] + invalid_by_topic["predictions"] == fed["predictions"]
    assert engine.counters["labels"] + invalid_by_topic["labels"] == fed["labels"]


@SETTINGS
@given(batches)
def test_any_input_is_counted_once_and_never_raises(batches: list[list[Raw]]) -> None:
    run_batches(Engine(small_config()), batches)


@SETTINGS
@given(st.lists(st.binary(max_size=2000), min_size=1, max_size=50), kind)
def test_arbitrary_bytes_on_either_topic(values: list[bytes], k: Kind) -> None:
    run_batches(Engine(small_config()), [[Raw(k, v, None, "fuzz/0/0") for v in values]])


@SETTINGS
@given(batches)
def test_any_input_with_tight_limits(batches: list[list[Raw]]) -> None:
    """With CONTRACT v2 ``limits``: the same properties, and the maps keyed by input stay
    within them."""
    cfg = small_config(limits={"max_models": 3, "max_classes": 8, "max_id_bytes": 64,
                               "max_name_bytes": 32})
    engine = Engine(cfg)
    run_batches(engine, batches)
    assert len(engine.models) <= 3
    for name in engine.models:
        assert len(name.encode("utf-8")) <= 32
        assert name.isprintable()


def _within_ttls(rec: dict[str, Any]) -> dict[str, Any]:
    """The claim holds for records within the TTLs: a label whose own ts is a week
    older than the predictions expires or joins depending on what came first, by the
    contract's event-time TTL. So every ts that is a time (a number, or an ISO-8601
    string as Python reads it, e.g. "20300101000000000") is kept within two hours."""
    ts = rec.get("ts")
    if isinstance(ts, str):
        try:
            when = datetime.fromisoformat(ts.strip())
            ts = when.replace(tzinfo=when.tzinfo or UTC).timestamp()
        except (ValueError, OverflowError, OSError):
            return rec  # not a time: bad_ts in every order
    if isinstance(ts, int | float) and not isinstance(ts, bool) and not (
            BASE_TS <= ts <= BASE_TS + 7200):
        rec["ts"] = BASE_TS
    return rec


@st.composite
def two_interleavings(draw: st.DrawFn) -> tuple[list[Raw], list[Raw]]:
    """The same predictions and labels merged in two orders, each topic's own order
    kept: what a replay after kill -9 may see (partitions are read in another rhythm)."""
    preds = [_within_ttls(r) for r in draw(st.lists(near_valid_prediction(), min_size=1,
                                                      max_size=30))]
    labels = [_within_ttls(r) for r in draw(st.lists(near_valid_label(), max_size=30))]
    p = [Raw(Kind.PREDICTION, dumps(v), None, f"p/0/{i}") for i, v in enumerate(preds)]
    lab = [Raw(Kind.LABEL, dumps(v), None, f"l/0/{i}") for i, v in enumerate(labels)]

    def merge(choices: list[bool]) -> list[Raw]:
        out: list[Raw] = []
        i = j = 0
        for take_p in choices:
            if (take_p and i < len(p)) or j >= len(lab):
                out.append(p[i])
                i += 1
            else:
                out.append(lab[j])
                j += 1
        return out

    n = len(p) + len(lab)
    first = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    second = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    return merge(first), merge(second)


def outcome(records: list[Raw], batch: int) -> dict[str, Any]:
    engine = Engine(small_config(join={"ttl": "7d", "label_ttl": "7d", "max_pending": 1000}))
    invalid: Counter[tuple[str, str]] = Counter()
    for i in range(0, len(records), batch):
        engine.feed(records[i:i + batch])
        invalid.update(engine.last_delta.invalid)
    view = full_snapshot(engine)
    rows = sorted((r.model, r.segment, r.window, r.stats.samples, r.stats.ece) for r in view.rows)
    st_ = engine.status()
    return {"counters": st_["counters"], "pending": st_["pending"],
            "pending_labels": st_["pending_labels"], "rows": rows,
            "invalid": sorted(invalid.items())}


def _flip_example() -> tuple[list[Raw], list[Raw]]:
    """A binary model, then a 3-class record of it: whether its first label is read
    before or after that record must not decide between classes_mismatch and a reset."""
    f1 = Raw(Kind.PREDICTION, dumps({"id": "f1", "model": "flip", "ts": BASE_TS,
                                     "prob": 0.7}), None, "p/0/0")
    f2 = Raw(Kind.PREDICTION, dumps({"id": "f2", "model": "flip", "ts": BASE_TS + 1,
                                     "probs": [0.2, 0.3, 0.5]}), None, "p/0/1")
    y1 = Raw(Kind.LABEL, dumps({"id": "f1", "label": 1, "ts": BASE_TS + 2}), None, "l/0/0")
    return [f1, y1, f2], [f1, f2, y1]


@SETTINGS
@given(two_interleavings(), st.integers(1, 8), st.integers(1, 8))
def test_the_order_across_topics_does_not_change_the_outcome(
        orders: tuple[list[Raw], list[Raw]], batch_a: int, batch_b: int) -> None:
    """README: the state after any interleaving of the same input is the same, the basis
    of exactly-once restarts. Counters, pending counts, per-reason invalid counts and
    window sample counts must agree for two interleavings and batchings."""
    first, second = orders
    assert outcome(first, batch_a) == outcome(second, batch_b)


def test_a_class_reset_does_not_depend_on_which_topic_was_read_first() -> None:
    """The same records, the label of f1 read before or after the 3-class f2 (a replay
    after kill -9 may read them either way): the outcome must be the same."""
    first, second = _flip_example()
    assert outcome(first, 1) == outcome(second, 1)
