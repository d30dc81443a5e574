"""A fleet on one instance: what a scrape costs while the instance ingests (issue 20).

    python bench/fleet_scrape.py [--models 100] [--values 50] [--slices 1]
                                 [--records 300000] [--every 15] [--recal]
                                 [--before COMMIT] [--no-before]

In one process, as the daemon runs them: the main thread feeds the engine batches
of 5,000 JSON records (predictions, each label right after; slices ``[[country],
[device]]`` with ``--values`` values each, so 1 + 2 x values series a model; times
over the last hour), while a scraper thread asks for ``/metrics`` every
``--every`` seconds of the feed (``Accept-Encoding: gzip``, as Prometheus asks).
After: between batches the statistics updates of the daemon's loop
(``Refresher.update`` within ``calmon.daemon.STATS_CPU_SHARE``), and a scrape renders
the latest snapshot through ``io/exposition``. Before (``--before``, default the commit issue 20
started from, checked out in a temporary ``git worktree``): a scrape is
``generate_latest`` of the registry, which computes ``Engine.view()``.

Printed per run: scrape p50 / p95 / max (seconds) during ingestion, the body of the
final state (plain and gzip; the before code sends plain only), the ingest rate with
scrapes and without (a second feed of the same records into a fresh engine, its
statistics updates still running) and with no reader at all, and with ``--recal`` the time of one
recalibration check (``Policy.check``) over every series of the fleet
(``recalibration.per_segment``, small buffers).
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BEFORE = "3743a54"  # main when issue 20 started: scrapes compute the view
T_END = 1_764_460_800.0 + 14 * 86400
BATCH = 5000


def batches(models: int, values: int, records: int) -> list[Any]:
    import random

    from calmon.engine.rawbatch import RawBatch
    from calmon.engine.records import Kind, Raw

    rng = random.Random(20)
    out, batch = [], []
    for i in range(records):
        m = i % models
        seg = {"country": f"c{(i // models) % values}",
               "device": f"d{(i // (models * values)) % values}"}
        p = rng.random()
        rec = {"id": f"r{i}", "model": f"model-{m:03d}", "ts": T_END - 3500 * (1 - i / records),
               "prob": p, "segment": seg}
        batch.append(Raw(Kind.PREDICTION, json.dumps(rec).encode()))
        batch.append(Raw(Kind.LABEL, json.dumps({"id": f"r{i}",
                                                 "label": int(rng.random() < p ** 1.3)}).encode()))
        if len(batch) >= BATCH:
            out.append(RawBatch.of(batch) if hasattr(RawBatch, "of") else batch)
            batch = []
    if batch:
        out.append(RawBatch.of(batch))
    return out


def config(values: int, recal: bool = False) -> Any:
    from calmon.config import from_dict

    slices = [["country"], ["device"]][:SLICES]
    base: dict[str, Any] = {"segments": {"slices": slices, "max_values": values},
                            "limits": {"max_models": 1000, "max_series": 200_000},
                            "join": {"max_pending": 10_000_000},
                            "recalibration": {"enabled": False}}
    if recal:
        base["recalibration"] = {"enabled": True, "per_segment": True, "buffer": 500,
                                 "min_samples": 200}
    try:
        return from_dict(base)
    except Exception:  # an older calmon without max_series
        base["limits"].pop("max_series")
        return from_dict(base)


class After:
    """The daemon's read side: the statistics thread and a shared exposition."""

    def __init__(self, engine: Any, totals: Any) -> None:
        from calmon.daemon import STATS_CPU_SHARE, STATS_MIN_PAUSE_S
        from calmon.engine.snapshot import Refresher
        from calmon.io.exporter import CalmonCollector, WindowCollector
        from calmon.io.exposition import Exposition

        self.refresher = Refresher(engine)
        latest = lambda: self.refresher.latest  # noqa: E731
        windows = WindowCollector(latest, engine.cfg)
        rest = CalmonCollector(engine, snapshot=latest, windows=False, totals=totals,
                               statistics_age=lambda: latest().age(time.time()))
        self.exposition = Exposition(windows, lambda: latest().serial, [rest])
        self.next = 0.0
        self.share, self.pause = STATS_CPU_SHARE, STATS_MIN_PAUSE_S

    def between_batches(self) -> None:
        """``Daemon.refresh_statistics``: an update when the share allows."""
        if time.monotonic() < self.next:
            return
        spent = time.thread_time()
        self.refresher.update()
        spent = time.thread_time() - spent
        self.next = time.monotonic() + max(self.pause,
                                           spent * (1 - self.share) / self.share)

    def scrape(self, gz: bool = True) -> tuple[bytes, str | None]:
        _ctype, enc, parts = self.exposition.render("", "gzip" if gz else "")
        return b"".join(parts), enc

    def close(self) -> None:
        pass


