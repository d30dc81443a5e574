"""Replay's files read in bulk: the same records in the same order as reading them
line by line with the standard-library json and sorting by (time, kind, bytes), on
files with blank lines, CRLF, ISO and missing times, nested ``fields.ts`` paths,
lines that are not JSON, and untimed labels."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import numpy as np
import pytest

from calmon.engine.records import Kind, parse_ts
from calmon.timeline import order_key, read_lines, split_lines, timeline


def line_by_line(path: Path, ts_path: str) -> list[tuple[float, int, bytes]]:
    """(own ts or NaN, line number, bytes) of each non-blank line."""
    out = []
    for lineno, line in enumerate(path.read_bytes().split(b"\n"), 1):
        value = line.rstrip(b"\r")
        if not value.strip():
            continue
        try:
            obj = json.loads(value)
            for p in ts_path.split("."):
                obj = obj[p]
            t = parse_ts(obj)
        except Exception:
            t = math.nan
        out.append((t, lineno, value))
    return out


def reference(pred: Path, lab: Path, ts_path: str) -> list[tuple[float, str, bytes]]:
    p, q = line_by_line(pred, ts_path), line_by_line(lab, ts_path)
    tp = np.array([t for t, _, _ in p])
    tq = np.array([t for t, _, _ in q])
    keyed = [(float(t), 0, v, f"{pred}:{n}") for t, (_, n, v) in zip(order_key(tp, tq), p)]
    keyed += [(float(t), 1, v, f"{lab}:{n}") for t, (_, n, v) in zip(order_key(tq, tp), q)]
    keyed.sort(key=lambda k: k[:3])
    return [(t, src, v) for t, _, v, src in keyed]


def messy_file(rng: random.Random, nested: bool, n: int = 300) -> bytes:
    lines = []
    for i in range(n):
        t = 1.7e9 + rng.choice([i, i, 5.0, 7.5])  # some ties
        ts = rng.choice([t, t, t, int(t), None, True, "garbage", 1e400,
                         f"2025-01-0{rng.randint(1, 9)}T10:00:{rng.randint(0, 59):02d}"])
        rec: dict = {"id": f"r{i % 200}", "model": "m", "prob": rng.random(), "label": 1}
        if rng.random() < 0.9:
            if nested:
                rec["meta"] = {"t": ts} if rng.random() < 0.9 else 5
            else:
                rec["ts"] = ts
        line = rng.choice([json.dumps(rec)] * 12 + [
            "not json", "", "  \t", "[1, 2]", '{"ts": NaN}', '{"ts": 1, "ts": 2e9}'])
        lines.append(line + rng.choice(["", "", "", "\r", "\r\r"]))
    return ("\n".join(lines) + rng.choice(["", "\n"])).encode()


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("nested", [False, True])
def test_the_timeline_is_the_line_by_line_order(tmp_path: Path, seed: int, nested: bool) -> None:
    rng = random.Random(seed)
    pred, lab = tmp_path / "p.jsonl", tmp_path / "l.jsonl"
    pred.write_bytes(messy_file(rng, nested))
    if seed % 3 == 0:  # labels with no time at all: placed by their file position
        lab.write_bytes(b"\n".join(json.dumps({"id": f"r{i}", "label": 1}).encode()
                                   for i in range(150)))
    else:
        lab.write_bytes(messy_file(rng, nested))
    ts_path = "meta.t" if nested else "ts"
    got = timeline(read_lines(pred, Kind.PREDICTION, ts_path),
                   read_lines(lab, Kind.LABEL, ts_path))
    want = reference(pred, lab, ts_path)
    assert [(got.source(i), v) for i, v in enumerate(got.values)] == [
        (src, v) for _, src, v in want]
    assert got.t.tolist() == [t for t, _, _ in want]
    assert got.kinds == [Kind.PREDICTION if src.startswith(str(pred)) else Kind.LABEL
                         for _, src, _ in want]


def test_a_clean_file_reads_in_one_call_and_blank_lines_keep_numbers() -> None:
    values, lineno = split_lines(b'{"a":1}\r\n\r\n  \n{"b":2}\n\n{"c":3}')
    assert values == [b'{"a":1}', b'{"b":2}', b'{"c":3}']
    assert lineno.tolist() == [1, 4, 6]
    values, lineno = split_lines(b'{"a":1}\n{"b":2}\n')
    assert values == [b'{"a":1}', b'{"b":2}'] and lineno.tolist() == [1, 2]
    assert split_lines(b"") == ([], pytest.approx(np.zeros(0)))


def test_a_batch_names_each_record_by_file_and_line(tmp_path: Path) -> None:
    pred, lab = tmp_path / "p.jsonl", tmp_path / "l.jsonl"
    pred.write_text('{"ts": 2}\n\n{"ts": 1}\n')
    lab.write_text('{"ts": 1.5}\n')
    line = timeline(read_lines(pred, Kind.PREDICTION, "ts"), read_lines(lab, Kind.LABEL, "ts"))
    batch = line.batch(0, 3)
    assert [batch.source(i) for i in range(3)] == [f"{pred}:3", f"{lab}:1", f"{pred}:1"]
    assert [r.kind for r in batch] == [Kind.PREDICTION, Kind.LABEL, Kind.PREDICTION]
    assert batch.indices(Kind.LABEL) == [1]
    assert len(line.batch(2, 2)) == 0
