"""Joined batches are input too (issue 35 item 5): every field of a batch is held to the
rules and limits of an input record, and its place (key, partition, source range) to
what a sender of the fleet could have written. A refused batch is counted under its
reason, nothing of it reaches the owner's rings, marks, clocks or checkpoint, and the
batches after it are taken as usual."""

from __future__ import annotations

import json
import struct
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from calmon import config as config_mod
from calmon.cluster.batch import MAGIC, JoinedBatch, Series, encode
from calmon.cluster.owner import Owner, Place
from calmon.engine.buffer import SampleSet
from calmon.engine.records import ScoreKind
from calmon.engine.series import ALL
from calmon.io.exporter import recal_metrics
from calmon.recal.policy import Policy
from calmon.recal.registry import Registry

T0 = 1_700_000_000.0
CFG = config_mod.from_dict({
    "kafka": {"predictions_topic": "preds", "labels_topic": "labels"},
    "limits": {"max_classes": 4, "max_name_bytes": 16, "max_models": 2},
    "segments": {"slices": [["country"]]}})


def binary(n: int = 4, kind: ScoreKind = ScoreKind.PROB) -> SampleSet:
    return SampleSet(T0 + np.arange(n, dtype=float), np.arange(n, dtype=np.int32) % 2,
                     np.full(n, int(kind), np.int8), np.linspace(0.1, 0.9, n), 0)


def multi(n: int = 3, k: int = 3) -> SampleSet:
    p = np.full((n, k), 1.0 / k)
    return SampleSet(T0 + np.arange(n, dtype=float), np.arange(n, dtype=np.int32) % k,
                     np.full(n, int(ScoreKind.PROBS), np.int8), p, 0)


def batch(model: str = "ctr", series: list[Series] | None = None,
          source: dict[tuple[str, int], tuple[int, int]] | None = None,
          **kw: Any) -> JoinedBatch:
    return JoinedBatch(model, T0 + 10.0, 0, source or {("preds", 0): (0, 4)},
                       series if series is not None else [Series(ALL, 0, 4, binary())], **kw)


def with_column(b: JoinedBatch, col: str, value: Any) -> JoinedBatch:
    """``b`` with one sample's ``col`` set to ``value``."""
    x = b.series[0].samples
    arrays = {c: getattr(x, c).copy() for c in ("ts", "label", "kind", "score")}
    arrays[col][1] = value
    return replace(b, series=[Series(b.series[0].segment, b.series[0].classes,
                                     b.series[0].added, SampleSet(**arrays, total=0))])


def with_header(data: bytes, **fields: Any) -> bytes:
    """The batch bytes with header fields replaced (columns kept)."""
    (hlen,) = struct.unpack_from(">I", data, 4)
    header = json.loads(data[8:8 + hlen])
    header.update(fields)
    head = json.dumps(header).encode()
    return MAGIC + struct.pack(">I", len(head)) + head + data[8 + hlen:]


def owner() -> Owner:
    return Owner(Policy(CFG, Registry(None)), 1000)


GOOD = encode(batch())

