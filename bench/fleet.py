"""A fleet on one instance: what series cost in memory and in checkpoints.

    python bench/fleet.py [--before COMMIT] [--no-before] [--full] [--only NAME,...]

Each workload is fed to a fresh ``Engine`` in a fresh process (so no freed memory of
an earlier run is reused), by ``Engine.feed`` on JSON records in batches of 5,000
(predictions, each label right after), then measured:

* **RSS growth** over the feed (``/proc/self/statm``, after ``gc.collect()``;
  allocator slack included, as the container sees it), and per series: the state
  (windows, histograms, joins, index), not the read model of a view;
* **checkpoint**: the bytes of one ``CheckpointStore.save`` of the engine's snapshot,
  and its write time (snapshot + encode + fsync'd atomic write; best of 3).

Workloads (default windows 1h/24h/7d, 15 bins, 1,000 fine bins, slices
``[[country], [device]]`` with 50 values each, so 101 series a model):

* ``sparse-1k`` / ``sparse-10k``: 10 / 99 models (1,010 / 9,999 series), 150
  records a model, so 3 samples in each country and device series; their times
  cover every bucket of every window (a third over the 7 days, a third over the
  last day, a third over the last hour);
* ``week-8x50``: 8 models x 50 values (808 series), 35,000 records spread the same
  way: samples in every bucket of the week (the issue's report: +2.9 GiB, 686 MiB);
* ``busy``: 10 series (no slices) with 1,500 samples in every bucket of every
  window, so every bucket is full (dense): the per-series ceiling (fed in time
  order with ``join.ttl`` 1m, so the joined ids remembered for duplicates stay
  few and the growth is the series').

"before" is the same measurement on the code of another commit (default: the
one before issue 19's sparse state), checked out in a temporary ``git worktree``
and put first on ``PYTHONPATH``. The before runs of ``sparse-10k`` need ~10 GB and
are skipped unless ``--full``. Scrape timing of a fleet (issue 20) belongs here
too: add it as one more measurement function and a column.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BEFORE = "3743a54"  # main when issue 19 started: dense buckets, format 1 checkpoints
T_END = 1_764_460_800.0 + 14 * 86400  # "now" of every workload
BATCH = 5000
HOUR, DAY, WEEK = 3600.0, 86400.0, 7 * 86400.0

# ---------------------------------------------------------------- workloads


def _records(models: int, per_model: int, values: int = 50) -> Iterator[list[Any]]:
    """Batches of records of ``models`` models, ``per_model`` each, segments spread
    evenly over ``values`` countries and devices, times over every window's buckets."""
    import random

    from calmon.engine.records import Kind, Raw

    rng = random.Random(19)
    batch: list[Any] = []
    for m in range(models):
        for i in range(per_model):
            span = (WEEK, DAY, HOUR)[i % 3]
            ts = T_END - span * ((i * 0.618034) % 1.0)  # evenly spread, deterministic
            pid = f"m{m}-{i}"
            rec = {"id": pid, "model": f"model-{m}", "ts": ts, "prob": rng.random(),
                   "segment": {"country": f"c{i % values}", "device": f"d{(i // values) % values}"}}
            batch.append(Raw(Kind.PREDICTION, json.dumps(rec).encode()))
            lab = {"id": pid, "label": rng.randrange(2)}
            batch.append(Raw(Kind.LABEL, json.dumps(lab).encode()))
            if len(batch) >= BATCH:
                yield batch
                batch = []
    if batch:
        yield batch


def _busy(series: int, per_bucket: int) -> Iterator[list[Any]]:
    """``per_bucket`` samples in every bucket of every window of ``series`` series, in
    time order (with ``join.ttl`` 1m, so the ids remembered for duplicates stay few
    and the growth is the series')."""
    import random

    from calmon.engine.records import Kind, Raw

    rng = random.Random(20)
    grid = sorted(T_END - b * (span / 16) - (span / 16) * (i + 0.5) / per_bucket
                  for span in (WEEK, DAY, HOUR) for b in range(16) for i in range(per_bucket))
    batch: list[Any] = []
    for n, ts in enumerate(grid):
        for m in range(series):
            pid = f"b{m}-{n}"
            rec = {"id": pid, "model": f"busy-{m}", "ts": ts, "prob": rng.random()}
            batch.append(Raw(Kind.PREDICTION, json.dumps(rec).encode()))
            batch.append(Raw(Kind.LABEL, json.dumps(
                {"id": pid, "label": rng.randrange(2)}).encode()))
            if len(batch) >= BATCH:
                yield batch
                batch = []
    if batch:
        yield batch


WORKLOADS: dict[str, tuple[dict[str, Any], Callable[[], Iterator[list[Any]]], int]] = {
    # name: (config, batches, series)
    "sparse-1k": ({}, lambda: _records(10, 150), 1010),
    "sparse-10k": ({"limits": {"max_series": 20000}}, lambda: _records(99, 150), 9999),
    "week-8x50": ({}, lambda: _records(8, 4375), 808),
    "busy": ({"segments": {"slices": []}, "join": {"ttl": "1m"}}, lambda: _busy(10, 1500), 10),
}


