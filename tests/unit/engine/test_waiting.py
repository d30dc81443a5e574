"""Labels waiting for their prediction as columns (issue 35 item 13): what the join
reads back of them, their checkpoint form (and the list form written before), and a
label past ``limits.max_classes`` refused on arrival, so only a multiclass config keeps
labels whole."""

from __future__ import annotations

import math

from calmon.config import from_dict
from calmon.engine.engine import Engine
from calmon.engine.records import Kind, Label, Parser, Raw, Reject
from calmon.engine.waiting import WaitingLabels
from tests.oracle import P, label_bytes

T0 = 1_700_000_000.0


def _filled() -> WaitingLabels:
    w = WaitingLabels()
    w["a"] = (Label("a", 0, None, "m", b"raw-a", "labels/0/1"), math.inf)
    w["b"] = (Label("b", 1, T0, None, b"raw-b", "labels/0/2"), T0 + 60)
    w["c"] = (Label("c", 5, T0 + 1, "m", b"raw-c", "labels/0/3"), T0 + 61)
    return w


def test_a_waiting_label_reads_back_with_what_the_join_needs() -> None:
    w = _filled()
    assert list(w) == ["a", "b", "c"] and len(w) == 3 and "b" in w and "z" not in w
    assert w.get("a") == (Label("a", 0, None, None), math.inf)  # 0/1: no bytes kept
    assert w.get("c") == (Label("c", 5, T0 + 1, "m", b"raw-c", "labels/0/3"), T0 + 61)
    w.date(T0 + 10)
    assert w.deadline("a") == T0 + 10 and w.deadline("b") == T0 + 60
    assert w.expire(T0 + 60) == (2, T0 + 61)  # a and b
    assert list(w) == ["c"]
    assert w.pop("c")[0].raw == b"raw-c" and not w
    for i in range(100):  # rows freed and grown
        w[f"x{i}"] = (Label(f"x{i}", i % 2, float(i), None), float(i))
    assert [w.get(f"x{i}")[0].label for i in range(100)] == [i % 2 for i in range(100)]


def test_a_checkpoint_of_either_form_restores_the_same_labels() -> None:
    w = _filled()
    new = WaitingLabels()
    assert new.restore(w.snapshot()) == (T0 + 60, True)
    before = [[lid, lab.label, lab.ts, lab.model, lab.raw, lab.source, d]
              for lid, (lab, d) in ((lid, w.get(lid)) for lid in w)]  # the old list form
    old = WaitingLabels()
    assert old.restore(before) == (T0 + 60, True)
    for lid in ("a", "b", "c"):
        assert new.get(lid) == old.get(lid) == w.get(lid)
    assert list(new) == list(old) == ["a", "b", "c"]


def test_a_label_past_max_classes_is_refused_on_arrival() -> None:
    cfg = from_dict({"limits": {"max_classes": 3}})
    parser = Parser(cfg.fields, cfg.kafka.max_record_bytes, cfg.limits)
    assert isinstance(parser.parse(Raw(Kind.LABEL, label_bytes("x", 3, T0))), Reject)
    assert parser.parse(Raw(Kind.LABEL, label_bytes("x", 2, T0))).label == 2
    e = Engine(cfg)
    rej = e.feed([Raw(Kind.LABEL, label_bytes("x", 3, T0)),
                  Raw(Kind.LABEL, label_bytes("y", 2, T0))])
    assert [r.reason for r in rej] == ["label_out_of_range"]
    assert e.join.pending_labels == 1
    # the label kept whole is dead-lettered as received when its prediction is binary
    rej = e.feed([P("y", T0, "m", prob=0.5)])
    assert [(r.reason, r.value) for r in rej] == [("label_out_of_range",
                                                   label_bytes("y", 2, T0))]
