"""RawBatch: a poll as columns. Sources, records and kind indices read back as a
plain list of ``Raw`` says they should; the engine fed a RawBatch of partition parts
does exactly what it does fed the same records as a ``list[Raw]``, dead letters (and
their sources, resolved lazily) included."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from calmon.config import Config, from_dict
from calmon.engine.engine import Engine, Rejected
from calmon.engine.rawbatch import RawBatch
from calmon.engine.records import Kind, Raw
from tests.oracle import T0, label_bytes, pred_bytes
from tests.unit.engine.columnar import as_rawbatch, outcome, raw

PRED, LAB = Kind.PREDICTION, Kind.LABEL


# ---------------------------------------------------------------- sources and records


def three_parts() -> RawBatch:
    rb = RawBatch()
    rb.add_partition(PRED, "preds", 0, [b"p0", b"p1", b"p2"], [1000, 2000, 3000], [10, 11, 12])
    rb.add_partition(LAB, "labels", 3, [b"l0", None], [None, -1], [7, 9])
    rb.add_partition(PRED, "preds", 1, [], [], [])  # a partition with nothing new
    rb.add_partition(PRED, "preds", 1, [b"p3"], [1764460800123], [0])
    return rb


def test_source_is_topic_partition_offset_across_parts() -> None:
    rb = three_parts()
    assert len(rb) == 6
    assert [rb.source(i) for i in range(6)] == [
        "preds/0/10", "preds/0/11", "preds/0/12", "labels/3/7", "labels/3/9", "preds/1/0"]


def test_records_read_back_as_raws() -> None:
    rb = three_parts()
    want = [Raw(PRED, b"p0", 1.0, "preds/0/10"), Raw(PRED, b"p1", 2.0, "preds/0/11"),
            Raw(PRED, b"p2", 3.0, "preds/0/12"), Raw(LAB, b"l0", None, "labels/3/7"),
            Raw(LAB, None, None, "labels/3/9"),
            Raw(PRED, b"p3", 1764460800.123, "preds/1/0")]
    assert list(rb) == want
    assert [rb.raw(i) for i in range(len(rb))] == want
    assert [rb[i] for i in range(len(rb))] == want


def test_of_keeps_each_raws_own_source() -> None:
    raws = [Raw(LAB, b"a", None, "labels.jsonl:3"), Raw(PRED, b"b", 12.5, "p/0/99"),
            Raw(PRED, None, None, ""), Raw(LAB, b"c", 0.0, "labels.jsonl:4")]
    rb = RawBatch.of(raws)
    assert [rb.source(i) for i in range(4)] == ["labels.jsonl:3", "p/0/99", "",
                                                "labels.jsonl:4"]
    assert list(rb) == raws
    assert rb.indices(PRED) == [1, 2]
    assert rb.indices(LAB) == [0, 3]


def test_of_then_partition_parts() -> None:
    """Raws first, then a partition: each part keeps its own kind of source."""
    rb = RawBatch.of([Raw(LAB, b"a", None, "f.jsonl:1"), Raw(PRED, b"b", None, "f.jsonl:2")])
    rb.add_partition(LAB, "labels", 2, [b"c", b"d"], [None, 5], [40, 41])
    rb.add_raws([Raw(PRED, b"e", None, "g.jsonl:9")])
    assert [rb.source(i) for i in range(5)] == ["f.jsonl:1", "f.jsonl:2", "labels/2/40",
                                                "labels/2/41", "g.jsonl:9"]
    assert rb.indices(PRED) == [1, 4]
    assert rb.indices(LAB) == [0, 2, 3]
    assert rb.raw(3) == Raw(LAB, b"d", 0.005, "labels/2/41")


def test_kafka_milliseconds_become_seconds() -> None:
    rb = RawBatch()
    rb.add_partition(PRED, "t", 0, [b"x"] * 6, [0, 1, 1500, 1764460800250, -1, None],
                     [0, 1, 2, 3, 4, 5])
    assert rb.stamps == [0.0, 0.001, 1.5, 1764460800.25, None, None]
    assert [r.timestamp for r in rb] == rb.stamps


# one part of a poll: (kind, how many records, whether it comes as Raws or a partition)
part = st.tuples(st.sampled_from([PRED, LAB]), st.integers(0, 4), st.booleans())


@settings(max_examples=150, deadline=None, derandomize=True, database=None)
@given(st.lists(part, max_size=8), st.booleans())
def test_indices_and_sources_equal_a_plain_scan(parts: list[tuple[Kind, int, bool]],
                                                 as_partitions_only: bool) -> None:
    rb = RawBatch()
    want: list[Raw] = []
    offsets: dict[tuple[str, int], int] = {}
    for n_part, (kind, n, as_raws) in enumerate(parts):
        if as_raws and not as_partitions_only:
            raws = [Raw(kind, f"r{len(want) + j}".encode(), float(j), f"file:{len(want) + j}")
                    for j in range(n)]
            rb.add_raws(raws)
            want += raws
            continue
        topic = "preds" if kind is PRED else "labels"
        partition = n_part % 3
        start = offsets.get((topic, partition), 100 * partition)
        offs = list(range(start, start + 2 * n, 2))  # ascending, with gaps (compaction)
        offsets[(topic, partition)] = start + 2 * n
        values: list[bytes | None] = [f"v{len(want) + j}".encode() for j in range(n)]
        rb.add_partition(kind, topic, partition, values, [1000 * j for j in range(n)], offs)
        want += [Raw(kind, v, float(j), f"{topic}/{partition}/{o}")
                 for j, (v, o) in enumerate(zip(values, offs))]
    assert len(rb) == len(want)
    assert list(rb) == want
    assert [rb.source(i) for i in range(len(rb))] == [r.source for r in want]
    for kind in (PRED, LAB):
        assert rb.indices(kind) == [i for i, r in enumerate(want) if r.kind is kind]


# ---------------------------------------------------------------- the engine: RawBatch = list


def config() -> Config:
    return from_dict({"metrics": {"windows": ["1h", "24h"]},
                      "segments": {"slices": [["country"]], "max_values": 5},
                      "join": {"ttl": "1h", "label_ttl": "1h", "max_pending": 1000}})


def pv(pid: str, ts: float | None, model: str = "bin", **fields: Any) -> bytes:
    """A prediction's value; ``ts=None`` leaves the field out (the Kafka time is used)."""
    if ts is None:
        return json.dumps({"id": pid, "model": model, **fields}).encode()
    return pred_bytes(pid, ts, model, **fields)


