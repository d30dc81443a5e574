"""``calmon replay --every``: rows by period of event time (contract section 3, v5).

Every expected number is computed here with plain numpy from the generated records
(``tests.oracle`` for the metrics), following the contract's rules: a period's realized
metrics over its predictions with the labels joined by the end of the replay; its
pending predictions as of period_end (not joined by a label read before it, not
expired by then on the model's clock)."""

from __future__ import annotations

import json
import math
import tracemalloc
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from calmon import config as config_mod
from calmon import replay as replay_mod
from calmon.cli import main
from calmon.engine.engine import Engine
from calmon.periods import PeriodRow, Periods, with_window
from tests.oracle import (
    T0,
    assert_close,
    binary_terms,
    expected_row,
    multiclass_terms,
    right_closed_bins,
)
from tests.unit.test_replay import ROW_KEYS

DAY = 86400.0
TTL = 12 * 3600.0
CONFIG = """
join:
  ttl: 12h
metrics:
  windows: [1h, 24h]
segments:
  slices: [[country]]
"""
METRICS = ("ece", "mce", "ace", "brier", "nll", "accuracy", "mean_confidence",
           "observed_rate", "observed_over_expected", "ece_l2_debiased")


def make_days(days: int, per_day: int = 200, seed: int = 3) -> dict[str, dict]:
    """Per model: predictions over ``days`` days (segment, ts, scores) and labels. A
    label comes promptly (within 6 h: it joins), late (20-40 h after its prediction,
    past join.ttl: the prediction has expired and it never joins), or never."""
    rng = np.random.default_rng(seed)
    out = {}
    for model, k in (("ctr", 0), ("cls", 3)):
        n = days * per_day
        ts = np.sort(T0 + rng.uniform(0, days * DAY, n))
        # the model's clock never lags a label by more than the margins below
        assert np.diff(ts).max() < 6 * 3600
        if k == 0:
            # calibration that drifts over the days, so periods differ
            p = np.clip(rng.beta(2, 2, n) * (0.8 + 0.4 * (ts - T0) / (days * DAY)), 0, 1)
            y = (rng.random(n) < p).astype(np.int64)
            scores = p
        else:
            scores = rng.dirichlet(np.ones(k) * 0.7, n)
            y = np.array([rng.choice(k, p=row) for row in scores])
        kind = rng.choice(3, n, p=[0.7, 0.15, 0.15])  # prompt, late, none
        delay = np.where(kind == 0, rng.uniform(1, 6 * 3600, n), rng.uniform(20, 40, n) * 3600)
        country = rng.choice(np.array(["US", "FR"]), n)
        out[model] = {"ts": ts, "scores": scores, "y": y, "kind": kind,
                      "label_ts": ts + delay, "country": country, "binary": k == 0}
    return out


def write_files(tmp_path: Path, data: dict[str, dict]) -> tuple[Path, Path, Path]:
    preds, labels = [], []
    for model, d in data.items():
        for i in range(len(d["ts"])):
            rec = {"id": f"{model}{i}", "model": model, "ts": float(d["ts"][i]),
                   "segment": {"country": str(d["country"][i])}}
            if d["binary"]:
                rec["prob"] = float(d["scores"][i])
            else:
                rec["probs"] = [float(v) for v in d["scores"][i]]
            preds.append(json.dumps(rec))
            if d["kind"][i] != 2:
                labels.append(json.dumps({"id": f"{model}{i}", "label": int(d["y"][i]),
                                          "ts": float(d["label_ts"][i])}))
    cfg = tmp_path / "config.yaml"
    cfg.write_text(CONFIG)
    p, lab = tmp_path / "p.jsonl", tmp_path / "l.jsonl"
    p.write_text("\n".join(preds) + "\n")
    lab.write_text("\n".join(labels) + "\n")
    return p, lab, cfg


def terms(d: dict, rows: np.ndarray):
    if d["binary"]:
        return binary_terms(d["scores"][rows], d["y"][rows])
    return multiclass_terms(d["scores"][rows], d["y"][rows])


def raw_confidence(d: dict) -> np.ndarray:
    """The score histogram's confidence: binary P(y=1), multiclass top-label."""
    return d["scores"] if d["binary"] else d["scores"].max(axis=1)


