"""Issue 19's acceptance: memory and checkpoints in proportion to the data. Each
workload runs in a fresh process (``fleet_child``), so its RSS is its own."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
MiB = 2**20


def run(kind: str) -> dict:
    out = subprocess.run([sys.executable, "-m", "tests.unit.engine.fleet_child", kind],
                         cwd=ROOT, capture_output=True, text=True, timeout=240, check=True)
    result: dict = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def test_ten_thousand_sparse_series_hold_in_under_a_gib() -> None:
    r = run("sparse")
    # 99 models x (__all__ + 50 countries + 50 devices), 3 samples in each segment series
    assert r["series"] == 99 * 101 and r["joined"] == 99 * 150
    assert r["windows_series"] == [99 * 101] * 3  # every series holds buckets in every window
    assert r["buckets"][0][-1] == 16  # and the models' __all__ series all of them
    assert r["peak_rss"] < 1024 * MiB, r
    assert r["checkpoint"] < 100 * 10**6, r


def test_a_week_of_eight_models_by_fifty_values() -> None:
    r = run("week")
    assert r["series"] == 8 * 101 and r["joined"] == 2 * 8 * 2400
    assert r["buckets"] == [[16]] * 3  # every series has samples in every bucket
    assert r["rss_growth"] <= 300 * MiB, r
    assert r["checkpoint"] <= 64 * 10**6, r