W_LABEL = label_bytes("w", 5, T0 + 50, model="mc")  # waits; out of range for "mc" later
W2_LABEL = label_bytes("w2", 3)  # waits (no ts); out of range for "mc" later

# Three polls: the first admits the models (the engine goes record by record), the
# second meets only known models (one Join.run_all over the batch), the third admits a
# new model again. Each poll's partitions in order; offsets ascending per partition.
POLLS: list[list[Raw]] = [
    [raw(PRED, pv("a", T0, prob=0.8, segment={"country": "US"}), 0, 0),
     raw(PRED, pv("b", T0 + 10, prob=0.3), 0, 1),
     raw(PRED, b"not json", 0, 2),
     raw(PRED, pv("c", T0 + 20, "mc", probs=[0.2, 0.3, 0.5]), 0, 3),
     raw(PRED, pv("a", T0 + 21, prob=0.1), 0, 4),  # duplicate of a pending id
     raw(LAB, label_bytes("a", 1, T0 + 30), 1, 0),
     raw(LAB, None, 1, 1),  # a tombstone: empty
     raw(LAB, label_bytes("zz", 0), 1, 2),  # nothing to meet: waits
     raw(LAB, label_bytes("c", 7), 1, 3),  # out of range for c's 3 classes
     raw(LAB, b"{}", 1, 4),
     raw(LAB, W_LABEL, 1, 5),
     raw(PRED, pv("d", None, prob=0.6), 2, 0, stamp_ms=round((T0 + 40.25) * 1000)),
     raw(LAB, label_bytes("d", 0), 0, 0, stamp_ms=round((T0 + 41) * 1000))],
    [raw(LAB, label_bytes("b", 0, T0 + 60), 0, 1),
     raw(LAB, label_bytes("b", 1, T0 + 61), 0, 2),  # b joined: a duplicate
     raw(LAB, b'{"id": "x", "label": [1]}', 0, 3),
     raw(LAB, W2_LABEL, 0, 4),
     raw(PRED, pv("w", T0 + 70, "mc", probs=[0.6, 0.3, 0.1]), 1, 0),
     raw(PRED, pv("e", T0 + 71, prob=1.5), 1, 1),
     raw(PRED, pv("f", T0 + 72, "mc", probs=[0.1, 0.1, 0.8], segment={"country": "DE"}),
         1, 2),
     raw(LAB, label_bytes("f", 2, T0 + 80), 1, 6),
     raw(LAB, label_bytes("c", 2, T0 + 81), 1, 7)],
    [raw(LAB, label_bytes("g", 1, T0 + 90), 2, 0),
     raw(PRED, pv("n", T0 + 91, "new", prob=0.5), 0, 5),
     raw(PRED, pv("w2", T0 + 92, "mc", probs=[0.3, 0.3, 0.4]), 0, 6),
     raw(PRED, pv("g", T0 + 93, prob=0.9), 0, 7),
     raw(PRED, pv("late", T0 - 4000, prob=0.5), 1, 3)],  # older than ttl: expires
]

