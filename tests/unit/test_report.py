"""`calmon replay --html`: a self-contained report that renders in headless Chromium."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
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