def psi(cur: np.ndarray, ref: np.ndarray) -> float | None:
    if cur.sum() == 0 or ref.sum() == 0:
        return None
    c = np.maximum(cur / cur.sum(), 1e-4)
    r = np.maximum(ref / ref.sum(), 1e-4)
    return float(np.sum((c - r) * np.log(c / r)))


def expected(data: dict[str, dict]) -> dict[tuple[str, str, float], dict]:
    """Per (model, segment, period start): the row the contract asks for."""
    out = {}
    for model, d in data.items():
        ts, period = d["ts"], np.floor(d["ts"] / DAY)
        # a label joins while its prediction has not expired on the model's clock (its
        # latest prediction ts read before the label): the prompt ones, and late ones
        # at the end of the data, where the clock stops
        clock_at = ts[np.searchsorted(ts, d["label_ts"], side="right") - 1]
        joins = (d["kind"] != 2) & (ts + TTL > clock_at)
        conf = raw_confidence(d)
        for seg in ("__all__", "country=FR", "country=US"):
            mine = (np.ones(len(ts), bool) if seg == "__all__"
                    else d["country"] == seg.split("=")[1])
            for k in np.unique(period[mine]):
                start, end = k * DAY, (k + 1) * DAY
                inside = mine & (period == k)
                done = inside & joins
                # as of period_end: the model's clock is its latest prediction before it
                clock = ts[ts < end].max()
                pending = inside & ~(joins & (d["label_ts"] < end)) & (ts + TTL > clock)
                top = (np.where(conf >= 0.5, conf, 1 - conf) if d["binary"] else conf)
                hist = np.bincount(right_closed_bins(conf[inside], 15), minlength=15)
                before = mine & (period == k - 1)
                ref = np.bincount(right_closed_bins(conf[before], 15), minlength=15)
                out[(model, seg, start)] = {
                    "end": end, "realized": expected_row(terms(d, np.flatnonzero(done)), 15, 1000)
                    if done.any() else None,
                    "pending": int(pending.sum()),
                    "estimated_accuracy": float(top[pending].mean()) if pending.any() else None,
                    "estimated_positive_rate": (float(conf[pending].mean())
                                                if pending.any() and d["binary"] else None),
                    "score_psi": psi(hist, ref)}
    return out


@pytest.fixture(scope="module")
def thirty_days(tmp_path_factory) -> tuple[dict, Path, Path, Path]:
    data = make_days(30)
    return (data, *write_files(tmp_path_factory.mktemp("every"), data))


@pytest.fixture(scope="module")
def want(thirty_days) -> dict[tuple[str, str, float], dict]:
    return expected(thirty_days[0])


def run_every(p: Path, lab: Path, cfg: Path) -> list[PeriodRow]:
    rows: list[PeriodRow] = []
    replay_mod.run(config_mod.load(str(cfg)), p, lab,
                   every=replay_mod.Every("1d", DAY, rows.append))
    return rows


def test_every_day_equals_numpy_on_each_period(thirty_days, want) -> None:
    data, p, lab, cfg = thirty_days
    got = {(r.row.model, r.row.segment, r.start): r for r in run_every(p, lab, cfg)}
    assert set(got) == set(want)  # a row for every period with a prediction, no other
    assert len({k[2] for k in got}) == 30
    older = 0
    for key, exp in want.items():
        r = got[key]
        row = {**r.row.stats.as_row(), **r.row.estimates.as_row()}
        assert r.end == exp["end"] and r.row.window == "1d"
        assert r.start % DAY == 0
        real = exp["realized"]
        assert row["samples"] == (0 if real is None else real["samples"]), key
        if real is not None:
            for name in METRICS:
                assert_close(row[name], real[name], 1e-9, f"{key} {name}")
        assert row["pending_samples"] == exp["pending"], key
        for name in ("estimated_accuracy", "estimated_positive_rate", "score_psi"):
            assert_close(row[name], exp[name], 1e-9, f"{key} {name}")
        assert row["estimate_basis"] == "raw"  # no calibrator in a plain replay
        # periods whose predictions had all expired or joined by the end of the replay
        older += exp["pending"] > 0 and r.end + TTL < T0 + 30 * DAY
    assert older > 100  # their estimates are kept as of their end, not lost to ttl
    # the short ttl expired some predictions of a period before its end
    d = data["ctr"]
    assert ((d["kind"] != 0) & (d["ts"] + TTL < np.ceil(d["ts"] / DAY) * DAY)).sum() > 100