# What the dead-letter topic receives for each poll, written out from the records above
WANT_REJECTED: list[list[tuple[Kind, bytes | None, str, str]]] = [
    [(PRED, b"not json", "predictions/0/2", "not_json"),
     (LAB, None, "labels/1/1", "empty"),
     (LAB, label_bytes("c", 7), "labels/1/3", "label_out_of_range"),
     (LAB, b"{}", "labels/1/4", "missing_id")],
    [(LAB, b'{"id": "x", "label": [1]}', "labels/0/3", "bad_label"),
     (PRED, pv("e", T0 + 71, prob=1.5), "predictions/1/1", "prob_out_of_range"),
     # waited since the first poll; its own source, not the source of what met it
     (LAB, W_LABEL, "labels/1/5", "label_out_of_range")],
    [(LAB, W2_LABEL, "labels/0/4", "label_out_of_range")],
]


def plain_rejected(rejected: list[Rejected]) -> list[tuple[Kind, bytes | None, str, str]]:
    return [(r.kind, r.value, r.source, r.reason) for r in rejected]


def test_a_rawbatch_of_partitions_feeds_as_the_same_raw_list() -> None:
    by_batch, by_list = Engine(config()), Engine(config())
    for poll, want in zip(POLLS, WANT_REJECTED):
        got = by_batch.feed(as_rawbatch(poll))
        assert plain_rejected(got) == want
        assert by_list.feed(list(poll)) == got
        assert by_batch.last_delta.invalid == by_list.last_delta.invalid
        assert outcome(by_batch) == outcome(by_list)
    # predictions: a, b, c, a (dup), d | w, f | n, w2, g, late
    # labels: a, zz, W, d | b, b (dup), W2, f, c, then W leaves | g, then W2 leaves
    # invalid: 4 + 3 + 1; joined: a, d | b, f, c | g; duplicates: a | b; expired: late
    assert dict(by_batch.counters) == {"predictions": 11, "labels": 8, "joined": 6,
                                       "invalid": 8, "expired": 1, "duplicates": 2}
    assert by_batch.join.pending == 3  # n, w, w2 wait for a label
    assert by_batch.join.pending_labels == 1  # zz


