"""`calmon replay --html`: a self-contained report that renders in headless Chromium."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest

from calmon.cli import main

REPO = Path(__file__).resolve().parents[2]
T0 = 1_764_460_800.0


def _drifting(tmp_path: Path, n: int = 24_000) -> tuple[Path, Path]:
    """A calibrated logit model whose logits sharpen 2.5x half-way (truth: sigmoid(z))."""
    rng = np.random.default_rng(7)
    z = rng.normal(0.0, 1.5, n)
    y = (rng.random(n) < 1 / (1 + np.exp(-z))).astype(int)
    shown = np.where(np.arange(n) >= n // 2, 2.5 * z, z)
    country = rng.choice(["US", "DE"], n)
    preds, labels = tmp_path / "p.jsonl", tmp_path / "l.jsonl"
    preds.write_text("".join(json.dumps({"id": i, "model": "ctr", "ts": T0 + 6.0 * i,
                                         "logit": float(shown[i]),
                                         "segment": {"country": str(country[i])}}) + "\n"
                             for i in range(n)))
    labels.write_text("".join(json.dumps({"id": i, "label": int(y[i]),
                                          "ts": T0 + 6.0 * i + 60}) + "\n" for i in range(n)))
    return preds, labels


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("report")
    preds, labels = _drifting(tmp)
    out = tmp / "report.html"
    rc = main(["replay", "--predictions", str(preds), "--labels", str(labels),
               "--recalibrate", "--html", str(out)])
    assert rc == 0
    return out


def test_the_report_is_self_contained(report: Path) -> None:
    text = report.read_text(encoding="utf-8")
    assert not re.search(r"<script|<link|src=|https?://", text)  # nothing fetched, nothing run
    assert "<h2>ctr</h2>" in text
    assert text.count("<svg") >= 5  # raw, calibrated, accuracy over time, two segments
    assert "calibrated (" in text and "estimated (dashed) vs realized" in text
    # the calibrated diagram is after the backtest's published calibrator: ECE below raw
    eces = [float(x) for x in re.findall(r"confidence \(n=\d+, ECE ([\d.]+)\)", text)]
    assert eces[1] < eces[0]
    # and its caption says its ECE, beside the raw one's interval (noise said when inside)
    m = re.search(r"calibrated \(\d+ samples after its fit\): ECE ([\d.]+)", text)
    assert m is not None and abs(float(m.group(1)) - eces[1]) < 1e-3


def test_chromium_renders_the_report(report: Path, tmp_path: Path) -> None:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("chromium is not on PATH (Debian: apt-get install chromium)")
    flags = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
             "--no-first-run", "--disable-background-networking", "--disable-component-update",
             "--disable-sync", f"--user-data-dir={tmp_path / 'profile'}"]
    dom = subprocess.run([*flags, "--dump-dom", report.as_uri()], stdin=subprocess.DEVNULL,
                         capture_output=True, text=True, timeout=90)
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert dom.stdout.count("<svg") >= 5 and "class=\"bar\"" in dom.stdout
    png = tmp_path / "report.png"
    shot = subprocess.run([*flags, f"--screenshot={png}", "--window-size=1100,1000",
                           report.as_uri()], stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, timeout=90)
    assert shot.returncode == 0 and png.is_file(), shot.stderr[-2000:]
    assert png.stat().st_size > 20_000  # a blank page compresses to a few KB
    if os.environ.get("CALMON_UPDATE_SCREENSHOT"):  # refresh the README's picture
        shutil.copyfile(png, REPO / "docs" / "report.png")


def test_the_report_lists_the_backtest_events_and_marks_them(report: Path, tmp_path: Path,
                                                             capsys) -> None:
    text = report.read_text(encoding="utf-8")
    preds, labels = _drifting(tmp_path)
    assert main(["replay", "--predictions", str(preds), "--labels", str(labels),
                 "--recalibrate", "--json"]) == 0
    events = json.loads(capsys.readouterr().out)["events"]
    assert {e["kind"] for e in events} >= {"drift", "published"}, events
    table = re.search(r"<table class=events>(.*?)</table>", text, re.S)
    assert table is not None
    rows = re.findall(r"<tr class=(\w+)><td>([^<]+)</td><td>([^<]+)</td>", table.group(1))
    assert [(k, s) for k, _, s in rows] == [(e["kind"], e["segment"]) for e in events]
    when = datetime.fromtimestamp(events[0]["ts"], UTC)
    assert rows[0][1] == when.strftime("%Y-%m-%d %H:%M:%S")
    # the model-wide drift and publish are marked on the accuracy-over-time plot
    assert "class=ev-drift>" in text and "class=ev-published>" in text


def test_the_legend_names_every_mark(report: Path) -> None:
    text = report.read_text(encoding="utf-8")
    legend = re.search(r"<div class=legend>(.*?)</div>", text, re.S)
    assert legend is not None
    body = text[legend.end():]
    drawn = set(re.findall(r"<(?:rect|circle|line|polyline)[^>]* class=([\w-]+)", body))
    assert drawn >= {"bar", "pt", "diag", "hist", "real", "est", "ev-drift", "ev-published"}
    drawn.discard("frame")  # the plot's own border
    for cls in drawn:
        assert f"class={cls} " in legend.group(1) or f"class={cls}>" in legend.group(1), cls


def _calibrated(tmp_path: Path, n: int = 3000) -> tuple[Path, Path]:
    rng = np.random.default_rng(11)
    z = rng.normal(0.0, 1.5, n)
    y = (rng.random(n) < 1 / (1 + np.exp(-z))).astype(int)
    preds, labels = tmp_path / "cp.jsonl", tmp_path / "cl.jsonl"
    preds.write_text("".join(json.dumps({"id": i, "model": "ctr", "ts": T0 + 6.0 * i,
                                         "logit": float(z[i])}) + "\n" for i in range(n)))
    labels.write_text("".join(json.dumps({"id": i, "label": int(y[i])}) + "\n"
                              for i in range(n)))
    return preds, labels


def test_no_advice_contradicts_what_was_run(tmp_path: Path) -> None:
    """The newcomer ran --recalibrate, nothing was published, and the report said "run
    with --recalibrate". It now says what the backtest did; a plain replay is told how
    to backtest."""
    preds, labels = _calibrated(tmp_path)
    out = tmp_path / "r.html"
    assert main(["replay", "--predictions", str(preds), "--labels", str(labels),
                 "--recalibrate", "--html", str(out)]) == 0
    text = out.read_text(encoding="utf-8")
    assert "--recalibrate" not in text
    assert "the backtest raised no drift alarm on the whole model" in text
    assert "Backtest events: none (no drift alarm)" in text
    assert main(["replay", "--predictions", str(preds), "--labels", str(labels),
                 "--html", str(out)]) == 0
    text = out.read_text(encoding="utf-8")
    assert "replay ran no recalibration: --recalibrate backtests one" in text
    assert "Backtest events" not in text