class Before:
    """A scrape as before issue 20: the registry's collector computes the view."""

    def __init__(self, engine: Any, totals: Any) -> None:
        from calmon.io.exporter import CalmonCollector
        from calmon.io.exposition import new_registry

        self.registry = new_registry()
        self.registry.register(CalmonCollector(engine, totals=totals))

    def scrape(self, gz: bool = True) -> tuple[bytes, str | None]:
        from prometheus_client import generate_latest

        return generate_latest(self.registry), None

    def between_batches(self) -> None:
        pass

    def close(self) -> None:
        pass


def feed(data: list[Any], side: str, every: float | None) -> dict[str, Any]:
    from calmon.engine.engine import Engine
    from calmon.io.totals import ProcessTotals

    engine = Engine(CFG)
    totals = ProcessTotals()  # the process counters, as the daemon adds each feed's delta
    reader = ((After if side == "after" else Before)(engine, totals) if side != "bare"
              else None)
    times: list[float] = []
    done = threading.Event()

    def scraper() -> None:
        while every is not None and reader is not None and not done.wait(every):
            t0 = time.perf_counter()
            reader.scrape()
            times.append(time.perf_counter() - t0)

    th = threading.Thread(target=scraper, daemon=True)
    th.start()
    t0 = time.perf_counter()
    for b in data:
        engine.feed(b)
        totals.add(engine.last_delta)
        if reader is not None:
            reader.between_batches()
    wall = time.perf_counter() - t0
    done.set()
    th.join()
    out: dict[str, Any] = {"rate": sum(len(b) for b in data) / 2 / wall, "wall": wall,
                           "scrapes": sorted(times), "series": len(engine.index.series)}
    if every is not None and reader is not None:
        if isinstance(reader, After):  # the final state, once the statistics caught up
            while reader.refresher.latest.version != engine.version or \
                    reader.refresher.latest.stale_since is not None:
                reader.next = 0.0
                reader.between_batches()
        t1 = time.perf_counter()
        plain, _ = reader.scrape(gz=False)
        out["final_scrape"] = time.perf_counter() - t1
        gz, enc = reader.scrape(gz=True)
        out["plain"] = len(plain)
        out["gzip"] = len(gz) if enc == "gzip" else len(gzip.compress(plain))
        out["gzip_sent"] = enc == "gzip"
        out["samples"] = sum(1 for line in plain.split(b"\n") if line and line[:1] != b"#")
        if isinstance(reader, After):
            out.update(memory(reader, engine))
    if reader is not None:
        reader.close()
    return out


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _peak_during(work: Any) -> int:
    """The RSS growth while ``work()`` runs (sampled every 5 ms) over the RSS before."""
    import gc

    gc.collect()
    base = _rss()
    peak = [base]
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.005):
            peak[0] = max(peak[0], _rss())

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    work()
    stop.set()
    th.join()
    return max(peak[0], _rss()) - base


def memory(reader: Any, engine: Any) -> dict[str, Any]:
    """RSS growth of one scrape, of 16 concurrent ones (a new snapshot first, so they
    all render), and 15 s after 64 /reliability requests with junk query strings."""
    from urllib.parse import parse_qs

    from calmon.io import reliability
    from calmon.io.http import _PageCache

    def scrapes(n: int) -> Any:
        def run() -> None:
            reader.refresher.latest = dataclasses.replace(reader.refresher.latest,
                                                          serial=-n)  # not rendered yet
            ths = [threading.Thread(target=reader.scrape) for _ in range(n)]
            for t in ths:
                t.start()
            for t in ths:
                t.join()
        return run

    one = _peak_during(scrapes(1))
    sixteen = _peak_during(scrapes(16))
    cache = _PageCache(5.0)
    page = reliability.Page(engine.cfg, lambda: reader.refresher.latest)
    base = _rss()
    for i in range(64):
        q = f"junk{i}={'x' * 200}&window=w{i}&page={i}"
        assert cache.get("/reliability", q, page)[0] == 200
        parse_qs(q)
    time.sleep(15)
    return {"rss_one": one, "rss_16": sixteen, "rss_junk": _rss() - base,
            "page_builds": cache.builds}


