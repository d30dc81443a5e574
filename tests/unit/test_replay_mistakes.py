"""A newcomer's mistakes through `calmon replay`: named where they happen, exit 1."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from calmon.cli import main

T0 = 1_764_460_800.0


def _write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _files(tmp_path: Path, n: int = 200, id_key: str = "id",
           label_id_key: str = "id") -> tuple[Path, Path]:
    preds = _write(tmp_path / "p.jsonl", [{id_key: f"r{i}", "model": "m", "ts": T0 + i,
                                           "prob": 0.3} for i in range(n)])
    labels = _write(tmp_path / "l.jsonl", [{label_id_key: f"r{i}", "label": i % 2,
                                            "ts": T0 + i + 1} for i in range(n)])
    return preds, labels


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(["replay", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def test_a_wrong_id_mapping_exits_1_and_names_the_key(capsys, tmp_path: Path) -> None:
    preds, labels = _files(tmp_path, id_key="request_id", label_id_key="request_id")
    rc, out, err = _run(capsys, "--predictions", str(preds), "--labels", str(labels), "--json")
    assert rc == 1
    doc = json.loads(out)  # stdout holds only the JSON object
    assert doc["invalid_reasons"] == {"predictions": {"missing_id": 200},
                                      "labels": {"missing_id": 200}}
    assert "fields.id" in err and "predictions: 200 invalid (missing_id)" in err


def test_labels_with_their_own_id_path_join_through_fields_labels(capsys,
                                                                  tmp_path: Path) -> None:
    preds, labels = _files(tmp_path, label_id_key="request_id")
    rc, out, err = _run(capsys, "--predictions", str(preds), "--labels", str(labels), "--json")
    assert rc == 1 and "labels: 200 invalid (missing_id)" in err and "fields.id" in err
    cfg = tmp_path / "c.yaml"
    cfg.write_text("fields:\n  labels: {id: request_id}\n", encoding="utf-8")
    rc, out, err = _run(capsys, "--predictions", str(preds), "--labels", str(labels), "--json",
                        "-c", str(cfg))
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["counters"]["joined"] == 200 and doc["invalid_reasons"] == {}


@pytest.mark.parametrize("shape", ["csv", "gzip", "swapped"])
def test_unreadable_or_swapped_files_exit_1(capsys, tmp_path: Path, shape: str) -> None:
    preds, labels = _files(tmp_path)
    if shape == "csv":
        preds.write_text("id,model,ts,prob\n" + "".join(f"r{i},m,{T0 + i},0.3\n"
                                                       for i in range(50)))
    elif shape == "gzip":
        preds.write_bytes(gzip.compress(preds.read_bytes()))
    else:
        preds, labels = labels, preds
    rc, _, err = _run(capsys, "--predictions", str(preds), "--labels", str(labels))
    assert rc == 1
    assert "holds no valid prediction record" in err
    reason = {"csv": "not_json", "gzip": "not_utf8", "swapped": "missing_model"}[shape]
    assert "predictions: " in err and f"({reason})" in err


def test_a_clean_replay_exits_0_and_reports_nothing(capsys, tmp_path: Path) -> None:
    preds, labels = _files(tmp_path)
    rc, out, err = _run(capsys, "--predictions", str(preds), "--labels", str(labels), "--json")
    assert rc == 0, err
    assert json.loads(out)["invalid_reasons"] == {} and "invalid" not in err


def test_fields_labels_on_both_parsers() -> None:
    """The slow parser (records.Parser) and the batch parser read labels at their own paths."""
    from calmon.config import from_dict
    from calmon.engine.fastparse import BatchParser
    from calmon.engine.records import Kind, Label, Parser, Raw

    cfg = from_dict({"fields": {"labels": {"id": "request_id", "label": "outcome.clicked",
                                           "ts": "at"}}})
    value = b'{"request_id": 17, "outcome": {"clicked": true}, "at": 1764460800.5, "id": "no"}'
    raw = Raw(Kind.LABEL, value, None, "t/0/0")
    got = Parser(cfg.fields, 1 << 20).parse(raw)
    assert isinstance(got, Label) and (got.id, got.label, got.ts) == ("17", 1, 1764460800.5)
    parsed = BatchParser(cfg.fields, 1 << 20).parse([raw])
    assert [str(x) for x in parsed.l_id] == ["17"] and list(parsed.l_label) == [1]
