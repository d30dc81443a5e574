"""Run in a fresh process by test_capacity_measured: fill one of the join's bounded maps
to its bound (``join.max_pending``) with ids of ``limits.max_id_bytes``, take the
snapshot a checkpoint is written from, and print, as JSON, the RSS growth and the items
held.

    python -m tests.unit.join_child pending|labels|whole|joined N
"""

from __future__ import annotations

import gc
import json
import sys
from typing import Any

from calmon.config import from_dict
from calmon.engine.engine import Engine
from calmon.engine.records import Kind, Raw
from tests.oracle import T0, label_bytes, pred_bytes
from tests.procfs import KIB, status

ID_BYTES = 256
NAME_BYTES = 128
RAW_BYTES = 512  # a label kept whole: its record at the size calmon keeps (LABEL_RAW_CAP)
BATCH = 5000


def config(what: str, n: int) -> dict[str, Any]:
    return {"join": {"max_pending": n, "ttl": "1000h", "label_ttl": "1000h"},
            "limits": {"max_id_bytes": ID_BYTES, "max_name_bytes": NAME_BYTES,
                       "max_classes": 3 if what == "whole" else 2}}


def ident(i: int, tag: str) -> str:
    return (f"{tag}{i:012d}" + "x" * ID_BYTES)[:ID_BYTES]


def _whole(i: int) -> bytes:
    """A label 2 with a model hint of limits.max_name_bytes, padded to RAW_BYTES."""
    rec = label_bytes(ident(i, "W"), 2, T0, model="m" * NAME_BYTES, pad="")
    return label_bytes(ident(i, "W"), 2, T0, model="m" * NAME_BYTES,
                       pad="p" * (RAW_BYTES - len(rec)))


def batch(what: str, lo: int, hi: int) -> list[Raw]:
    if what == "labels":
        return [Raw(Kind.LABEL, label_bytes(ident(i, "L"), i % 2, T0 + i))
                for i in range(lo, hi)]
    if what == "whole":
        return [Raw(Kind.LABEL, _whole(i), None, f"labels/0/{10**9 + i}")
                for i in range(lo, hi)]
    if what == "pending":
        return [Raw(Kind.PREDICTION, pred_bytes(ident(i, "P"), T0 + i, "m", prob=0.5))
                for i in range(lo, hi)]
    out = []  # joined: each id's prediction and label, remembered for duplicates
    for i in range(lo, hi):
        out += [Raw(Kind.PREDICTION, pred_bytes(ident(i, "J"), T0 + i, "m", prob=0.5)),
                Raw(Kind.LABEL, label_bytes(ident(i, "J"), 1, T0 + i))]
    return out


def main(what: str, n: int) -> None:
    e = Engine(from_dict(config(what, n)))
    e.feed([Raw(Kind.PREDICTION, pred_bytes("warm", T0, "m", prob=0.5))])  # the model
    gc.collect()
    before = status("self", "VmRSS") * KIB
    for lo in range(0, n, BATCH):
        e.feed(batch(what, lo, min(n, lo + BATCH)))
    snapshot = e.join.snapshot()  # what a checkpoint write holds beside the state
    gc.collect()
    grown = status("self", "VmRSS") * KIB - before
    del snapshot
    held = {"pending": e.join.pending, "labels": e.join.pending_labels,
            "whole": e.join.pending_labels, "joined": len(e.join._done)}[what]
    print(json.dumps({"grown": grown, "held": held}))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
