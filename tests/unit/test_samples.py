"""The sample records shipped for "Try it on your own topics": what the README and
calmon.samples say they are, and a replay over them that finds the drift."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest

from calmon.cli import main
from calmon.samples import FILES, write


def generate(seed: int = 2025) -> tuple[str, str]:
    """The shipped files, made again: a click model in the README's own-topics schema,
    four hours at 10 a minute, its log-odds doubled from 11:00; labels are the clicks
    only, in click order, without a time."""
    rng = np.random.default_rng(seed)
    t0 = datetime(2025, 12, 1, 9, 0, tzinfo=UTC).timestamp()
    n = 2400
    ts = np.sort(t0 + rng.uniform(0, 4 * 3600, n))
    z = rng.normal(-2.2, 1.1, n)
    clicked = rng.random(n) < 1 / (1 + np.exp(-z))
    shown = np.where(ts >= t0 + 2 * 3600, 2.0 * z, z)
    countries, devices = ("US", "DE", "BR"), ("ios", "android", "web")
    preds = []
    for i in range(n):
        when = datetime.fromtimestamp(round(float(ts[i]), 3), UTC)
        preds.append(json.dumps({
            "meta": {"request_id": f"r-{i + 1}", "model_version": "ranker-v3"},
            "served_at": when.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "context": {"country": countries[int(rng.integers(3))],
                        "device": devices[int(rng.integers(3))]},
            "score": {"p_click": round(float(1 / (1 + np.exp(-shown[i]))), 6)}}))
    delay = rng.exponential(120.0, n)
    clicks = sorted((float(ts[i] + delay[i]), i) for i in np.flatnonzero(clicked))
    labels = [json.dumps({"request_id": f"r-{i + 1}", "clicked": True}) for _, i in clicks]
    return "".join(p + "\n" for p in preds), "".join(x + "\n" for x in labels)


@pytest.fixture(scope="module")
def samples(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("try")
    assert sorted(p.name for p in write(d)) == sorted(FILES)
    return d


def test_the_shipped_files_are_what_their_docstring_says(samples: Path) -> None:
    preds, labels = generate()
    assert (samples / "predictions.jsonl").read_text(encoding="utf-8") == preds
    assert (samples / "labels.jsonl").read_text(encoding="utf-8") == labels
    assert preds.count("\n") == 2400 and labels.count("\n") == 313


def test_a_replay_with_the_shipped_mapping_finds_the_drift(capsys, samples: Path) -> None:
    rc = main(["replay", "--predictions", str(samples / "predictions.jsonl"), "--labels",
               str(samples / "labels.jsonl"), "-c", str(samples / "config.yaml"),
               "--recalibrate", "--json"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["invalid_reasons"] == {} and doc["counters"]["labels"] == 313
    drift = next(e for e in doc["events"] if e["kind"] == "drift")
    change = datetime(2025, 12, 1, 11, 0, tzinfo=UTC).timestamp()
    assert abs(drift["change_ts"] - change) < 1800 and drift["ts"] - change < 3600, drift
    assert any(e["kind"] == "published" for e in doc["events"]), doc["events"]


def test_without_the_labels_mapping_the_hint_names_it(capsys, samples: Path,
                                                      tmp_path: Path) -> None:
    text = (samples / "config.yaml").read_text(encoding="utf-8")
    wrong = tmp_path / "mine.yaml"
    wrong.write_text("\n".join(x for x in text.splitlines()
                               if not x.lstrip().startswith(("labels:", "id: request_id"))),
                     encoding="utf-8")
    rc = main(["replay", "--predictions", str(samples / "predictions.jsonl"), "--labels",
               str(samples / "labels.jsonl"), "-c", str(wrong)])
    err = capsys.readouterr().err
    assert rc == 1 and "labels: 313 invalid (missing_id)" in err
    assert "set fields.labels.id to the labels' own path" in err, err


def test_the_readme_shows_the_commands_the_newcomer_script_runs() -> None:
    """tests/newcomer.py follows the README (tests/integration/test_newcomer.py runs it):
    the install command, and the own-topics commands with the shipped config."""
    from tests import newcomer
    from tests.daemon_helpers import REPO

    readme = (REPO / "README.md").read_text(encoding="utf-8").replace("\\\n", "")
    said = " ".join(readme.split())  # continuation lines and alignment folded
    install = " ".join(newcomer.INSTALL).replace(".[demo]", '".[demo]"')
    files = " ".join([*newcomer.FILES, "-c", "try/config.yaml"])
    for command in (install, " ".join(newcomer.SAMPLES), " ".join(newcomer.BROKER),
                    f"calmon replay {files} --recalibrate",
                    "calmon check-config -c try/config.yaml --probe",
                    "calmon run -c try/config.yaml", "calmon demo"):
        assert command in said, command