def _config(extra: dict[str, Any]) -> Any:
    from calmon.config import from_dict

    base = {"segments": {"slices": [["country"], ["device"]], "max_values": 50},
            "recalibration": {"enabled": False}}
    for k, v in extra.items():
        base[k] = {**base.get(k, {}), **v}
    try:
        return from_dict(base)
    except Exception:  # an older calmon without a key of this config
        base.get("limits", {}).pop("max_series", None)
        return from_dict(base)


# ---------------------------------------------------------------- measurements


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def state_cost(name: str) -> dict[str, Any]:
    """In this process: RSS growth of feeding the workload, then the checkpoint."""
    import calmon
    from calmon.engine.engine import Engine

    extra, make, series = WORKLOADS[name]
    engine = Engine(_config(extra))
    gc.collect()
    before = _rss()
    for batch in make():
        engine.feed(batch)
    # what a reader's view does first (the view itself, the read model, is not measured)
    for tables in (engine.windows, engine.scores):
        tables.evict(engine.now)
    gc.collect()
    grown = _rss() - before
    out = {"workload": name, "code": str(Path(calmon.__file__).parent.parent),
           "series": series, "joined": engine.counters["joined"], "rss_growth": grown,
           "rss_per_series": grown / series}
    out.update(checkpoint_cost(engine))
    return out


def checkpoint_cost(engine: Any, rounds: int = 3) -> dict[str, Any]:
    """Bytes and best write time of one checkpoint of the engine (snapshot, encode,
    atomic fsync'd write), and the peak RSS the write reached."""
    from calmon.io.checkpoint import CheckpointStore

    best = float("inf")
    size = 0
    with tempfile.TemporaryDirectory() as d:
        store = CheckpointStore(d)
        for _ in range(rounds):
            t = time.perf_counter()
            path = store.save({"engine": engine.snapshot()}, {("predictions", 0): 1}, 0.0)
            best = min(best, time.perf_counter() - t)
            size = path.stat().st_size
    return {"checkpoint_bytes": size, "checkpoint_seconds": best}


def run_child(name: str, code: Path | None) -> dict[str, Any] | None:
    """``state_cost`` in a fresh process, on the calmon of ``code`` (None: this tree)."""
    env = dict(os.environ)
    if code is not None:
        env["PYTHONPATH"] = f"{code}{os.pathsep}{env.get('PYTHONPATH', '')}"
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", name]
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=3600,
                             check=True, cwd=tempfile.gettempdir())
        out: dict[str, Any] = json.loads(res.stdout.strip().splitlines()[-1])
    except subprocess.CalledProcessError as e:
        print(f"  {name} on {code or 'this tree'} failed: {e.stderr[-500:]}", file=sys.stderr)
        return None
    if code is not None and not out["code"].startswith(str(code)):
        raise RuntimeError(f"the child imported calmon from {out['code']}, not {code}")
    return out


def before_tree(commit: str) -> Path:
    """A temporary worktree of ``commit`` (removed by ``drop_tree``)."""
    where = Path(tempfile.mkdtemp(prefix="calmon-before-"))
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(where), commit],
                   check=True, capture_output=True)
    return where


def drop_tree(where: Path) -> None:
    subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(where)],
                   check=False, capture_output=True)


# ---------------------------------------------------------------- table


def _mib(b: float) -> str:
    return f"{b / 2**20:,.1f} MiB"


def _kib(b: float) -> str:
    return f"{b / 2**10:,.1f} KiB"


def print_table(rows: list[tuple[str, str, dict[str, Any] | None]]) -> None:
    head = ("workload", "code", "series", "RSS growth", "per series", "checkpoint",
            "write s")
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for name, code, r in rows:
        if r is None:
            print(f"| {name} | {code} | | (not run) | | | |")
            continue
        print(f"| {name} | {code} | {r['series']:,} | {_mib(r['rss_growth'])} | "
              f"{_kib(r['rss_per_series'])} | {_mib(r['checkpoint_bytes'])} | "
              f"{r['checkpoint_seconds']:.2f} |")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", default=BEFORE, help="commit to compare with (default %(default)s)")
    ap.add_argument("--no-before", action="store_true", help="measure this tree only")
    ap.add_argument("--full", action="store_true", help="also sparse-10k on the before code")
    ap.add_argument("--only", default=",".join(WORKLOADS), help="workloads, comma-separated")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(state_cost(args.child)))
        return 0
    names = [n for n in args.only.split(",") if n]
    old = None if args.no_before else before_tree(args.before)
    rows: list[tuple[str, str, dict[str, Any] | None]] = []
    try:
        for name in names:
            if old is not None:
                skip = name == "sparse-10k" and not args.full
                rows.append((name, f"before ({args.before})",
                             None if skip else run_child(name, old)))
            rows.append((name, "after", run_child(name, None)))
    finally:
        if old is not None:
            drop_tree(old)
    print_table(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
