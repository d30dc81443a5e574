"""Engine throughput and memory benchmark.

    python bench/engine.py [--n N] [--pending N] [--repeat R] [--batch B] [--quick]
                           [--profile] [--mem-sites K] [--no-rss]

Prints, for binary (``prob``) and 10-class (``logits``) inputs:

* joined samples/s of the engine alone (records parsed up front with
  ``Parser.parse`` into the engine's columns, ``Parsed``; ``Engine.feed_parsed``
  timed over batches of ``--batch``
  records, by default 5,000: what one daemon poll (``MAX_RECORDS``) hands the
  engine when the consumer is saturated, the regime where the engine could
  bottleneck it), and once more over batches of 500 (a lightly loaded consumer,
  where per-batch costs weigh more);
* joined samples/s of parse + engine (``Engine.feed`` on ``Raw`` JSON bytes);
* baselines measured in the same rounds (a bare ``json.loads`` loop over the
  same bytes, ``Parser.parse`` alone, and ``BatchParser.parse`` alone over batches
  of ``--batch`` records), and the ratios engine rate / baseline;
* bytes per pending prediction: N predictions fed with no labels, retained
  memory measured with tracemalloc (and as an RSS delta in a fresh process).

The workload: one model, predictions with two segment keys (``country``,
``device``, 5 values each, the default ``segments.slices``), each prediction's
label arriving ``LAG`` records later, default config (windows 1h/24h/7d, 15 and
1000 bins, recalibration buffers on). Timings use ``time.perf_counter``; each is
the best of ``--repeat`` rounds, and every round runs every measurement once so
that a noisy neighbour slows the baselines and the engine alike. Speed is
measured and printed next to its target, never asserted.
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
from dataclasses import dataclass
from pathlib import Path

try:
    import calmon  # noqa: F401
except ImportError:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

from calmon.config import Config
from calmon.engine.engine import Engine
from calmon.engine.fastparse import BatchParser
from calmon.engine.parsed import Parsed
from calmon.engine.rawbatch import RawBatch
from calmon.engine.records import Kind, Label, Parser, Prediction, Raw

# issue 13's targets (binary, one core, 5,000-record batches)
TARGET_RATE = 600_000  # joined samples/s, engine alone
TARGET_FULL_RATE = 250_000  # joined samples/s, parse + engine
TARGET_BYTES = {False: 150, True: 300}  # bytes per pending prediction: binary, 10-class

BATCH = 5000  # records per feed call: calmon.daemon.MAX_RECORDS, one saturated poll
SMALL_BATCH = 500  # a lightly loaded consumer's polls
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


# ---------------------------------------------------------------- throughput


def run_json(values: list[bytes]) -> float:
    loads = json.loads
    t = time.perf_counter()
    for v in values:
        loads(v)
    return time.perf_counter() - t


def run_parser(raws: list[Raw], cfg: Config) -> float:
    parse = Parser(cfg.fields, cfg.kafka.max_record_bytes).parse
    t = time.perf_counter()
    for r in raws:
        parse(r)
    return time.perf_counter() - t


def run_batch_parser(chunks: list[list[Raw]], cfg: Config) -> float:
    parse = BatchParser(cfg.fields, cfg.kafka.max_record_bytes, cfg.limits,
                        cfg.kafka.max_clock_skew).parse
    t = time.perf_counter()
    for chunk in chunks:
        parse(chunk)
    return time.perf_counter() - t


def run_engine(chunks: list[list], cfg: Config, parsed: bool, expect: int) -> tuple[float, float]:
    """One fresh engine fed every chunk: (wall seconds, CPU seconds of this process)."""
    eng = Engine(cfg)
    feed = eng.feed_parsed if parsed else eng.feed
    gc.collect()
    c = time.process_time()
    t = time.perf_counter()
    for chunk in chunks:
        feed(chunk)
    dt = time.perf_counter() - t
    dc = time.process_time() - c
    joined = eng.counters["joined"]
    if joined != expect:  # a broken workload, not a slow one
        raise SystemExit(f"bench: expected {expect} joined samples, engine joined {joined}")
    return dt, dc


def parse_all(raws: list[Raw], cfg: Config) -> list[Prediction | Label]:
    parse = Parser(cfg.fields, cfg.kafka.max_record_bytes).parse
    out = []
    for r in raws:
        rec = parse(r)
        if not isinstance(rec, Prediction | Label):
            raise SystemExit(f"bench record rejected: {rec} {r.value!r}")
        out.append(rec)
    return out


def throughput(w: Workload, cfg: Config, repeat: int, batch: int,
               big_batch: int | None) -> dict[str, float]:
    """Best of ``repeat`` rounds; each round runs every measurement once, so the
    baselines and the engine see the same machine load and the ratios stay fair."""
    records = len(w.raws)
    values = [r.value for r in w.raws]
    parsed = parse_all(w.raws, cfg)
    # the engine's input: one poll's records as columns (calmon.engine.parsed.Parsed)
    parsed_chunks = [Parsed.from_records(c) for c in batches(parsed, batch)]
    raw_chunks = batches(w.raws, batch)
    # what the daemon hands the engine: a poll as columns (calmon.engine.rawbatch)
    column_chunks = [RawBatch.of(c) for c in raw_chunks]
    big_chunks = ([Parsed.from_records(c) for c in batches(parsed, big_batch)]
                  if big_batch else None)
    best = {k: float("inf")
            for k in ("json", "parse", "batch_parse", "alone", "alone_cpu", "full", "big")}
    for _ in range(repeat):
        gc.collect()
        best["json"] = min(best["json"], run_json(values))
        gc.collect()
        best["parse"] = min(best["parse"], run_parser(w.raws, cfg))
        gc.collect()
        best["batch_parse"] = min(best["batch_parse"], run_batch_parser(raw_chunks, cfg))
        wall, cpu = run_engine(parsed_chunks, cfg, True, w.predictions)
        best["alone"] = min(best["alone"], wall)
        best["alone_cpu"] = min(best["alone_cpu"], cpu)
        best["full"] = min(best["full"], run_engine(column_chunks, cfg, False, w.predictions)[0])
        if big_chunks is not None:
            best["big"] = min(best["big"], run_engine(big_chunks, cfg, True, w.predictions)[0])
    return {
        "json_rps": records / best["json"],
        "parse_rps": records / best["parse"],
        "batch_parse_rps": records / best["batch_parse"],
        "alone_sps": w.predictions / best["alone"],
        "alone_cpu_sps": w.predictions / best["alone_cpu"],
        "alone_rps": records / best["alone"],
        "full_sps": w.predictions / best["full"],
        "full_rps": records / best["full"],
        "big_sps": w.predictions / best["big"],
    }


# ---------------------------------------------------------------- memory


@dataclass(frozen=True)
class Pending:
    retained: float  # traced bytes still allocated per pending prediction
    peak: float  # traced peak per pending prediction (growth copies included)
    sites: list[tuple[float, str]]  # (bytes per pending, allocation site), largest first


def pending_tracemalloc(raws: list[Raw], cfg: Config, sites: int = 0) -> Pending:
    """Bytes per pending prediction, fed as JSON bytes (so the id strings the engine
    keeps are allocated, and counted, while tracing)."""
    chunks = batches(raws)
    eng = Engine(cfg)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot() if sites else None
        base = tracemalloc.get_traced_memory()[0]
        for chunk in chunks:
            eng.feed(chunk)
        gc.collect()
        cur, peak = tracemalloc.get_traced_memory()
        after = tracemalloc.take_snapshot() if sites else None
    finally:
        tracemalloc.stop()
    n = eng.join.pending
    if n != len(raws):
        raise SystemExit(f"bench: expected {len(raws)} pending, engine holds {n}")
    top: list[tuple[float, str]] = []
    if before is not None and after is not None:
        for st in after.compare_to(before, "lineno")[:sites]:
            if st.size_diff > 0:
                fr = st.traceback[0]
                where = f"{Path(fr.filename).name}:{fr.lineno}"
                top.append((st.size_diff / n, f"{where} ({st.count_diff:+,} blocks)"))
    return Pending((cur - base) / n, (peak - base) / n, top)


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
    """RSS delta per pending prediction, measured in a fresh process (no tracemalloc
    overhead, no freed memory from earlier runs to reuse); allocator slack included."""
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


def profile(n: int, batch: int, top: int = 30) -> None:
    """cProfile of the engine-alone binary path, sorted by own time."""
    cfg = Config()
    w = make_stream(n, multiclass=False)
    chunks = [Parsed.from_records(c) for c in batches(parse_all(w.raws, cfg), batch)]
    eng = Engine(cfg)
    prof = cProfile.Profile()
    prof.enable()
    for chunk in chunks:
        eng.feed_parsed(chunk)
    prof.disable()
    out = io.StringIO()
    stats = pstats.Stats(prof, stream=out)
    stats.sort_stats("tottime").print_stats(top)
    print(f"\n== cProfile: engine alone, binary, {n:,} predictions, batches of {batch} "
          f"(profiler overhead inflates Python-level calls) ==")
    print(out.getvalue())


# ---------------------------------------------------------------- main


def _fmt_rate(v: float) -> str:
    return f"{v:>12,.0f}"


def _met(ok: bool) -> str:
    return "MET" if ok else "NOT MET"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=None,
                    help="predictions per throughput run (default 200000; 10000 with --quick)")
    ap.add_argument("--pending", type=int, default=None,
                    help="predictions left pending for the memory runs "
                         "(default 200000; 20000 with --quick)")
    ap.add_argument("--repeat", type=int, default=None,
                    help="rounds per timing, best kept (default 3; 1 with --quick)")
    ap.add_argument("--batch", type=int, default=BATCH, help=f"records per feed (default {BATCH})")
    ap.add_argument("--quick", action="store_true", help="small sizes: a few seconds in all")
    ap.add_argument("--profile", action="store_true",
                    help="also print a cProfile of the engine-alone binary path")
    ap.add_argument("--mem-sites", type=int, default=0, metavar="K",
                    help="also print the K largest allocation sites per pending prediction")
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
    big = None if args.quick or args.batch <= SMALL_BATCH else SMALL_BATCH
    cfg = Config()

    print(f"calmon engine benchmark: python {platform.python_version()}, numpy {np.__version__}, "
          f"{platform.machine()}, {os.cpu_count()} cpus")
    print(f"workload: {n:,} predictions + {n:,} labels (label {LAG} records after its "
          f"prediction), batches of {args.batch}, segments country x device (5 x 5), "
          f"default config, best of {repeat}")

    for multiclass in (False, True):
        w = make_stream(n, multiclass)
        r = throughput(w, cfg, repeat, args.batch, big)
        print(f"\n== {w.name}: {len(w.raws):,} records ==")
        print(f"  baseline json.loads        {_fmt_rate(r['json_rps'])} records/s")
        print(f"  baseline Parser.parse      {_fmt_rate(r['parse_rps'])} records/s   "
              f"({r['parse_rps'] / r['json_rps']:.2f}x json.loads)")
        print(f"  baseline BatchParser.parse {_fmt_rate(r['batch_parse_rps'])} records/s   "
              f"({r['batch_parse_rps'] / r['json_rps']:.2f}x json.loads, "
              f"{r['batch_parse_rps'] / r['parse_rps']:.2f}x Parser.parse)")
        target = full_target = ""
        if not multiclass:
            target = (f"   target >= {TARGET_RATE:,} samples/s: "
                      f"{_met(r['alone_sps'] >= TARGET_RATE)}")
            full_target = (f"   target >= {TARGET_FULL_RATE:,} samples/s: "
                           f"{_met(r['full_sps'] >= TARGET_FULL_RATE)}")
        print(f"  engine alone (feed_parsed) {_fmt_rate(r['alone_sps'])} joined samples/s "
              f"({r['alone_rps']:,.0f} records/s, {r['alone_sps'] / r['json_rps']:.2f}x "
              f"json.loads; CPU-time rate {r['alone_cpu_sps']:,.0f}/s){target}")
        print(f"  parse + engine (feed)      {_fmt_rate(r['full_sps'])} joined samples/s "
              f"({r['full_rps']:,.0f} records/s, {r['full_sps'] / r['json_rps']:.2f}x "
              f"json.loads){full_target}")
        if big is not None:
            print(f"  engine alone, batches of {big:,} (a lightly loaded consumer)   "
                  f"{r['big_sps']:,.0f} joined samples/s "
                  f"({r['big_sps'] / r['json_rps']:.2f}x json.loads)")

    print(f"\n== memory per pending prediction: {pending_n:,} predictions, no labels ==")
    for multiclass in (False, True):
        name = f"{CLASSES}-class logits" if multiclass else "binary prob"
        m = pending_tracemalloc(make_predictions(pending_n, multiclass), cfg, args.mem_sites)
        line = (f"  {name:<17} tracemalloc {m.retained:7.1f} B/pending (peak {m.peak:7.1f})"
                f"   target <= {TARGET_BYTES[multiclass]} B: "
                f"{_met(m.retained <= TARGET_BYTES[multiclass])}")
        if not args.no_rss and not args.quick:
            rss = pending_rss(pending_n, multiclass)
            line += "   RSS delta " + ("n/a" if rss is None else f"{rss:.0f} B/pending")
        print(line)
        for size, where in m.sites:
            print(f"      {size:7.1f} B/pending  {where}")

    if args.profile:
        profile(n, args.batch)
    return 0


if __name__ == "__main__":
    sys.exit(main())
