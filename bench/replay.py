"""``calmon replay`` against the engine it drives, and the backtest against the replay.

    python bench/replay.py [--pairs N] [--repeat R] [--quick] [--only feed|backtest]

Prints, each the median of ``--repeat`` rounds (3), measured in the same run:

* **replay / engine**: ``calmon replay`` on N prediction/label pairs (1,000,000) in
  two JSONL files, as records/s, against the engine's own parse-and-feed rate on the
  same records in the same order and batches (``Engine.feed`` alone, the files
  already read and ordered); ratio = replay rate / engine rate, target >= 0.8. Twice:
  labels after their predictions, and with 30% of labels timed before their
  prediction (read first, so they wait for it in the join).
* **backtest / replay**: the wall time of ``replay --recalibrate`` over that of the
  plain replay on the same files (each with its final statistics, as the commands
  print them), target <= 2.0: 40 models x 10 segments over 30 days
  of event time (per-segment recalibration, checks every 5 minutes), and one 3-class
  model with 10 segments.

Workloads are synthetic and seeded: calibrated scores (no alarm fires, so the policy
does nothing but its checks), labels 1-60 minutes after their prediction. Nothing is
asserted; speed is measured and printed next to its target.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

try:
    import calmon  # noqa: F401
except ImportError:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

from calmon import replay
from calmon.config import Config, from_dict
from calmon.engine.engine import Engine

T0 = 1_764_460_800.0  # 2025-11-30T00:00:00Z
DAY = 86_400.0


def write_pairs(directory: Path, n: int, *, models: int, segments: int, days: float,
                classes: int = 2, early: float = 0.0, seed: int = 1) -> tuple[Path, Path]:
    """n predictions over ``days`` and their labels; ``early``: the share of labels
    timed before their prediction."""
    rng = np.random.default_rng(seed)
    ts = np.sort(T0 + rng.random(n) * days * DAY)
    model = rng.integers(0, models, n)
    seg = rng.integers(0, segments, n)
    delay = rng.uniform(60, 3600, n)
    delay[rng.random(n) < early] *= -1 / 60  # a second to a minute ahead
    if classes == 2:
        p = rng.beta(2, 5, n)
        y = (rng.random(n) < p).astype(int)
        scores = [f'"prob":{v:.6f}' for v in p.tolist()]
    else:
        z = rng.normal(0, 1.5, (n, classes))
        pr = np.exp(z) / np.exp(z).sum(axis=1, keepdims=True)
        y = (rng.random(n)[:, None] > pr.cumsum(axis=1)).sum(axis=1).clip(0, classes - 1)
        scores = ['"logits":[' + ",".join(f"{v:.4f}" for v in row) + "]" for row in z.tolist()]
    pred, lab = directory / "predictions.jsonl", directory / "labels.jsonl"
    with pred.open("w") as f:
        for i, (t, m, s, sc) in enumerate(zip(ts.tolist(), model.tolist(), seg.tolist(), scores)):
            f.write(f'{{"id":"r{i}","model":"m{m}","ts":{t:.3f},'
                    f'"segment":{{"country":"c{s}"}},{sc}}}\n')
    order = np.argsort(ts + delay, kind="stable")
    with lab.open("w") as f:
        for i in order.tolist():
            f.write(json.dumps({"id": f"r{i}", "label": int(y[i]),
                                "ts": round(float(ts[i] + delay[i]), 3)}) + "\n")
    return pred, lab


def config(per_segment: bool = False) -> Config:
    return from_dict({"segments": {"slices": [["country"]]},
                      "recalibration": {"per_segment": per_segment}})


def feed_only(cfg: Config, pred: Path, lab: Path) -> float:
    """The engine's parse-and-feed of the replay's batches, the files already read."""
    line = replay.read(cfg, pred, lab)
    batches = [line.batch(i, min(i + replay.BATCH, len(line)))
               for i in range(0, len(line), replay.BATCH)]
    engine = Engine(cfg)
    gc.collect()
    t = time.perf_counter()
    for b in batches:
        engine.feed(b)
    return time.perf_counter() - t


def timed(fn: Callable[..., object], *args: object) -> float:
    gc.collect()
    t = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t


def bench_feed(n: int, repeat: int) -> None:
    cfg = config()
    print(f"replay vs the engine's parse-and-feed, {n:,} pairs (median of {repeat})")
    print("labels            replay rec/s   engine rec/s   ratio  target")
    for early in (0.0, 0.3):
        with tempfile.TemporaryDirectory() as d:
            pred, lab = write_pairs(Path(d), n, models=1, segments=5, days=30, early=early)
            rounds = [(timed(replay.run, cfg, pred, lab), feed_only(cfg, pred, lab))
                      for _ in range(repeat)]
        full = statistics.median(r for r, _ in rounds)
        feed = statistics.median(f for _, f in rounds)
        name = "after predictions" if early == 0 else "30% first"
        print(f"{name:<17} {2 * n / full:>12,.0f}   {2 * n / feed:>12,.0f}   "
              f"{feed / full:>5.2f}  >= 0.8")


def bench_backtest(repeat: int, quick: bool, rows: int | None = None) -> None:
    print(f"\nreplay --recalibrate / plain replay, wall time (median of {repeat})")
    print("workload                         rows     replay s  backtest s  ratio  target")
    cases = [("40 models x 10 segments, 30 d", dict(models=40, segments=10, days=30), True),
             ("3-class, 10 segments, 30 d", dict(models=1, segments=10, days=30, classes=3),
              True)]
    rows = rows or (30_000 if quick else 300_000)
    for name, kw, per_segment in cases:
        cfg = config(per_segment)
        with tempfile.TemporaryDirectory() as d:
            pred, lab = write_pairs(Path(d), rows, **kw)  # type: ignore[arg-type]
            # both with their final statistics, as the two commands print them
            rounds = [(timed(replay.replay, cfg, pred, lab),
                       timed(replay.replay_recalibrate, cfg, pred, lab)) for _ in range(repeat)]
        plain = statistics.median(r for r, _ in rounds)
        back = statistics.median(b for _, b in rounds)
        print(f"{name:<30} {rows:>8,}   {plain:>8.2f}  {back:>10.2f}  {back / plain:>5.2f}  <= 2.0")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="100,000 pairs, small backtests")
    ap.add_argument("--backtest-rows", type=int, default=None,
                    help="rows of each backtest (300,000; --quick 30,000)")
    ap.add_argument("--only", choices=("feed", "backtest"))
    args = ap.parse_args()
    n = 100_000 if args.quick else args.pairs
    if args.only != "backtest":
        bench_feed(n, args.repeat)
    if args.only != "feed":
        bench_backtest(args.repeat, args.quick, args.backtest_rows)


if __name__ == "__main__":
    main()
