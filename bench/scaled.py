"""Scaled out, in one process: what the joined topic costs next to the engine (contract §7).

    python bench/scaled.py [--models 100] [--values 50] [--pairs N] [--every K]
                           [--rows false,true] [--quick]

No broker, no threads. A fleet of ``--models`` models with one slice (``country``,
``--values`` values, so 1 + values series a model) is fed as JSON records through
``Engine.feed`` in polls of 5,000 records (``bench.fleet_scrape.batches``: each label
right after its prediction, times over the last hour). Every ``--every`` input records
(a "checkpoint"), what the daemon's checkpoint and the owner's thread do with the
joined samples, each timed on its own:

* **collect+encode**: ``JoinedSender.collect(engine, positions)`` (every buffered
  series' new samples into one columnar batch per model) and ``flush`` into a list,
  the stand-in for ``kafka.joined_topic``;
* **decode+accept**: ``Owner.accept`` of every record of that list (decode, dedup by
  source offsets, extend the owner's rings); this one owner owns every model;
* **check**: one ``Owner.check()``, the recalibration ``Policy`` (default settings, an
  in-memory ``Registry(None)``) over every series the owner holds;
* **calibrated**: ``Owner.calibrated()``, which the owner's thread runs after each
  check (``Cluster._check``).

One row per value of ``recalibration.per_segment`` (false: only a model's ``__all__``
series is buffered and sent; true: all of its series), each in a fresh process. The
first checkpoint interval, where every series is first seen (its engine and owner
rings allocated), is reported apart in seconds; the per-sample table is over the
checkpoints after it: the engine's feed time per joined sample (the baseline,
measured in the same run), each overhead per joined sample and as a ratio of the
engine time, joined-topic bytes per joined sample, and batches per checkpoint.
The check and ``collect`` cost per series per call, not per sample (the daemon
collects every ``state.checkpoint_interval``, checks every
``recalibration.interval``), so their ratios scale with 1 / ``--every``; the per
checkpoint milliseconds are printed too. Also printed: the RSS growth of the row's
process over the feed. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import subprocess
import sys
import time
import zlib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
try:
    import calmon  # noqa: F401
except ImportError:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, str(ROOT))
if str(ROOT) not in sys.path:  # for bench.fleet_scrape when run as a script
    sys.path.append(str(ROOT))

from bench.fleet_scrape import batches  # noqa: E402

PARTITIONS = 12  # joined-topic partitions the models' keys spread over (all owned here)
PAIRS = 50_000  # default: ~20 s for both rows on a 2-vCPU VM (most of it the first interval)
QUICK = {"pairs": 40_000, "models": 20}  # ~5 s: the 100-model first interval alone is ~10 s
EVERY = 20_000  # input records (10,000 joined pairs) between checkpoints
STEPS = ("feed", "collect", "accept", "check", "calibrated")


def config(values: int, per_segment: bool) -> Any:
    from calmon.config import from_dict

    # max_series above 100 x 51 (the default 5,000 would fold the last models'
    # segments into __other__); recalibration otherwise at its defaults
    return from_dict({"segments": {"slices": [["country"]], "max_values": values},
                      "limits": {"max_models": 1000, "max_series": 200_000},
                      "recalibration": {"enabled": True, "per_segment": per_segment}})


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def run(models: int, values: int, pairs: int, per_segment: bool, every: int
        ) -> dict[str, Any]:
    """One row, in this process: a list of per-checkpoint timings and counts."""
    from calmon.cluster.owner import Owner
    from calmon.cluster.sender import JoinedSender
    from calmon.engine.engine import Engine
    from calmon.recal.policy import Policy
    from calmon.recal.registry import Registry

    data = batches(models, values, pairs)
    cfg = config(values, per_segment)
    gc.collect()
    rss0 = _rss()
    engine = Engine(cfg)
    sender = JoinedSender(0, cfg.recalibration.buffer)
    owner = Owner(Policy(cfg, Registry(None)), cfg.recalibration.buffer)
    offsets = [0] * PARTITIONS  # the joined topic's next offset per partition
    checkpoints: list[dict[str, Any]] = []
    cur = dict.fromkeys(STEPS, 0.0)
    records = since = joined = events = 0

    def checkpoint() -> None:
        nonlocal cur, joined, events
        # one input partition per kind, at the records fed so far (the generator's
        # batches alternate prediction, label)
        positions = {("predictions", 0): records // 2, ("labels", 0): records // 2}
        topic: list[tuple[bytes, bytes]] = []

        def send(recs: list[tuple[bytes, bytes]]) -> bool:  # the broker acknowledges all
            topic.extend(recs)
            return True

        t0 = time.perf_counter()
        sender.collect(engine, positions)
        sender.flush(send)
        t1 = time.perf_counter()
        for key, value in topic:
            p = zlib.crc32(key) % PARTITIONS  # keyed by model
            owner.accept(p, offsets[p], value)
            offsets[p] += 1
        t2 = time.perf_counter()
        events += len(owner.check())
        t3 = time.perf_counter()
        owner.calibrated()
        t4 = time.perf_counter()
        cur.update(collect=t1 - t0, accept=t2 - t1, check=t3 - t2, calibrated=t4 - t3)
        now = engine.counters["joined"]
        cur.update(joined=now - joined, batches=len(topic),
                   bytes=sum(len(v) for _k, v in topic))
        checkpoints.append(cur)
        cur, joined = dict.fromkeys(STEPS, 0.0), now

    for b in data:
        t0 = time.perf_counter()
        engine.feed(b)
        cur["feed"] += time.perf_counter() - t0
        records += len(b)
        since += len(b)
        if since >= every:
            checkpoint()
            since = 0
    if since:
        checkpoint()
    gc.collect()
    return {"per_segment": per_segment, "checkpoints": checkpoints,
            "rss": _rss() - rss0, "series": len(owner.rings), "events": events,
            "accepted": owner.accepted}


def run_child(args: argparse.Namespace, per_segment: bool) -> dict[str, Any]:
    """``run`` in a fresh process (so no row reuses memory another freed)."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child",
           str(per_segment).lower(), "--models", str(args.models), "--values",
           str(args.values), "--pairs", str(args.pairs), "--every", str(args.every)]
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=str(ROOT))
    if res.returncode:
        sys.stderr.write(res.stderr[-3000:])
        raise SystemExit(f"the per_segment {str(per_segment).lower()} run failed")
    out: dict[str, Any] = json.loads(res.stdout.strip().splitlines()[-1])
    return out