def recal_check(data: list[Any]) -> dict[str, Any]:
    from calmon.engine.engine import Engine
    from calmon.recal.policy import Policy
    from calmon.recal.registry import Registry

    cfg = config(VALUES, recal=True)
    engine = Engine(cfg)
    for b in data:
        engine.feed(b)
    series = [(m, s) for m, s, _ in engine.buffered_series()]
    policy = Policy(cfg, Registry(None))
    t0 = time.perf_counter()
    policy.check(engine.now, series, engine.samples)
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    policy.check(engine.now, series, engine.samples)
    return {"series": len(series), "check_first": first, "check": time.perf_counter() - t0}


def child(side: str, args: argparse.Namespace) -> dict[str, Any]:
    global CFG, VALUES, SLICES
    VALUES, SLICES = args.values, args.slices
    CFG = config(args.values)
    data = batches(args.models, args.values, args.records)
    out = {"with": feed(data, side, args.every), "without": feed(data, side, None),
           "bare": feed(data, "bare", None)}
    if args.recal and side == "after":
        out["recal"] = recal_check(data)
    return out


CFG: Any = None
VALUES = 50
SLICES = 1


def run_child(side: str, code: Path | None, argv: list[str]) -> dict[str, Any]:
    env = dict(os.environ)
    if code is not None:
        env["PYTHONPATH"] = f"{code}:{ROOT}"
    res = subprocess.run([sys.executable, __file__, "--child", side, *argv], env=env,
                         capture_output=True, text=True, cwd=str(ROOT))
    if res.returncode:
        sys.stderr.write(res.stderr[-3000:])
        raise SystemExit(f"the {side} run failed")
    return json.loads(res.stdout.strip().splitlines()[-1])


def pct(xs: list[float], q: float) -> float:
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def report(name: str, r: dict[str, Any]) -> None:
    w, wo = r["with"], r["without"]
    s = w["scrapes"]
    print(f"{name}: {w['series']} series, {len(s)} scrapes during ingestion: "
          f"p50 {pct(s, .5):.2f} s, p95 {pct(s, .95):.2f} s, max {max(s, default=0):.2f} s; "
          f"final body {w['plain'] / 2**20:.1f} MiB plain ({w['samples']} samples), "
          f"{w['gzip'] / 2**20:.2f} MiB gzip ({'sent' if w['gzip_sent'] else 'not sent'}); "
          f"final scrape {w['final_scrape']:.2f} s; ingest {w['rate']:,.0f} rec/s with scrapes, "
          f"{wo['rate']:,.0f} without ({w['rate'] / wo['rate']:.2f}x), "
          f"{r['bare']['rate']:,.0f} with no reader at all")
    if "rss_16" in w:
        print(f"  RSS growth: one scrape {w['rss_one'] / 2**20:.1f} MiB, 16 concurrent "
              f"{w['rss_16'] / 2**20:.1f} MiB; 64 junk /reliability queries "
              f"{w['rss_junk'] / 2**20:.1f} MiB 15 s later ({w['page_builds']} page builds)")
    if "recal" in r:
        rc = r["recal"]
        print(f"  recalibration check over {rc['series']} series: {rc['check_first']:.2f} s "
              f"first, {rc['check']:.2f} s next")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", type=int, default=100)
    ap.add_argument("--values", type=int, default=50)
    ap.add_argument("--slices", type=int, default=1, choices=(1, 2))
    ap.add_argument("--records", type=int, default=300_000)
    ap.add_argument("--every", type=float, default=15.0, help="seconds between scrapes")
    ap.add_argument("--recal", action="store_true", help="also time a recalibration check")
    ap.add_argument("--before", default=BEFORE)
    ap.add_argument("--no-before", action="store_true")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args)))
        return 0
    passed = [a for a in (argv if argv is not None else sys.argv[1:])
              if a not in ("--no-before",)]
    results = [("after", run_child("after", None, passed))]
    if not args.no_before:
        tmp = Path(tempfile.mkdtemp(prefix="calmon-before-"))
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tmp),
                        args.before], check=True, capture_output=True)
        try:
            results.insert(0, ("before", run_child("before", tmp, passed)))
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tmp)],
                           check=False, capture_output=True)
    print(f"{args.models} models x {args.values} values x {args.slices} slice(s), "
          f"{args.records:,} records, "
          f"a scrape every {args.every:g} s")
    for name, r in results:
        report(name, r)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