# (what is malformed, the record's bytes, the reason it is refused under)
FIELDS = [
    ("a lone surrogate in the model", encode(batch("ct\ud800r")), "not_utf8"),
    ("an escape in the model", encode(batch("ctr\x1b[2J")), "bad_model"),
    ("a C1 control (NEL) in the model", encode(batch("ctr\x85x")), "bad_model"),
    ("a model over max_name_bytes", encode(batch("m" * 17)), "bad_model"),
    ("a model that is not a string", with_header(GOOD, model=7), "bad_model"),
    ("an empty model", encode(batch("")), "bad_model"),
    ("a segment with a line break", encode(batch(series=[
        Series("country=U\nS", 0, 4, binary())])), "bad_segment"),
    ("a segment of no slice", encode(batch(series=[Series("US", 0, 4, binary())])),
     "bad_segment"),
    ("a lone surrogate in a segment", encode(batch(series=[
        Series("country=\udc80", 0, 4, binary())])), "not_utf8"),
    ("a segment twice", encode(batch(series=[Series(ALL, 0, 4, binary()),
                                             Series(ALL, 0, 4, binary())])), "bad_segment"),
    ("a class count over max_classes", encode(batch(series=[
        Series(ALL, 5, 3, multi(3, 5))])), "too_many_classes"),
    ("a multiclass kind in a binary series", encode(with_column(batch(), "kind", 2)),
     "bad_score"),
    ("an unknown score kind", encode(with_column(batch(), "kind", 9)), "bad_score"),
    ("a binary label of 2", encode(with_column(batch(), "label", 2)), "label_out_of_range"),
    ("a negative label", encode(with_column(batch(), "label", -1)), "label_out_of_range"),
    ("a class index past K", encode(batch(series=[Series(ALL, 3, 3, SampleSet(
        T0 + np.arange(3.0), np.array([0, 3, 1], np.int32),
        np.full(3, int(ScoreKind.PROBS), np.int8), np.full((3, 3), 1 / 3), 0))])),
     "label_out_of_range"),
    ("a NaN score", encode(with_column(batch(), "score", np.nan)), "not_finite"),
    ("an infinite logit", encode(with_column(batch(series=[Series(
        ALL, 0, 4, binary(kind=ScoreKind.LOGIT))]), "score", np.inf)), "not_finite"),
    ("a probability of 1.5", encode(with_column(batch(), "score", 1.5)),
     "prob_out_of_range"),
    ("class probabilities summing to 2", encode(batch(series=[Series(ALL, 3, 3, SampleSet(
        T0 + np.arange(3.0), np.zeros(3, np.int32),
        np.full(3, int(ScoreKind.PROBS), np.int8), np.full((3, 3), 2 / 3), 0))])),
     "probs_not_normalized"),
    ("a NaN sample time", encode(with_column(batch(), "ts", np.nan)), "bad_ts"),
    ("a sample time past year 9999", encode(with_column(batch(), "ts", 1e20)), "bad_ts"),
    ("a now that is not a number", with_header(GOOD, now="soon"), "bad_ts"),
    ("a now past year 9999", with_header(GOOD, now=1e300), "bad_ts"),
    ("a part past the part count", encode(batch(part=(2, 2))), "bad_batch"),
    ("sizes given as strings", with_header(GOOD, series=[
        {"segment": ALL, "classes": "0", "added": 4, "n": 4}]), "bad_batch"),
    ("a truncated batch", GOOD[:-3], "bad_batch"),
]


def assert_nothing_taken(o: Owner) -> None:
    held = o.snapshot()
    assert held["rings"] == held["seen"] == held["nows"] == held["partition_of"] == []
    assert o.models() == [] and o.series_of() == []
    snap = json.dumps(held, ensure_ascii=False).encode("utf-8")  # a checkpoint
    assert b"ctr" not in snap


@pytest.mark.parametrize(("what", "data", "reason"), FIELDS, ids=[f[0] for f in FIELDS])
def test_each_malformed_field_is_refused_counted_and_skipped(what: str, data: bytes,
                                                             reason: str) -> None:
    o = owner()
    assert o.admit(0, 7, data) == reason, what
    assert o.refused == {reason: 1} and o.bad == 1
    assert o.offsets == {0: 8}  # read past, never again
    assert_nothing_taken(o)
    assert o.admit(0, 8, GOOD) is True  # the next batch is taken as usual
    assert o.sample_count("ctr") == 4


ENDS = {("preds", 0): 100, ("labels", 0): 100, ("preds", 2): 50}


def place(key: bytes | None = b"ctr", partitions: int | None = None) -> Place:
    return Place(key, partitions, lambda t, p, _claimed: ENDS.get((t, p), 0))