# ---------------------------------------------------------------- tables


def _sum(cps: list[dict[str, Any]], key: str) -> float:
    return float(sum(c[key] for c in cps))


def print_tables(rows: list[dict[str, Any]]) -> None:
    head = ("per_segment", "series sent", "engine µs/sample",
            "collect+encode µs/sample (x engine)", "decode+accept (x engine)",
            "check (x engine)", "calibrated (x engine)", "joined-topic bytes/sample",
            "batches/checkpoint")
    print("\nAfter the first checkpoint, per joined sample:\n")
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for r in rows:
        cps = r["checkpoints"][1:] or r["checkpoints"]
        n = max(_sum(cps, "joined"), 1.0)
        feed = _sum(cps, "feed")
        cells = [str(r["per_segment"]).lower(), f"{r['series']:,}", f"{feed / n * 1e6:.1f}"]
        for step in STEPS[1:]:
            t = _sum(cps, step)
            cells.append(f"{t / n * 1e6:.2f} ({t / feed:.3f}x)")
        cells += [f"{_sum(cps, 'bytes') / n:.1f}",
                  f"{_sum(r['checkpoints'], 'batches') / len(r['checkpoints']):.0f}"]
        print("| " + " | ".join(cells) + " |")
    head2 = ("per_segment", "samples/checkpoint", "collect+encode ms", "decode+accept ms",
            "check ms", "calibrated ms", "first interval: engine / collect / accept / "
            "check / calibrated s", "RSS growth")
    print("\nPer checkpoint after the first (mean), the first interval, memory:\n")
    print("| " + " | ".join(head2) + " |")
    print("|" + "---|" * len(head2))
    for r in rows:
        cps = r["checkpoints"][1:] or r["checkpoints"]
        k = len(cps)
        first = r["checkpoints"][0]
        cells = [str(r["per_segment"]).lower(), f"{_sum(cps, 'joined') / k:,.0f}"]
        cells += [f"{_sum(cps, step) / k * 1e3:.1f}" for step in STEPS[1:]]
        cells.append(" / ".join(f"{first[step]:.2f}" for step in STEPS))
        cells.append(f"{r['rss'] / 2**20:,.0f} MiB")
        print("| " + " | ".join(cells) + " |")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", type=int, default=None, help="default 100 (--quick 20)")
    ap.add_argument("--values", type=int, default=50)
    ap.add_argument("--pairs", type=int, default=None,
                    help=f"prediction+label pairs (default {PAIRS:,}, --quick "
                         f"{QUICK['pairs']:,})")
    ap.add_argument("--every", type=int, default=EVERY,
                    help="input records between checkpoints (default %(default)s)")
    ap.add_argument("--rows", default="false,true",
                    help="recalibration.per_segment of each row (default %(default)s)")
    ap.add_argument("--quick", action="store_true",
                    help="a ~5 s smoke run: 20 models, 40,000 pairs")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.models = args.models or (QUICK["models"] if args.quick else 100)
    args.pairs = args.pairs or (QUICK["pairs"] if args.quick else PAIRS)
    if args.child:
        print(json.dumps(run(args.models, args.values, args.pairs, args.child == "true",
                             args.every)))
        return 0
    print(f"{args.models} models x {args.values} values (one slice), {args.pairs:,} pairs "
          f"in polls of 5,000 records, a checkpoint every {args.every:,} records; "
          f"Python {platform.python_version()}, {os.cpu_count()} CPUs, load average "
          f"{os.getloadavg()[0]:.1f}")
    rows = []
    for v in args.rows.split(","):
        ps = v.strip().lower() in ("true", "1", "yes")
        t = time.perf_counter()
        r = run_child(args, ps)
        print(f"  per_segment {str(ps).lower()}: {time.perf_counter() - t:.1f} s, "
              f"{len(r['checkpoints'])} checkpoints, {r['accepted']:,} samples taken by "
              f"the owner over {r['series']:,} series, {r['events']} policy events",
              flush=True)
        rows.append(r)
    print_tables(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
