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


def _nested_files(tmp_path: Path, n: int = 200) -> tuple[Path, Path]:
    """The README's example: predictions keep the id under meta, labels at the top."""
    preds = _write(tmp_path / "p.jsonl", [{"meta": {"request_id": f"r{i}"}, "model": "m",
                                           "ts": T0 + i, "prob": 0.3} for i in range(n)])
    labels = _write(tmp_path / "l.jsonl", [{"request_id": f"r{i}", "label": i % 2,
                                            "ts": T0 + i + 1} for i in range(n)])
    return preds, labels


def _config(tmp_path: Path, text: str) -> str:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(text, encoding="utf-8")
    return str(cfg)


def test_a_labels_topic_hint_names_fields_labels_not_the_shared_key(capsys,
                                                                    tmp_path: Path) -> None:
    """The newcomer maps fields.id to the predictions' path; the labels then miss their id.
    Following "check fields.id" would break the predictions: the hint names
    fields.labels.id, and following it joins every record."""
    preds, labels = _nested_files(tmp_path)
    files = ["--predictions", str(preds), "--labels", str(labels), "--json"]
    rc, _, err = _run(capsys, *files, "-c", _config(tmp_path, "fields: {id: meta.request_id}\n"))
    assert rc == 1
    line = next(x for x in err.splitlines() if "labels: 200 invalid (missing_id)" in x)
    assert "set fields.labels.id" in line and "check fields.id" not in line, line
    rc, out, err = _run(capsys, *files, "-c", _config(
        tmp_path, "fields: {id: meta.request_id, labels: {id: request_id}}\n"))
    assert rc == 0, err
    assert json.loads(out)["counters"]["joined"] == 200


def test_a_predictions_hint_says_the_labels_topic_shares_the_key(capsys,
                                                                 tmp_path: Path) -> None:
    """The other way round: labels parse with the default id, predictions do not. The hint
    names fields.id and warns that the labels read it too, so the fix keeps them joined."""
    preds, labels = _nested_files(tmp_path)
    files = ["--predictions", str(preds), "--labels", str(labels), "--json"]
    rc, _, err = _run(capsys, *files, "-c", _config(tmp_path, "fields: {id: request_id}\n"))
    assert rc == 1
    line = next(x for x in err.splitlines() if "predictions: 200 invalid (missing_id)" in x)
    assert "check fields.id" in line and "set fields.labels.id to it" in line, line
    rc, out, err = _run(capsys, *files, "-c", _config(
        tmp_path, "fields: {id: meta.request_id, labels: {id: request_id}}\n"))
    assert rc == 0 and json.loads(out)["counters"]["joined"] == 200, err


def test_a_labels_hint_with_fields_labels_set_names_it(capsys, tmp_path: Path) -> None:
    preds, labels = _nested_files(tmp_path)
    rc, _, err = _run(capsys, "--predictions", str(preds), "--labels", str(labels), "-c",
                      _config(tmp_path, "fields: {id: meta.request_id, labels: {id: rid}}\n"))
    line = next(x for x in err.splitlines() if "labels: 200 invalid (missing_id)" in x)
    assert rc == 1 and "'rid'" in line and "check fields.labels.id" in line, line
