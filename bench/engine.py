"""Engine throughput and memory benchmark.

    python bench/engine.py [--n N] [--pending N] [--repeat R] [--quick] [--profile]

Prints, for binary (``prob``) and 10-class (``logits``) inputs:

* joined samples/s of the engine alone (records parsed up front with
  ``Parser.parse``; ``Engine.feed_parsed`` timed over batches of ~500 records);
* joined samples/s of parse + engine (``Engine.feed`` on ``Raw`` JSON bytes);
* baselines measured in the same run (a bare ``json.loads`` loop over the same
  bytes, and ``Parser.parse`` alone), and the ratios engine rate / baseline rate;
* bytes per pending prediction: N predictions fed with no labels, retained
  memory measured with tracemalloc (and as an RSS delta in a fresh process).

The workload: one model, predictions with two segment keys (``country``,
``device``, 5 values each, the default ``segments.slices``), each prediction's
label arriving ``LAG`` records later, default config (windows 1h/24h/7d, 15 and
1000 bins). Timings use ``time.perf_counter``; each is the best of ``--repeat``
runs. Speed is measured and printed next to its target, never asserted.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import json
import os
import platform
import pstats
import random
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

try:
    import calmon  # noqa: F401
except ImportError:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

from calmon.config import Config
from calmon.engine.engine import Engine
from calmon.engine.records import Kind, Label, Parser, Prediction, Raw

TARGET_RATE = 300_000  # joined samples/s, engine alone, binary, one core
TARGET_BYTES = 300  # bytes per pending prediction

BATCH = 500  # records per feed call
LAG = 200  # a prediction's label arrives this many records after it
EVENT_RATE = 1000.0  # predictions per second of event time
T0 = 1_700_000_000.0
COUNTRIES = ("US", "DE", "FR", "BR", "IN")
DEVICES = ("ios", "android", "web", "tv", "other")
CLASSES = 10


@dataclass(frozen=True)
class Workload:
    name: str
    raws: list[Raw]  # predictions interleaved with their labels, in stream order
    predictions: int
    labels: int


def _prediction(rng: random.Random, i: int, multiclass: bool) -> tuple[bytes, int, float]:
    ts = round(T0 + i / EVENT_RATE, 3)
    rec: dict = {
        "id": f"req-{i:06d}",
        "model": "cls-v1" if multiclass else "ctr-v1",
        "ts": ts,
        "segment": {"country": rng.choice(COUNTRIES), "device": rng.choice(DEVICES)},
    }
    if multiclass:
        logits = [round(rng.gauss(0.0, 2.0), 4) for _ in range(CLASSES)]
        rec["logits"] = logits
        top = max(range(CLASSES), key=logits.__getitem__)
        y = top if rng.random() < 0.7 else rng.randrange(CLASSES)
    else:
        p = round(rng.betavariate(2.0, 5.0), 6)
        rec["prob"] = p
        y = int(rng.random() < min(1.0, p * 1.1))
    return json.dumps(rec, separators=(",", ":")).encode(), y, ts


def _label(i: int, y: int, ts: float, multiclass: bool) -> bytes:
    rec = {"id": f"req-{i:06d}", "model": "cls-v1" if multiclass else "ctr-v1",
           "label": y, "ts": round(ts + LAG / EVENT_RATE + 0.5, 3)}
    return json.dumps(rec, separators=(",", ":")).encode()


def make_stream(n: int, multiclass: bool, seed: int = 7) -> Workload:
    """n predictions, each followed LAG records later by its label."""
    rng = random.Random(seed)
    raws: list[Raw] = []
    waiting: list[tuple[int, int, float]] = []
    for i in range(n):
        value, y, ts = _prediction(rng, i, multiclass)
        raws.append(Raw(Kind.PREDICTION, value, None, f"bench/0/{len(raws)}"))
        waiting.append((i, y, ts))
        if i >= LAG:
            j, yj, tj = waiting[i - LAG]
            raws.append(Raw(Kind.LABEL, _label(j, yj, tj, multiclass), None,
                            f"bench/1/{len(raws)}"))
    for j, yj, tj in waiting[max(0, n - LAG):]:
        raws.append(Raw(Kind.LABEL, _label(j, yj, tj, multiclass), None, f"bench/1/{len(raws)}"))
    name = f"{CLASSES}-class logits" if multiclass else "binary prob"
    return Workload(name, raws, n, n)


def make_predictions(n: int, multiclass: bool, seed: int = 11) -> list[Raw]:
    rng = random.Random(seed)
    return [Raw(Kind.PREDICTION, _prediction(rng, i, multiclass)[0], None, "")
            for i in range(n)]


def batches(items: list, size: int = BATCH) -> list[list]:
    return [items[i:i + size] for i in range(0, len(items), size)]


def best_of(repeat: int, run: Callable[[], float]) -> float:
    """The smallest of ``repeat`` wall times returned by ``run``."""
    best = float("inf")
    for _ in range(repeat):
        gc.collect()
        best = min(best, run())
    return best


# ---------------------------------------------------------------- throughput


def time_json(raws: list[Raw], repeat: int) -> float:
    values = [r.value for r in raws]

    def run() -> float:
        loads = json.loads
        t = time.perf_counter()
        for v in values:
            loads(v)
        return time.perf_counter() - t

    return best_of(repeat, run)


def time_parser(raws: list[Raw], cfg: Config, repeat: int) -> float:
    parse = Parser(cfg.fields, cfg.kafka.max_record_bytes).parse

    def run() -> float:
        t = time.perf_counter()
        for r in raws:
            parse(r)
        return time.perf_counter() - t

    return best_of(repeat, run)


def parse_all(raws: list[Raw], cfg: Config) -> list[Prediction | Label]:
    parse = Parser(cfg.fields, cfg.kafka.max_record_bytes).parse
    out = []
    for r in raws:
        rec = parse(r)
        if not isinstance(rec, Prediction | Label):
            raise SystemExit(f"bench record rejected: {rec} {r.value!r}")
        out.append(rec)
    return out


def time_engine(chunks: list[list], cfg: Config, parsed: bool, repeat: int,
                expect: int) -> float:
    def run() -> float:
        eng = Engine(cfg)
        feed = eng.feed_parsed if parsed else eng.feed
        t = time.perf_counter()
        for chunk in chunks:
            feed(chunk)
        dt = time.perf_counter() - t
        joined = eng.counters["joined"]
        if joined != expect:  # a broken workload, not a slow one
            raise SystemExit(f"bench: expected {expect} joined samples, engine joined {joined}")
        return dt

    return best_of(repeat, run)


def throughput(w: Workload, cfg: Config, repeat: int) -> dict[str, float]:
    records = len(w.raws)
    t_json = time_json(w.raws, repeat)
    t_parse = time_parser(w.raws, cfg, repeat)
    parsed_chunks = batches(parse_all(w.raws, cfg))
    raw_chunks = batches(w.raws)
    t_alone = time_engine(parsed_chunks, cfg, True, repeat, w.predictions)
    t_full = time_engine(raw_chunks, cfg, False, repeat, w.predictions)
    return {
        "json_rps": records / t_json,
        "parse_rps": records / t_parse,
        "alone_sps": w.predictions / t_alone,
        "alone_rps": records / t_alone,
        "full_sps": w.predictions / t_full,
        "full_rps": records / t_full,
    }


# ---------------------------------------------------------------- memory


def pending_tracemalloc(raws: list[Raw], cfg: Config) -> tuple[float, float, int]:
    """Retained and peak traced bytes per pending prediction, fed as JSON bytes
    (so the id strings the engine keeps are allocated, and counted, while tracing)."""
    chunks = batches(raws)
    eng = Engine(cfg)
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        for chunk in chunks:
            eng.feed(chunk)
        gc.collect()
        cur, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    pending = eng.join.pending
    if pending != len(raws):
        raise SystemExit(f"bench: expected {len(raws)} pending, engine holds {pending}")
    return (cur - base) / pending, (peak - base) / pending, pending


def _rss_bytes() -> int | None:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, AttributeError):
        return None


def pending_rss_child(n: int, multiclass: bool) -> None:
    """Run in a fresh process: print the RSS delta per pending prediction."""
    cfg = Config()
    chunks = batches(make_predictions(n, multiclass))
    eng = Engine(cfg)
    eng.feed(make_predictions(10, multiclass, seed=99))  # warm code paths and imports
    gc.collect()
    before = _rss_bytes()
    for chunk in chunks:
        eng.feed(chunk)
    gc.collect()
    after = _rss_bytes()
    if before is None or after is None:
        print("nan")
    else:
        print((after - before) / max(1, eng.join.pending - 10))


def pending_rss(n: int, multiclass: bool) -> float | None:
    cmd = [sys.executable, os.path.abspath(__file__), "--rss-child", str(n)]
    if multiclass:
        cmd.append("--multiclass")
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=True)
        v = float(out.stdout.strip().splitlines()[-1])
    except (subprocess.SubprocessError, ValueError, IndexError, OSError):
        return None
    return None if v != v else v


# ---------------------------------------------------------------- profile


def profile(n: int, top: int = 30) -> None:
    """cProfile of the engine-alone binary path, sorted by own time."""
    cfg = Config()
    w = make_stream(n, multiclass=False)
    chunks = batches(parse_all(w.raws, cfg))
    eng = Engine(cfg)
    prof = cProfile.Profile()
    prof.enable()
    for chunk in chunks:
        eng.feed_parsed(chunk)
    prof.disable()
    out = io.StringIO()
    stats = pstats.Stats(prof, stream=out)
    stats.sort_stats("tottime").print_stats(top)
    print(f"\n== cProfile: engine alone, binary, {n:,} predictions "
          f"(profiler overhead inflates Python-level calls) ==")
    print(out.getvalue())


# ---------------------------------------------------------------- main


def _fmt_rate(v: float) -> str:
    return f"{v:>12,.0f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=None,
                    help="predictions per throughput run (default 200000; 10000 with --quick)")
    ap.add_argument("--pending", type=int, default=None,
                    help="predictions left pending for the memory runs (default 200000)")
    ap.add_argument("--repeat", type=int, default=None, help="runs per timing, best kept")
    ap.add_argument("--quick", action="store_true", help="small sizes: a few seconds in all")
    ap.add_argument("--profile", action="store_true",
                    help="also print a cProfile of the engine-alone binary path")
    ap.add_argument("--no-rss", action="store_true", help="skip the RSS subprocess runs")
    ap.add_argument("--rss-child", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--multiclass", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.rss_child is not None:
        pending_rss_child(args.rss_child, args.multiclass)
        return 0

    n = args.n or (10_000 if args.quick else 200_000)
    pending_n = args.pending or (20_000 if args.quick else 200_000)
    repeat = args.repeat or (1 if args.quick else 3)
    cfg = Config()

    print(f"calmon engine benchmark: python {platform.python_version()}, numpy {np.__version__}, "
          f"{platform.machine()}, {os.cpu_count()} cpus")
    print(f"workload: {n:,} predictions + {n:,} labels (label {LAG} records after its "
          f"prediction), batches of {BATCH}, segments country x device (5 x 5), "
          f"default config, best of {repeat}")

    results = {}
    for multiclass in (False, True):
        w = make_stream(n, multiclass)
        r = throughput(w, cfg, repeat)
        results[multiclass] = r
        print(f"\n== {w.name}: {len(w.raws):,} records ==")
        print(f"  baseline json.loads        {_fmt_rate(r['json_rps'])} records/s")
        print(f"  baseline Parser.parse      {_fmt_rate(r['parse_rps'])} records/s   "
              f"({r['parse_rps'] / r['json_rps']:.2f}x json.loads)")
        target = ""
        if not multiclass:
            met = "MET" if r["alone_sps"] >= TARGET_RATE else "NOT MET"
            target = f"   target > {TARGET_RATE:,} samples/s: {met}"
        print(f"  engine alone (feed_parsed) {_fmt_rate(r['alone_sps'])} joined samples/s "
              f"({r['alone_rps']:,.0f} records/s, {r['alone_sps'] / r['json_rps']:.2f}x "
              f"json.loads){target}")
        print(f"  parse + engine (feed)      {_fmt_rate(r['full_sps'])} joined samples/s "
              f"({r['full_rps']:,.0f} records/s, {r['full_sps'] / r['json_rps']:.2f}x "
              f"json.loads)")

    print(f"\n== memory per pending prediction: {pending_n:,} predictions, no labels ==")
    for multiclass in (False, True):
        name = f"{CLASSES}-class logits" if multiclass else "binary prob"
        per, peak, _ = pending_tracemalloc(make_predictions(pending_n, multiclass), cfg)
        met = "MET" if per < TARGET_BYTES else "NOT MET"
        line = (f"  {name:<17} tracemalloc {per:7.1f} B/pending (peak {peak:7.1f})"
                f"   target < {TARGET_BYTES} B: {met}")
        if not args.no_rss and not args.quick:
            rss = pending_rss(pending_n, multiclass)
            line += "   RSS delta " + ("n/a" if rss is None else f"{rss:.0f} B/pending")
        print(line)

    if args.profile:
        profile(n)
    return 0


if __name__ == "__main__":
    sys.exit(main())
