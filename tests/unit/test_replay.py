"""``calmon replay``: JSON and table output over JSONL files, independent of the
order of the lines and of how the records are batched."""

from __future__ import annotations

import json
import math
import random
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest

from calmon import replay as replay_mod
from calmon.cli import main
from tests.oracle import (
    T0,
    assert_close,
    binary_terms,
    expected_row,
    multiclass_terms,
)

ROW_KEYS = {"model", "segment", "window", "samples", "ece", "mce", "ace", "brier", "nll",
            "accuracy", "mean_confidence", "observed_rate", "observed_over_expected",
            "noise_floor",
            # v2
            "ece_l2_debiased", "smece", "ece_lower", "ece_upper", "pending_samples",
            "estimated_accuracy", "estimated_positive_rate", "score_psi", "calibrated_ece",
            "calibrated_samples",
            # v5
            "estimated_accuracy_lower", "estimated_accuracy_upper", "estimate_basis",
            "estimate_fit_samples", "estimate_fit_newest_ts"}
COUNTER_KEYS = {"predictions", "labels", "joined", "invalid", "expired", "duplicates"}
CONFIG = """
join:
  ttl: 6h
metrics:
  windows: [1h, 24h]
segments:
  slices: [[country]]
recalibration:
  window: 24h
"""


def make_records(seed: int = 0):
    """Predictions and labels of a binary and a 3-class model over two hours, plus
    an invalid line, a duplicate label, and a prediction that never gets a label
    and expires."""
    rng = random.Random(seed)
    preds, labels = [], []
    truth = {"ctr": ([], []), "cls": ([], [])}
    for i in range(400):
        ts = T0 + rng.uniform(0, 7200)
        country = rng.choice(["US", "FR"])
        if i % 2 == 0:
            p = rng.random()
            preds.append({"id": f"b{i}", "model": "ctr", "ts": ts, "prob": p,
                          "segment": {"country": country}})
            y = int(rng.random() < p)
            truth["ctr"][0].append(p)
        else:
            w = [rng.random() + 0.01 for _ in range(3)]
            p = [x / sum(w) for x in w]
            preds.append({"id": f"c{i}", "model": "cls", "ts": ts, "probs": p,
                          "segment": {"country": country}})
            y = rng.randrange(3)
            truth["cls"][0].append(p)
        truth["ctr" if i % 2 == 0 else "cls"][1].append(y)
        label_ts = ts + rng.uniform(1, 600)
        if i % 7 == 0:  # some as ISO-8601
            labels.append({"id": preds[-1]["id"], "label": y,
                           "ts": datetime.fromtimestamp(label_ts, UTC).isoformat()})
        else:
            labels.append({"id": preds[-1]["id"], "label": y, "ts": label_ts})
    labels.append(dict(labels[0], ts=labels[0]["ts"] if isinstance(labels[0]["ts"], str)
                       else labels[0]["ts"] + 5))  # duplicate label
    preds.append({"id": "never", "model": "ctr", "ts": T0, "prob": 0.5})  # expires
    preds.append({"id": "late", "model": "ctr", "ts": T0 + 7 * 3600, "prob": 0.5})
    lines_p = [json.dumps(r) for r in preds] + ["{not json"]
    lines_l = [json.dumps(r) for r in labels] + ['{"id": "b0", "label": [1]}']
    return lines_p, lines_l, truth


def write(path: Path, lines: list[str], newline: str = "\n") -> Path:
    path.write_bytes(newline.join(lines).encode() + newline.encode())
    return path


@pytest.fixture
def files(tmp_path: Path):
    lines_p, lines_l, truth = make_records()
    cfg = tmp_path / "config.yaml"
    cfg.write_text(CONFIG)
    return (write(tmp_path / "p.jsonl", lines_p), write(tmp_path / "l.jsonl", lines_l), cfg,
            lines_p, lines_l, truth)


