"""Group mode's tasks, in one process (contract §8): what one engine per partition costs
next to one engine for the same stream.

    python bench/tasks.py [--models 100] [--values 50] [--partitions 12]
                          [--pairs 200000] [--every 50000]

No broker. The stream of ``bench.fleet_scrape.batches`` (each label right after its
prediction) is fed twice, each in a fresh process: once into one ``Engine`` (the static
mode's instance), once split by partition (a hash of the id, as a producer keyed by
id) into ``--partitions`` engines (one member owning every task). Every ``--every``
input records a "checkpoint": each changed task's ``TaskLog.write`` (the changed
sections, encoded: the changelog's record values), its bytes counted and timed. Then
the incremental case: one more sample (one series) into one task, checkpointed; and a
full write of every task for comparison. At the end every task is restored from its
sections (decoded and assembled) into a new engine, without the broker's read; and
again from the local cache a restart reads (``calmon.io.taskcache``, in a temporary
directory).
Printed: the feed rate of both (records/s), the changelog bytes per checkpoint, the
small change vs the full write, the restore time, and the RSS growth of each
process. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import zlib
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.fleet_scrape import batches, config


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def split(data: list[Any], partitions: int, at_least: int) -> list[list[Any]]:
    """Each poll batch cut into one batch per partition (crc32 of the id, stable); a
    task's records are held until it has ``at_least`` of them (the last poll feeds
    what is left)."""
    from calmon.engine.rawbatch import RawBatch

    out = []
    held: list[list[Any]] = [[] for _ in range(partitions)]
    for k, b in enumerate(data):
        for r in b:
            rid = json.loads(r.value)["id"]
            held[zlib.crc32(rid.encode()) % partitions].append(r)
        last = k == len(data) - 1
        ready = [RawBatch.of(h) if h and (last or len(h) >= at_least) else None
                 for h in held]
        held = [[] if r is not None else h for h, r in zip(held, ready)]
        out.append(ready)
    return out


def _checkpoint(engines: list[Any], logs: list[Any], written: list[int]) -> tuple[int, int]:
    """Each changed task's write, as committed: (bytes, records)."""
    from calmon.io.changelog import _records

    n = records = 0
    for i, e in enumerate(engines):
        if e.version != written[i]:
            w = logs[i].write(e, {}, 0)
            for _, value, _ in _records(i, w):
                n += len(value or b"")
                records += 1
            logs[i].committed()
            written[i] = e.version
    return n, records


def run(args: argparse.Namespace, side: str) -> dict[str, Any]:
    from calmon.engine.engine import Engine
    from calmon.engine.records import Kind, Raw
    from calmon.io.changelog import Restored
    from calmon.tasklog import TaskLog

    cfg = config(args.values)
    data = batches(args.models, args.values, args.pairs)
    records = sum(len(b) for b in data)
    before = _rss()
    out: dict[str, Any] = {"side": side, "records": records}
    if side == "one":
        engine = Engine(cfg)
        t, c = time.perf_counter(), time.process_time()
        for b in data:
            engine.feed(b, not_after=2e9)
        out["feed_s"] = time.perf_counter() - t
        out["feed_cpu_s"] = time.process_time() - c
        out["rss"] = _rss() - before
        return out
    cut = split(data, args.partitions, args.task_batch)
    engines = [Engine(cfg) for _ in range(args.partitions)]
    logs = [TaskLog() for _ in engines]
    written = [-1] * args.partitions
    ckpt_bytes, ckpt_s, fed, feed_s, feed_cpu_s = [], [], 0, 0.0, 0.0
    for parts in cut:
        t, c = time.perf_counter(), time.process_time()
        for e, b in zip(engines, parts):
            if b is not None:
                e.feed(b, not_after=2e9)
        feed_s += time.perf_counter() - t
        feed_cpu_s += time.process_time() - c
        fed += sum(len(b) for b in parts if b is not None)
        if fed >= args.every:
            fed, t = 0, time.perf_counter()
            ckpt_bytes.append(_checkpoint(engines, logs, written)[0])
            ckpt_s.append(time.perf_counter() - t)
    _checkpoint(engines, logs, written)
    out["feed_s"] = feed_s
    out["feed_cpu_s"] = feed_cpu_s
    out["rss"] = _rss() - before
    # one more sample: one series (and its model's __all__) of one task changes
    one = {"id": "one-more", "model": "model-000", "ts": 1_764_460_800.0 + 14 * 86400 - 1,
           "prob": 0.5, "segment": {"country": "c1", "device": "d0"}}
    engines[0].feed([Raw(Kind.PREDICTION, json.dumps(one).encode()),
                     Raw(Kind.LABEL, json.dumps({"id": "one-more", "label": 1}).encode())],
                    not_after=2e9)
    t = time.perf_counter()
    small, small_records = _checkpoint(engines, logs, written)
    out.update(small_bytes=small, small_records=small_records,
               small_s=time.perf_counter() - t)
    # a full write of every task (a first checkpoint; every series changed)
    t = time.perf_counter()
    fresh = [TaskLog() for _ in engines]
    writes = [log.write(e, {}, 0, full=True) for log, e in zip(fresh, engines)]
    full_s = time.perf_counter() - t
    sections = [{k: v for k, v in w.sections.items() if v is not None} for w in writes]
    out.update(full_bytes=sum(len(v) for s in sections for v in s.values()),
               full_records=sum(len(s) for s in sections), full_s=full_s)
    t = time.perf_counter()
    for s in sections:
        TaskLog.restore(Engine(cfg), Restored(s, {}, [], "x:1", 0))
    out.update(restore_s=time.perf_counter() - t, ckpt_bytes=ckpt_bytes, ckpt_s=ckpt_s)
    out.update(_from_cache(cfg, sections))
    return out