@pytest.mark.slow
def test_memory_holds_only_the_open_periods(tmp_path: Path) -> None:
    """Peak traced memory while 10 and 40 days of the same daily traffic are fed (the
    files are read before): flat in the number of periods, and never more than the
    periods join.ttl keeps open."""
    peaks = []
    for days in (10, 40):
        data = make_days(days, per_day=100, seed=5)
        where = tmp_path / f"d{days}"
        where.mkdir()
        p, lab, cfg_path = write_files(where, data)
        cfg = config_mod.load(str(cfg_path))
        line = replay_mod.read(cfg, p, lab)
        got: Counter[str] = Counter()
        most_open = [0]
        engine = Engine(with_window(cfg, DAY, "1d"))
        # the rows only counted: what the replay itself holds is measured
        periods = Periods(engine, DAY, "1d", lambda _row, got=got: got.update(rows=1))
        tracemalloc.start()
        for i in range(0, len(line), replay_mod.BATCH):
            replay_mod._feed_all(engine, line, i, min(i + replay_mod.BATCH, len(line)), None,
                                 periods)
            most_open[0] = max(most_open[0], max((len(v) for v in periods.open.values()),
                                                 default=0))
        periods.finish(line)
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
        assert got["rows"] == 2 * 3 * days  # 2 models x 3 series x the days
        # a day is final 12 h after its end: at most the current day and the one before
        assert most_open[0] <= 2
    assert peaks[1] < 1.5 * peaks[0], peaks