def murmur_partition(key: bytes, n: int) -> int:
    """Kafka's default partitioner, as the Java client computes it (murmur2, seed
    0x9747b28c), written out here from its published definition."""
    m, r, length = 0x5BD1E995, 24, len(key)
    h = (0x9747B28C ^ length) & 0xFFFFFFFF
    for i in range(0, length - length % 4, 4):
        k = int.from_bytes(key[i:i + 4], "little")
        k = (k * m) & 0xFFFFFFFF
        k ^= k >> r
        k = (k * m) & 0xFFFFFFFF
        h = ((h * m) & 0xFFFFFFFF) ^ k
    rest = key[length - length % 4:]
    if rest:
        h ^= int.from_bytes(rest, "little")
        h = (h * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    h ^= h >> 15
    return (h & 0x7FFFFFFF) % n


def test_a_batch_is_refused_off_its_key_partition_or_reachable_source() -> None:
    right = murmur_partition(b"ctr", 4)
    wrong = (right + 1) % 4
    cases = [
        (place(b"other"), right, GOOD, "bad_key"),
        (place(None), right, GOOD, "bad_key"),
        # a batch replayed onto another partition of the joined topic: not its owner's
        (place(partitions=4), wrong, GOOD, "bad_key"),
        (place(), right, encode(batch(source={("elsewhere", 0): (0, 4)})), "bad_source"),
        (place(), right, encode(batch(source={("preds", 1): (0, 4)})), "bad_source"),
        (place(), right, encode(replace(batch(), sender=5)), "bad_source"),
        (place(), right, encode(batch(source={("preds", 0): (9, 4)})), "bad_source"),
        (place(), right, encode(batch(source={("preds", 0): (0, 2**62)})), "bad_source"),
    ]
    for p, part, data, reason in cases:
        o = owner()
        assert o.admit(part, 0, data, p) == reason, (p, data[:60])
        assert o.refused == {reason: 1}
        assert_nothing_taken(o)
    # a forged offset of 2**62 is refused, not remembered: the real batches after it
    # are taken, each once
    o = owner()
    forged = encode(batch(source={("preds", 0): (0, 2**62)}))
    assert o.admit(right, 0, forged, place(partitions=4)) == "bad_source"
    real = [encode(batch(source={("preds", 0): (0, 40)})),
            encode(batch(source={("preds", 0): (40, 100)}))]
    assert [o.admit(right, i + 1, v, place(partitions=4)) for i, v in enumerate(real)] == [
        True, True]
    assert o.admit(right, 3, real[1], place(partitions=4)) is False  # a copy
    assert o.sample_count("ctr") == 8 and o.duplicates == 1


def test_new_models_past_the_owners_bound_are_refused() -> None:
    o = owner()  # limits.max_models 2, one instance
    for i, m in enumerate(("a", "b")):
        assert o.admit(0, i, encode(batch(m))) is True
    assert o.admit(0, 2, encode(batch("c"))) == "too_many_models"
    assert o.admit(0, 3, encode(batch("a", source={("preds", 0): (4, 8)}))) is True
    assert o.models() == ["a", "b"]


def test_a_refused_name_never_reaches_metrics() -> None:
    """Before the checks, a lone surrogate in a model name reached the owner's series
    and every /metrics scrape failed to encode it."""
    o = owner()
    o.admit(0, 0, encode(batch("ct\ud800r")))
    o.admit(0, 1, GOOD)
    from calmon.recal.readmodel import RecalState

    state = RecalState(series=o.series_of(), methods=("temperature",))

    class Collector:
        def collect(self) -> Any:
            yield from recal_metrics(state)

    reg = CollectorRegistry()
    reg.register(Collector())  # type: ignore[arg-type]
    text = generate_latest(reg).decode()
    assert 'model="ctr"' in text and "\\ud800" not in text


def test_a_checkpoint_holding_a_malformed_series_restores_without_it() -> None:
    """A checkpoint an older release wrote after taking a malformed batch: the restart
    drops that series (a restart recovers) and keeps the others."""
    o = owner()
    assert o.admit(0, 0, GOOD) is True
    snap = o.snapshot()
    bad = ["ct\ud800r", ALL, snap["rings"][0][2]]
    snap = {**snap, "rings": [*snap["rings"], bad],
            "partition_of": [*snap["partition_of"], ["ct\ud800r", 0]]}
    again = owner()
    again.restore(snap)
    assert again.models() == ["ctr"] and again.series_of() == [("ctr", ALL)]
    assert again.sample_count("ctr") == 4


def test_the_running_owner_counts_dead_letters_and_skips_a_refused_record(
        tmp_path: Any) -> None:
    from types import SimpleNamespace

    from calmon.cluster.service import Cluster

    cfg = config_mod.from_dict({
        "kafka": {"instance": {"index": 0, "count": 2}, "joined_topic": "j",
                  "calibrators_topic": "c", "predictions_topic": "preds"},
        "recalibration": {"output_dir": str(tmp_path / "cal")}})
    dead: list[tuple[bytes | None, str, str]] = []
    c = Cluster(cfg, None, lambda v, r, s: dead.append((v, r, s)))
    ends = SimpleNamespace(end=lambda t, p, claimed: 100)

    def record(offset: int, key: bytes | None, value: bytes) -> Any:
        return SimpleNamespace(topic="j", partition=0, offset=offset, key=key, value=value,
                               headers=[])

    hostile = encode(batch("ct\x9br"))
    c._record(record(5, b"ct\x9br", hostile), ends)
    c._record(record(6, b"other", GOOD), ends)  # a batch under another model's key
    c._record(record(7, b"ctr", GOOD), ends)
    assert dead == [(hostile, "bad_model", "j/0/5"), (GOOD, "bad_key", "j/0/6")]
    invalid = c.invalid()
    assert invalid[("j", "bad_model")] == 1 and invalid[("j", "bad_key")] == 1
    assert invalid[("c", "bad_document")] == 0  # every reason of both topics, from 0
    assert c.owner.models() == ["ctr"] and c.owner.offsets == {0: 8}
    status = json.loads(json.dumps(c.status()))  # what /status serves
    assert status["refused"] == {"j": {"bad_model": 1, "bad_key": 1}}