def test_a_waiting_labels_dead_letter_names_its_own_offset_on_the_fast_path() -> None:
    """The label waits in one poll and is found out of range in a later poll in which
    every model is known (one Join.run_all over the batch); records the parser rejects come
    before it in its poll, so a label's ordinal is not its batch index."""
    e = Engine(config())
    e.feed(as_rawbatch([raw(PRED, pv("warm", T0, "mc", probs=[0.5, 0.25, 0.25]), 0, 0)]))
    bad = label_bytes("q", 3, T0 + 5)
    poll = [raw(LAB, b"[]", 4, 17), raw(LAB, None, 4, 18), raw(LAB, label_bytes("r", 1), 4, 19),
            raw(LAB, bad, 4, 20), raw(LAB, b"nope", 4, 21)]
    assert [r.reason for r in e.feed(as_rawbatch(poll))] == ["not_object", "empty", "not_json"]
    rejected = e.feed(as_rawbatch([raw(PRED, b"{", 0, 1),
                                   raw(PRED, pv("q", T0 + 9, "mc", probs=[0.2, 0.3, 0.5]),
                                       0, 2)]))
    assert plain_rejected(rejected) == [(PRED, b"{", "predictions/0/1", "not_json"),
                                        (LAB, bad, "labels/4/20", "label_out_of_range")]
    assert e.counters["labels"] == 1  # r still waits; q is invalid now
    assert e.join.pending == 2


# ---------------------------------------------------------------- huge class indices


@pytest.mark.parametrize("huge", [10**30, 2**63, 2**63 - 1, 2**64 + 1])
@pytest.mark.parametrize("label_first", [False, True])
@pytest.mark.parametrize("warm", [False, True])
def test_a_huge_label_is_out_of_range_and_the_batch_goes_on(huge: int, label_first: bool,
                                                              warm: bool) -> None:
    """The engine makes an int64 column of the batch's labels: a class index past int64
    must be out of range for a binary (and a K-class) prediction, in either order, on
    the record-by-record path (models new) and on the one-run path (models known)."""
    e = Engine(config())
    if warm:  # both models admitted: the next batch goes through one Join.run_all
        e.feed(as_rawbatch([raw(PRED, pv("w0", T0, prob=0.5), 0, 0),
                            raw(PRED, pv("w1", T0, "mc", probs=[0.5, 0.25, 0.25]), 0, 1)]))
    preds = [raw(PRED, pv("h", T0 + 1, prob=0.7), 1, 0),
             raw(PRED, pv("k", T0 + 2, "mc", probs=[0.2, 0.3, 0.5]), 1, 1),
             raw(PRED, pv("ok", T0 + 3, prob=0.4), 1, 2)]
    huge_h = label_bytes("h", huge, T0 + 4)
    huge_k = label_bytes("k", huge)
    labels = [raw(LAB, huge_h, 2, 0), raw(LAB, huge_k, 2, 1),
              raw(LAB, label_bytes("ok", 1, T0 + 5), 2, 2)]
    before = dict(e.counters)
    rejected = e.feed(as_rawbatch(labels + preds if label_first else preds + labels))
    assert sorted(plain_rejected(rejected), key=lambda r: r[2]) == [
        (LAB, huge_h, "labels/2/0", "label_out_of_range"),
        (LAB, huge_k, "labels/2/1", "label_out_of_range")]
    grew = {k: e.counters[k] - before.get(k, 0) for k in ("predictions", "labels", "joined",
                                                          "invalid")}
    assert grew == {"predictions": 3, "labels": 1, "joined": 1, "invalid": 2}
    assert e.join.pending == 2 + (2 if warm else 0)  # h and k still wait for a valid label
    assert e.join.pending_labels == 0
    # the two still join a valid label
    e.feed(as_rawbatch([raw(LAB, label_bytes("h", 0), 2, 3), raw(LAB, label_bytes("k", 2), 2, 4)]))
    assert e.counters["joined"] - before.get("joined", 0) == 3
