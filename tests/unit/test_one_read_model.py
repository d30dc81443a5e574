"""One state, one set of numbers: ``replay --json``, ``replay --html``, ``/metrics``,
``/reliability`` and the recalibration loop read the same statistics read model
(``calmon.engine.snapshot``), so for the same engine state they show the same values.

The state: JSONL files replayed (what ``calmon replay`` does), and that engine's state
restored into a daemon in-process (over an empty ``ListSource``, real HTTP on
127.0.0.1). The loop's calibrated ECE of a series with no calibrator is its raw
window's ECE (contract: the identity), so it must equal the ECE of the same row."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path
from typing import Any

import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from calmon import config, replay
from calmon.cli import main
from calmon.daemon import Daemon
from calmon.io.exposition import new_registry
from calmon.recal.loop import Recalibrator
from tests.daemon_helpers import http_get, wait_until
from tests.fakes import DeadLetterLog, ListSource, partitions_of
from tests.unit.test_daemon_inprocess import Running

DEADLINE_S = 60.0  # generous: a busy 2-core machine
END = 1_764_460_800.0
CONFIG = """
server: {{host: 127.0.0.1, port: 0}}
state: {{dir: {state}, checkpoint_interval: 1h}}
segments: {{slices: [[country]]}}
recalibration: {{enabled: true, interval: 1s, min_samples: 10000000, output_dir: {out}}}
"""


def write_files(tmp_path: Path) -> tuple[Path, Path]:
    """Two models (binary and 3-class) in three countries over the last hour, each
    label a few seconds after its prediction, and a few predictions still pending."""
    rng = np.random.default_rng(32)
    preds, labels = [], []
    for i in range(900):
        ts = END - 3000 + 3 * i
        seg = {"country": ("US", "DE", "FR")[i % 3]}
        if i % 2:
            probs = rng.dirichlet([2.0, 1.0, 1.0])
            preds.append({"id": f"c{i}", "model": "cls", "ts": ts, "segment": seg,
                          "probs": probs.round(6).tolist()})
            labels.append({"id": f"c{i}", "label": int(rng.choice(3, p=probs)), "ts": ts + 5})
        else:
            p = float(rng.beta(2, 3))
            preds.append({"id": f"b{i}", "model": "ctr", "ts": ts, "segment": seg,
                          "prob": round(p, 6)})
            labels.append({"id": f"b{i}", "label": int(rng.random() < p ** 0.8),
                           "ts": ts + 5})
    preds += [{"id": f"w{i}", "model": "ctr", "ts": END + i, "prob": 0.4} for i in range(5)]
    p_path, l_path = tmp_path / "p.jsonl", tmp_path / "l.jsonl"
    p_path.write_text("".join(json.dumps(r) + "\n" for r in preds))
    l_path.write_text("".join(json.dumps(r) + "\n" for r in labels))
    return p_path, l_path


def gauges(text: str, name: str) -> dict[tuple[str, str, str], float]:
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name:
                out[(s.labels["model"], s.labels["segment"], s.labels["window"])] = s.value
    return out


def wait(cond: Any, what: str) -> None:
    wait_until(cond, DEADLINE_S, what, interval=0.02)


def test_replay_report_metrics_reliability_and_the_loop_show_the_same_numbers(
        tmp_path: Path, capsys: Any) -> None:
    p_path, l_path = write_files(tmp_path)
    cfg_path = tmp_path / "config.yaml"
    cfg_path.write_text(CONFIG.format(state=tmp_path / "state", out=tmp_path / "cal"))
    cfg = config.load(cfg_path)
    report = tmp_path / "report.html"

    # replay --json --html
    rc = main(["replay", "--predictions", str(p_path), "--labels", str(l_path),
               "-c", str(cfg_path), "--json", "--html", str(report)])
    out, err = capsys.readouterr()
    assert rc == 0, err
    doc = json.loads(out)
    rows = {(r["model"], r["segment"], r["window"]): r for r in doc["rows"]
            if r["samples"] > 0}
    assert {m for m, _, _ in rows} == {"ctr", "cls"} and len(rows) == 2 * 4 * 3

    # the same state in a daemon: /metrics, /reliability and its recalibration loop
    engine = replay.run(cfg, p_path, l_path)
    d = Daemon(cfg, registry=new_registry(),
               source=ListSource(partitions_of([], [])), install_signals=False)
    d.dead_letters = DeadLetterLog()  # type: ignore[assignment]
    d.engine.restore(engine.snapshot())
    with Running(d):
        assert d.recal is not None
        wait(lambda: d.http is not None and d.refresher.latest.version == d.engine.version,
             "the snapshot of the restored state")
        checks = d.recal.checks  # a check that began after this was read ends by n + 2
        wait(lambda: d.recal.checks >= checks + 2, "a check that read that snapshot")
        assert d.http is not None
        code, body = http_get(d.http.port, "/metrics")
        assert code == 200
        text = body.decode()
        pages = {}
        for model, segment, window in rows:
            query = f"/reliability?window={window}&model={model}&segment={segment}"
            code, page = http_get(d.http.port, query)
            assert code == 200
            pages[(model, segment, window)] = html.unescape(page.decode())
    loop = Recalibrator(cfg, engine)  # the loop's own default read of the same state
    loop.run_once()
    by_loop = {(m, s, w): (v, n) for m, s, w, v, n in loop.calibrated_rows()}

    ece, samples = gauges(text, "calmon_ece"), gauges(text, "calmon_window_samples")
    lower, upper = gauges(text, "calmon_ece_lower"), gauges(text, "calmon_ece_upper")
    calibrated = gauges(text, "calmon_calibrated_ece")
    largest = "7d"
    sections = re.split(r"<section>", report.read_text())
    for key, row in rows.items():
        model, segment, window = key
        # /metrics: the same floats
        assert (samples[key], ece[key]) == (row["samples"], row["ece"]), key
        assert (lower[key], upper[key]) == (row["ece_lower"], row["ece_upper"]), key
        # /reliability: the same values, as it prints them
        caption = (f"ECE {row['ece']:.4f} [{row['ece_lower']:.4f}, {row['ece_upper']:.4f}] "
                   f"at 90%, n={row['samples']}")
        assert caption in pages[key], key
        if segment == "__all__":  # the series the loop evaluates (not per_segment)
            assert calibrated[key] == row["ece"], key
            assert by_loop[key] == (row["ece"], row["samples"]), key
        if window == largest:  # the report shows the largest window
            mine = next(s for s in sections if s.startswith(f"<h2>{model}</h2>"))
            shown = (f"{row['samples']} samples; ECE {row['ece']:.4f}" if segment == "__all__"
                     else f"{segment}: n={row['samples']}, ECE {row['ece']:.4f}")
            assert shown in html.unescape(mine), key
    assert set(calibrated) == {k for k in rows if k[1] == "__all__"}