def _from_cache(cfg: Any, sections: list[dict[str, bytes]]) -> dict[str, float]:
    """A restart from the local cache (``calmon.io.taskcache``): every task's sections
    written to a cache in a temporary ``state.dir`` (as after a restore), then loaded
    (each file read and checked against its digest) and restored into a new engine."""
    import tempfile

    from calmon.engine.engine import Engine
    from calmon.io.changelog import Restored
    from calmon.io.taskcache import TaskCache
    from calmon.tasklog import TaskLog

    with tempfile.TemporaryDirectory() as tmp:
        cache = TaskCache(tmp, "bench-changelog")
        t = time.perf_counter()
        for i, s in enumerate(sections):
            cache.adopt(i, Restored(s, dict.fromkeys(s, "x"), [["x", 1]], "x:1", 0, 0), 0)
        write_s = time.perf_counter() - t
        t = time.perf_counter()
        for i in range(len(sections)):
            cached = TaskCache(tmp, "bench-changelog").load(i)
            assert cached is not None
            TaskLog.restore(Engine(cfg), cached.restored())
        return {"cache_write_s": write_s, "cache_restore_s": time.perf_counter() - t}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", type=int, default=100)
    ap.add_argument("--values", type=int, default=50)
    ap.add_argument("--partitions", type=int, default=12)
    ap.add_argument("--pairs", type=int, default=200_000)
    ap.add_argument("--every", type=int, default=50_000)
    ap.add_argument("--task-batch", type=int, default=1,
                    help="feed a task once it holds this many records (1: every poll)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="alternate the two feeds this many times and print the median "
                         "ratio (one run on a shared machine ranges 0.7x-1.1x)")
    ap.add_argument("--child", choices=("one", "tasks"))
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(run(args, args.child)))
        return 0
    wall, cpu = [], []
    for _ in range(max(1, args.rounds)):
        rows = {}
        for side in ("one", "tasks"):
            # a child runs its one feed and returns before --rounds is read
            argv_ = [sys.executable, __file__, *(argv or sys.argv[1:]), "--child", side]
            rows[side] = json.loads(subprocess.run(argv_, capture_output=True, text=True,
                                                   check=True).stdout)
        one, tasks = rows["one"], rows["tasks"]
        wall.append(one["feed_s"] / tasks["feed_s"])
        cpu.append(one["feed_cpu_s"] / tasks["feed_cpu_s"])
    print(f"{args.models} models x {args.values} values, {args.partitions} partitions, "
          f"{one['records']:,} records")
    print(f"feed (last round): one engine {one['records'] / one['feed_s']:,.0f} rec/s, tasks "
          f"{tasks['records'] / tasks['feed_s']:,.0f} rec/s")
    print(f"ratio tasks / one engine, median of {len(wall)} alternated rounds: "
          f"{statistics.median(wall):.2f}x (rounds {', '.join(f'{r:.2f}' for r in wall)}); "
          f"in CPU time, which other processes on the machine disturb less: "
          f"{statistics.median(cpu):.2f}x (target >= 0.9x)")
    print(f"RSS growth: one engine {one['rss'] / 2**20:.0f} MiB, tasks "
          f"{tasks['rss'] / 2**20:.0f} MiB")
    cb = tasks["ckpt_bytes"]
    print(f"changelog per checkpoint of {args.every:,} records: "
          f"{', '.join(f'{b / 2**20:.1f} MiB' for b in cb)} "
          f"(encode {', '.join(f'{s:.2f}s' for s in tasks['ckpt_s'])})")
    print(f"one sample more (one series of one task): {tasks['small_bytes'] / 1024:.1f} KiB "
          f"in {tasks['small_records']} records, {tasks['small_s']:.3f}s")
    print(f"full write of every task: {tasks['full_bytes'] / 2**20:.1f} MiB in "
          f"{tasks['full_records']} records, encoded in {tasks['full_s']:.2f}s")
    print(f"restore of every task: {tasks['full_bytes'] / 2**20:.1f} MiB decoded and "
          f"restored in {tasks['restore_s']:.2f}s")
    print(f"restart from the local cache (state.dir): every task read, its digests "
          f"checked and restored in {tasks['cache_restore_s']:.2f}s, no changelog read "
          f"(the cache written whole in {tasks['cache_write_s']:.2f}s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