def test_cli_every_json(capsys, thirty_days, want) -> None:
    data, p, lab, cfg = thirty_days
    rc = main(["replay", "--predictions", str(p), "--labels", str(lab), "-c", str(cfg),
               "--every", "1d", "--json"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    doc = json.loads(out)
    assert set(doc) == {"rows", "counters", "invalid_reasons"}
    n = sum(len(d["ts"]) for d in data.values())
    assert doc["counters"]["predictions"] == n
    assert doc["counters"]["joined"] == sum(e["realized"]["samples"]
                                            for (_, s, _), e in want.items()
                                            if s == "__all__" and e["realized"] is not None)
    assert len(doc["rows"]) == len(want)
    keys = [(r["model"], r["segment"], r["period_start"]) for r in doc["rows"]]
    assert keys == sorted(keys)
    for r in doc["rows"]:
        assert set(r) == ROW_KEYS | {"period_start", "period_end"}
        assert r["window"] == "1d" and r["period_end"] - r["period_start"] == DAY
        exp = want[(r["model"], r["segment"], r["period_start"])]
        assert r["pending_samples"] == exp["pending"]
        if exp["realized"] is not None:
            assert_close(r["ece"], exp["realized"]["ece"], 1e-9, "ece")
    # the table: one line per row, the period's start in the third column
    assert main(["replay", "--predictions", str(p), "--labels", str(lab), "-c", str(cfg),
                 "--every", "1d"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:4] == ["model", "segment", "period", "samples"]
    assert len([x for x in lines[1:] if x.strip() and "=" not in x.split()[0]]) == len(want)


@pytest.mark.parametrize("bad", ["1x", "0d", "30s", "2y"])
def test_cli_every_bad_duration_exits_2(capsys, thirty_days, bad: str) -> None:
    _, p, lab, cfg = thirty_days
    rc = main(["replay", "--predictions", str(p), "--labels", str(lab), "-c", str(cfg),
               "--every", bad])
    assert rc == 2
    assert capsys.readouterr().err.startswith("--every: ")


def test_html_draws_the_periods(capsys, thirty_days, want, tmp_path: Path) -> None:
    _, p, lab, cfg = thirty_days
    out = tmp_path / "r.html"
    rc = main(["replay", "--predictions", str(p), "--labels", str(lab), "-c", str(cfg),
               "--every", "1d", "--html", str(out)])
    assert rc == 0, capsys.readouterr().err
    text = out.read_text()
    assert "By period (every 1d)" in text
    # one dot per period with a value, on each line of each series' figure
    realized = sum(1 for e in want.values() if e["realized"] is not None)
    estimated = sum(1 for e in want.values() if e["estimated_accuracy"] is not None)
    assert text.count("<title>realized accuracy ") == realized
    assert text.count("<title>ECE ") == realized
    assert text.count("<title>estimated accuracy ") == estimated
    assert text.count("<polygon points=") == 6  # each series' estimate band
    assert text.count('aria-label="ctr / __all__ by period"') == 1


def test_every_with_recalibrate(capsys, tmp_path: Path) -> None:
    """``--recalibrate`` combines with ``--every``: the events, and the same rows."""
    data = make_days(6, seed=8)
    p, lab, cfg = write_files(tmp_path, data)
    want = expected(data)
    rc = main(["replay", "--predictions", str(p), "--labels", str(lab), "-c", str(cfg),
               "--every", "1d", "--json", "--recalibrate"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    doc = json.loads(out)
    assert "events" in doc
    assert len(doc["rows"]) == len(want) == 2 * 3 * 6
    for r in doc["rows"]:
        exp = want[(r["model"], r["segment"], r["period_start"])]
        if exp["realized"] is not None:
            for name in METRICS:
                assert_close(r[name], exp["realized"][name], 1e-9, name)
        assert r["pending_samples"] == exp["pending"]
        assert r["calibrated_ece"] is None and not math.isnan(r["period_start"])


MAP_CONFIG = """
join:
  ttl: 12h
metrics:
  windows: [1h, 24h, 60d]
  fine_bins: 200
segments:
  slices: [[country]]
estimates:
  min_samples: 100
  samples: 1000000
"""


def test_every_day_reads_the_map_as_of_each_period_end(tmp_path: Path) -> None:
    """With maps (min_samples 100, a 60-day window holding every labelled sample): each
    period's estimates and band are the contract's scikit-learn / numpy reference
    (``test_estmap.reference``) fitted on the samples joined by period_end, the series'
    own once it has 100 of them, before that its model's."""
    from tests.unit.engine.test_estmap import reference

    data = make_days(12, seed=9)
    p, lab, cfg = write_files(tmp_path, data)
    cfg.write_text(MAP_CONFIG)
    got = {(r.row.model, r.row.segment, r.start): r.row.estimates
           for r in run_every(p, lab, cfg)}
    bases: Counter[str] = Counter()
    for model, d in data.items():
        ts, period = d["ts"], np.floor(d["ts"] / DAY)
        clock_at = ts[np.searchsorted(ts, d["label_ts"], side="right") - 1]
        joins = (d["kind"] != 2) & (ts + TTL > clock_at)
        conf = raw_confidence(d)
        right = (d["y"] == 1) if d["binary"] else (d["scores"].argmax(axis=1) == d["y"])
        for seg in ("__all__", "country=FR", "country=US"):
            mine = (np.ones(len(ts), bool) if seg == "__all__"
                    else d["country"] == seg.split("=")[1])
            for k in np.unique(period[mine]):
                end = (k + 1) * DAY
                clock = ts[ts < end].max()
                inside = mine & (period == k)
                pending = inside & ~(joins & (d["label_ts"] < end)) & (ts + TTL > clock)
                fitted = joins & (d["label_ts"] < end)
                basis = ("series" if (fitted & mine).sum() >= 100 else
                         "model" if fitted.sum() >= 100 else "raw")
                e = got[(model, seg, k * DAY)]
                assert e.estimate_basis == basis and e.pending_samples == pending.sum(), (
                    model, seg, k, e.estimate_basis, basis)
                bases[basis] += 1
                if basis == "raw" or not pending.any():
                    continue
                use = fitted & mine if basis == "series" else fitted
                b = np.searchsorted(np.linspace(0, 1, 201)[1:-1], conf[use], side="left")
                sums = (np.bincount(b, minlength=200).astype(float),
                        np.bincount(b, conf[use], minlength=200),
                        np.bincount(b, right[use].astype(float), minlength=200))
                flip = ((conf[pending] < 0.5) if d["binary"]
                        else np.zeros(pending.sum(), bool)).astype(int)
                acc, pos, _var, lo, hi, _ = reference(*sums, conf[pending], flip)
                assert e.estimate_fit_samples == use.sum()
                where = f"{model} {seg} day {k}"
                assert_close(e.estimated_accuracy, acc, 1e-9, where)
                if d["binary"]:
                    assert_close(e.estimated_positive_rate, pos, 1e-9, where)
                assert_close(e.estimated_accuracy_lower, lo, 1e-9, where)
                assert_close(e.estimated_accuracy_upper, hi, 1e-9, where)
    assert bases["series"] > 30 and bases["model"] > 0, bases