def run_json(capsys, p: Path, lab: Path, cfg: Path) -> tuple[str, dict]:
    rc = main(["replay", "--predictions", str(p), "--labels", str(lab), "-c", str(cfg),
               "--json"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    return out, json.loads(out)


def test_json_output_has_the_contract_keys_and_values(capsys, files) -> None:
    p, lab, cfg, _, _, truth = files
    _, doc = run_json(capsys, p, lab, cfg)
    assert set(doc) == {"rows", "counters", "invalid_reasons"}
    assert set(doc["counters"]) == COUNTER_KEYS
    assert sum(n for by in doc["invalid_reasons"].values() for n in by.values()) == 2
    assert doc["counters"] == {"predictions": 402, "labels": 401, "joined": 400,
                               "invalid": 2, "expired": 1, "duplicates": 1}
    assert doc["rows"]
    for row in doc["rows"]:
        assert set(row) == ROW_KEYS
    seen = {(r["model"], r["segment"], r["window"]) for r in doc["rows"]}
    for model in ("ctr", "cls"):
        for window in ("1h", "24h"):
            for seg in ("__all__", "country=US", "country=FR"):
                assert (model, seg, window) in seen
    # the 24h window holds everything: compare with the numpy reference
    rows = {(r["model"], r["segment"], r["window"]): r for r in doc["rows"]}
    refs = {"ctr": binary_terms(np.array(truth["ctr"][0]), np.array(truth["ctr"][1])),
            "cls": multiclass_terms(np.array(truth["cls"][0]), np.array(truth["cls"][1]))}
    for model, ref in refs.items():
        row = rows[(model, "__all__", "24h")]
        exp = expected_row(ref, 15, 1000)
        assert row["samples"] == exp["samples"] == 200
        for name in ("ece", "mce", "ace", "brier", "nll", "accuracy", "mean_confidence",
                     "observed_rate", "observed_over_expected", "ece_l2_debiased"):
            assert_close(row[name], exp[name], 1e-9, f"{model} {name}")
        assert 0 < row["noise_floor"] < 1
        assert 0 <= row["ece_lower"] <= row["ece_upper"] <= 1
        assert 0 < row["smece"] < 1
        assert row["calibrated_ece"] is None and row["calibrated_samples"] is None  # no calibrator
    # "late" (prob 0.5, at the last event time) still waits for its label: no calibrator,
    # so its estimated accuracy and positive rate are its own 0.5; "never" expired
    for window in ("1h", "24h"):
        row = rows[("ctr", "__all__", window)]
        assert row["pending_samples"] == 1
        assert row["estimated_accuracy"] == 0.5 and row["estimated_positive_rate"] == 0.5
        cls_row = rows[("cls", "__all__", window)]
        assert cls_row["pending_samples"] == 0 and cls_row["estimated_accuracy"] is None
        assert cls_row["estimated_positive_rate"] is None


def test_metric_that_does_not_apply_is_null(capsys, files) -> None:
    p, lab, cfg, *_ = files
    _, doc = run_json(capsys, p, lab, cfg)
    for row in doc["rows"]:
        if row["model"] == "cls":
            assert row["observed_rate"] is None
            assert row["observed_over_expected"] is None
        elif row["samples"]:
            assert row["observed_rate"] is not None
            assert row["observed_over_expected"] is not None
        else:  # an empty window: nothing that needs labels applies
            assert all(row[k] is None for k in ROW_KEYS - {
                "model", "segment", "window", "samples", "pending_samples",
                "estimated_accuracy", "estimated_positive_rate", "score_psi",
                "estimated_accuracy_lower", "estimated_accuracy_upper",
                # what the estimates were read through is always given
                "estimate_basis", "estimate_fit_samples", "estimate_fit_newest_ts"})


def test_interleavings_print_identical_json(capsys, files, tmp_path: Path,
                                            monkeypatch) -> None:
    p, lab, cfg, lines_p, lines_l, _ = files
    reference, _ = run_json(capsys, p, lab, cfg)
    rng = random.Random(9)
    for k in range(3):
        sp, sl = lines_p[:], lines_l[:]
        rng.shuffle(sp)
        rng.shuffle(sl)
        if k == 1:  # blank lines and CRLF line ends
            sp.insert(5, "")
            sl.insert(0, "   ")
        p2 = write(tmp_path / f"p{k}.jsonl", sp, "\r\n" if k == 1 else "\n")
        l2 = write(tmp_path / f"l{k}.jsonl", sl, "\r\n" if k == 1 else "\n")
        for batch in (5000, 37, 1):  # the records split into engine batches differently
            monkeypatch.setattr(replay_mod, "BATCH", batch)
            out, _ = run_json(capsys, p2, l2, cfg)
            assert out == reference, (k, batch)


def test_table_prints_one_line_per_row(capsys, files) -> None:
    p, lab, cfg, *_ = files
    _, doc = run_json(capsys, p, lab, cfg)
    rc = main(["replay", "--predictions", str(p), "--labels", str(lab), "-c", str(cfg)])
    out, err = capsys.readouterr()
    assert rc == 0, err
    lines = out.splitlines()
    header = lines[0].split()
    assert header[:4] == ["model", "segment", "window", "samples"]
    body = lines[1:lines.index("")]
    assert len(body) == len(doc["rows"])
    for line, row in zip(body, doc["rows"]):
        cells = line.split()
        assert cells[:4] == [row["model"], row["segment"], row["window"], str(row["samples"])]
        assert len(cells) == len(header)
    counters = lines[lines.index("") + 1]
    for key, value in doc["counters"].items():
        assert f"{key}={value}" in counters


def test_replay_via_subprocess(tmp_path: Path) -> None:
    p = write(tmp_path / "p.jsonl", [json.dumps({"id": 1, "model": "m", "ts": T0,
                                                 "logit": 0.0})])
    lab = write(tmp_path / "l.jsonl", [json.dumps({"id": "1", "label": True})])
    proc = subprocess.run([sys.executable, "-m", "calmon", "replay", "--predictions", str(p),
                           "--labels", str(lab), "--json"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["counters"]["joined"] == 1
    row = next(r for r in doc["rows"] if r["window"] == "1h" and r["segment"] == "__all__")
    assert row["samples"] == 1
    assert row["mean_confidence"] == 0.5 and row["accuracy"] == 1.0
    assert abs(row["nll"] - np.log(2)) < 1e-9


def test_missing_file_exits_2(capsys, tmp_path: Path) -> None:
    p = write(tmp_path / "p.jsonl", ["{}"])
    rc = main(["replay", "--predictions", str(p), "--labels", str(tmp_path / "nope.jsonl")])
    _, err = capsys.readouterr()
    assert rc == 2 and "nope.jsonl" in err


# ---------------------------------------------------------------- --recalibrate

RECAL_CONFIG = """
metrics:
  windows: [1h, 24h]
segments:
  slices: []
recalibration:
  interval: 5m
  cooldown: 1h
  min_samples: 500
  window: 24h
"""
EVENT_KEYS = {"ts", "model", "segment", "kind"}
REFIT_KEYS = EVENT_KEYS | {"method", "trigger", "fit_samples", "holdout_samples",
                           "holdout_before", "holdout_after"}


def drifting_files(tmp_path: Path, seed: int = 4) -> tuple[Path, Path, Path]:
    """A binary model, 6k predictions a day for two days, logits sharpened 2.5x after
    the first day; labels 1-10 minutes after their predictions."""
    rng = np.random.default_rng(seed)
    n = 12_000
    ts = np.sort(T0 + rng.uniform(0, 2 * 86_400, n))
    z = rng.normal(-1.5, 1.2, n)
    y = (rng.random(n) < 1 / (1 + np.exp(-z))).astype(int)
    reported = np.where(ts >= T0 + 86_400, 2.5 * z, z)
    preds = [json.dumps({"id": f"r{i}", "model": "ctr", "ts": float(ts[i]),
                         "logit": float(reported[i])}) for i in range(n)]
    labels = [json.dumps({"id": f"r{i}", "label": int(y[i]),
                          "ts": float(ts[i] + rng.uniform(60, 600))}) for i in range(n)]
    cfg = tmp_path / "recal.yaml"
    cfg.write_text(RECAL_CONFIG)
    return write(tmp_path / "p.jsonl", preds), write(tmp_path / "l.jsonl", labels), cfg


def run_recalibrate(capsys, p: Path, lab: Path, cfg: Path, *extra: str) -> str:
    rc = main(["replay", "--predictions", str(p), "--labels", str(lab), "-c", str(cfg),
               "--recalibrate", "--json", *extra])
    out, err = capsys.readouterr()
    assert rc == 0, err
    return out


def test_recalibrate_backtest_events(capsys, tmp_path: Path) -> None:
    p, lab, cfg = drifting_files(tmp_path)
    before = sorted(tmp_path.rglob("*"))
    out = run_recalibrate(capsys, p, lab, cfg)
    assert sorted(tmp_path.rglob("*")) == before  # nothing written without --output-dir
    doc = json.loads(out)
    events = doc["events"]
    assert [e["ts"] for e in events] == sorted(e["ts"] for e in events)
    # checks on the 5-minute grid, each at "now": the newest prediction before it
    pred_ts = np.sort([json.loads(line)["ts"] for line in p.read_text().splitlines()])
    for e in events:
        boundary = (math.floor(e["ts"] / 300) + 1) * 300
        assert e["ts"] == pred_ts[pred_ts < boundary].max()
    kinds = [e["kind"] for e in events]
    assert kinds[0] == "drift" and "published" in kinds, events
    drift, published = events[0], events[kinds.index("published")]
    assert set(drift) == EVENT_KEYS | {"trigger", "change_ts"}
    change = T0 + 86_400
    assert abs(drift["change_ts"] - change) < 1800
    assert drift["ts"] - change < 3 * 3600  # caught within hours at 250 samples/h
    assert set(published) == REFIT_KEYS | {"version"} and published["version"] == 1
    assert published["holdout_after"]["nll"] < published["holdout_before"]["nll"]
    assert published["fit_samples"] + published["holdout_samples"] >= 500
    # every row carries the calibrated ECE, on samples predicted after the fit only
    rows = {(r["model"], r["segment"], r["window"]): r for r in doc["rows"]}
    r1h = rows[("ctr", "__all__", "1h")]
    assert r1h["calibrated_samples"] <= r1h["samples"]
    assert r1h["calibrated_ece"] is None or r1h["calibrated_ece"] < r1h["ece"]


def test_recalibrate_is_deterministic_and_writes_documents(capsys, tmp_path: Path) -> None:
    p, lab, cfg = drifting_files(tmp_path)
    first = run_recalibrate(capsys, p, lab, cfg)
    # the same records in another line order: the same bytes
    lines = p.read_text().splitlines()
    random.Random(1).shuffle(lines)
    p2 = write(tmp_path / "p2.jsonl", lines)
    assert run_recalibrate(capsys, p2, lab, cfg) == first
    out_dir = tmp_path / "cal"
    with_dir = run_recalibrate(capsys, p, lab, cfg, "--output-dir", str(out_dir))
    assert with_dir == first
    published = [e for e in json.loads(first)["events"] if e["kind"] == "published"]
    docs = sorted((out_dir / "ctr" / "__all__").glob("v*.json"))
    assert len(docs) == len(published) >= 1
    latest_doc = json.loads((out_dir / "ctr" / "__all__" / "latest.json").read_text())
    assert latest_doc["version"] == published[-1]["version"]
    assert latest_doc["fit"]["holdout_after"] == published[-1]["holdout_after"]
    assert len(latest_doc["reference"]) == 15 and latest_doc["change_ts"] is not None


def test_output_dir_needs_recalibrate(capsys, tmp_path: Path) -> None:
    p, lab, cfg = drifting_files(tmp_path)
    rc = main(["replay", "--predictions", str(p), "--labels", str(lab), "-c", str(cfg),
               "--output-dir", str(tmp_path / "x")])
    assert rc == 2
    assert "--recalibrate" in capsys.readouterr().err


# ---------------------------------------------------------------- labels without a ts


def test_labels_without_ts_are_read_at_their_place_not_last(capsys, tmp_path: Path) -> None:
    """The README's label form has no ts. Replay read such labels after every
    prediction, so the backtest alarmed at the end of the data; read at their place in
    the file, they alarm when labels with a ts do (within a check or two)."""
    p, lab, cfg = drifting_files(tmp_path)
    timed = json.loads(run_recalibrate(capsys, p, lab, cfg))["events"]
    bare = write(tmp_path / "bare.jsonl", [json.dumps({k: v for k, v in json.loads(x).items()
                                                       if k != "ts"})
                                           for x in lab.read_text().splitlines()])
    untimed = json.loads(run_recalibrate(capsys, p, bare, cfg))["events"]
    first = {name: next(e for e in ev if e["kind"] == "drift")
             for name, ev in (("timed", timed), ("untimed", untimed))}
    end = T0 + 2 * 86_400
    assert end - first["untimed"]["ts"] > 12 * 3600, first  # not at the end of the data
    # the ts-less labels come at once, the timed ones 1-10 min later: a check or two apart
    assert abs(first["untimed"]["ts"] - first["timed"]["ts"]) <= 2 * 300 + 600, first
    assert any(e["kind"] == "published" for e in untimed)


def test_click_labels_without_ts_join_their_predictions(capsys, tmp_path: Path) -> None:
    """Implicit negatives: the labels file holds only the clicks, in click order, without
    a ts. Each is read where its place in the file puts it among the predictions, so
    every click joins its prediction (none expires waiting, none comes after its
    prediction was settled as a 0)."""
    rng = np.random.default_rng(5)
    n = 3000
    ts = np.sort(T0 + rng.uniform(0, 6 * 3600, n))  # 6 hours, far past label_ttl
    p = rng.uniform(0.02, 0.4, n)
    y = rng.random(n) < p
    preds = [json.dumps({"id": f"r{i}", "model": "ctr", "ts": float(ts[i]),
                         "prob": float(p[i])}) for i in range(n)]
    clicks = [json.dumps({"id": f"r{i}", "label": 1}) for i in np.flatnonzero(y)]
    cfg = tmp_path / "c.yaml"
    cfg.write_text("join: {missing_label: {value: 0, after: 30m}, label_ttl: 1h}\n"
                   "metrics: {windows: [7d]}\nsegments: {slices: []}\n"
                   "recalibration: {window: 7d}\n")
    rc = main(["replay", "--predictions", str(write(tmp_path / "p.jsonl", preds)), "--labels",
               str(write(tmp_path / "l.jsonl", clicks)), "-c", str(cfg), "--json"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    doc = json.loads(out)
    row = next(r for r in doc["rows"] if r["segment"] == "__all__")
    settled = ts <= ts.max() - 1800  # the rest still wait for their implicit 0
    c = doc["counters"]
    assert c["joined"] == settled.sum() and c["expired"] == 0 and c["duplicates"] == 0, c
    # every click of a settled prediction counted as a 1 (none lost as a 0)
    assert row["samples"] == settled.sum()
    assert row["observed_rate"] * row["samples"] == pytest.approx(float(y[settled].sum()))


def test_the_order_key_rule() -> None:
    nan = math.nan
    own = np.array([nan, nan, nan, nan])
    other = np.array([10.0, nan, 30.0, 40.0, 50.0, 60.0, nan, 80.0])
    # record i of 4 sits at place 2i of 8: at the time there, or the last before it
    assert replay_mod.order_key(own, other).tolist() == [10.0, 30.0, 50.0, 60.0]
    # a leading gap of the other file: its first time
    assert replay_mod.order_key(np.array([nan]), np.array([nan, 7.0])).tolist() == [7.0]
    assert replay_mod.order_key(np.array([5.0, nan]), np.array([nan, 7.0])).tolist() == [5, 7]
    assert replay_mod.order_key(np.array([nan]), np.array([nan])).tolist() == [math.inf]
