"""``calmon replay``: the same engine over JSONL files instead of Kafka.

Records are read in timestamp order across both files (ties: predictions
first, then by the raw bytes), so any interleaving of the same records gives
identical output.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

from calmon.config import Config
from calmon.engine.engine import Engine, View
from calmon.engine.records import Kind, Raw, parse_ts

BATCH = 5000
# a plain replay runs no calibrator: its calibrated ECE is null (replay --recalibrate has one)
NO_CALIBRATOR = {"calibrated_ece": None, "calibrated_samples": None}


def read_records(path: Path, kind: Kind, ts_path: str) -> Iterator[tuple[tuple, Raw]]:
    """Each non-blank line as (sort key, Raw). Lines whose ts cannot be read sort last;
    the engine still rejects or accepts them on their merits."""
    parts = ts_path.split(".")
    order = 0 if kind is Kind.PREDICTION else 1
    with path.open("rb") as f:
        for lineno, line in enumerate(f, 1):
            value = line.rstrip(b"\r\n")
            if not value.strip():
                continue
            yield (_ts_of(value, parts), order, value), Raw(kind, value, None, f"{path}:{lineno}")


def _ts_of(value: bytes, parts: list[str]) -> float:
    try:
        obj: Any = json.loads(value)
        for p in parts:
            obj = obj[p]
        return parse_ts(obj)
    except Exception:  # any malformed line: no usable ts, so it sorts last
        return math.inf


def replay(cfg: Config, predictions: Path, labels: Path) -> View:
    """Feed both files through a fresh engine; return its final view."""
    engine = Engine(cfg)
    records = sorted([*read_records(predictions, Kind.PREDICTION, cfg.fields.ts),
                      *read_records(labels, Kind.LABEL, cfg.fields.ts)], key=lambda kr: kr[0])
    for i in range(0, len(records), BATCH):
        engine.feed(raw for _, raw in records[i:i + BATCH])
    return engine.view()


def to_json(view: View, classwise: bool = False) -> dict[str, Any]:
    rows = [{"model": r.model, "segment": r.segment, "window": r.window, **r.stats.as_row(),
             **r.estimates.as_row(), **NO_CALIBRATOR,
             **({"classwise_ece": r.classwise_ece} if classwise else {})}
            for r in view.rows]
    counters = {k: view.counters.get(k, 0) for k in
                ("predictions", "labels", "joined", "invalid", "expired", "duplicates")}
    return {"rows": rows, "counters": counters}


def print_table(view: View, out: TextIO) -> None:
    cols = [("model", "model"), ("segment", "segment"), ("window", "window"),
            ("samples", "samples"), ("ece", "ece"), ("mce", "mce"), ("ace", "ace"),
            ("brier", "brier"), ("nll", "nll"), ("acc", "accuracy"),
            ("conf", "mean_confidence"), ("obs", "observed_rate"),
            ("obs/exp", "observed_over_expected"), ("floor", "noise_floor"),
            ("ece_lo", "ece_lower"), ("ece_hi", "ece_upper"), ("l2_deb", "ece_l2_debiased"),
            ("smece", "smece"), ("pending", "pending_samples"),
            ("est_acc", "estimated_accuracy"), ("est_pos", "estimated_positive_rate"),
            ("psi", "score_psi")]
    table = [[h for h, _ in cols]]
    for r in view.rows:
        row = {"model": r.model, "segment": r.segment, "window": r.window, **r.stats.as_row(),
               **r.estimates.as_row()}
        table.append([_fmt(row[k]) for _, k in cols])
    widths = [max(len(line[i]) for line in table) for i in range(len(cols))]
    for line in table:
        out.write("  ".join(c.ljust(w) if i < 3 else c.rjust(w)
                            for i, (c, w) in enumerate(zip(line, widths))).rstrip() + "\n")
    c = view.counters
    out.write("\n" + "  ".join(f"{k}={c.get(k, 0)}" for k in
                               ("predictions", "labels", "joined", "invalid", "expired",
                                "duplicates")) + "\n")


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4f}"
    return str(v)
