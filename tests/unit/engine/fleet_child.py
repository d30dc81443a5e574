"""Run in a fresh process by test_fleet_memory: feed one fleet workload to an engine
and print, as JSON, its RSS growth, peak RSS and the size of one checkpoint of it.

    python -m tests.unit.engine.fleet_child sparse|week
"""

from __future__ import annotations

import gc
import json
import math
import random
import sys
import tempfile
from collections.abc import Iterator

from calmon.config import from_dict
from calmon.engine.engine import Engine
from calmon.engine.records import Kind, Raw
from calmon.io.checkpoint import CheckpointStore
from tests.oracle import T0
from tests.procfs import KIB, status

NOW = T0 + 14 * 86400 - 1.0
SPANS = (7 * 86400.0, 86400.0, 3600.0)  # every window's buckets get samples


def _bucket_time(span: float, b: int) -> float:
    """A time in the b-th newest bucket of the window of ``span`` (b = 0: the newest
    time of all, which is "now")."""
    width = span / 16
    if b == 0:
        return NOW
    return (math.floor(NOW / width) - b) * width + width / 2


def _raws(pid: str, model: str, ts: float, country: str, device: str,
          rng: random.Random) -> list[Raw]:
    rec = {"id": pid, "model": model, "ts": ts, "prob": rng.random(),
           "segment": {"country": country, "device": device}}
    return [Raw(Kind.PREDICTION, json.dumps(rec).encode()),
            Raw(Kind.LABEL, json.dumps({"id": pid, "label": rng.randrange(2)}).encode())]


def sparse_records(models: int) -> Iterator[list[Raw]]:
    """150 records a model: each of 50 countries and 50 devices in 3 of them, one in
    each window's span; the model's records cover every bucket of every window."""
    rng = random.Random(19)
    batch: list[Raw] = []
    for m in range(models):
        for i in range(150):
            ts = _bucket_time(SPANS[i // 50], i % 16)
            batch += _raws(f"s{m}-{i}", f"model-{m}", ts, f"c{i % 50}", f"d{i * 7 % 50}", rng)
            if len(batch) >= 5000:
                yield batch
                batch = []
    if batch:
        yield batch


def week_records(models: int, passes: int = 2) -> Iterator[list[Raw]]:
    """Every series (each model's __all__, 50 countries, 50 devices) gets a sample in
    every bucket of every window, ``passes`` times: 2,400 records a model a pass."""
    rng = random.Random(20)
    batch: list[Raw] = []
    for p in range(passes):
        for m in range(models):
            for v in range(50):
                for span in SPANS:
                    for b in range(16):
                        ts = _bucket_time(span, b)
                        batch += _raws(f"w{p}-{m}-{v}-{span}-{b}", f"model-{m}", ts,
                                       f"c{v}", f"d{(v + b) % 50}", rng)
                        if len(batch) >= 5000:
                            yield batch
                            batch = []
    if batch:
        yield batch


def _status(key: str) -> int:
    return KIB * status("self", key)


def main(kind: str) -> None:
    cfg = from_dict({"limits": {"max_series": 20000, "max_models": 100},
                     "segments": {"slices": [["country"], ["device"]], "max_values": 50}})
    engine = Engine(cfg)
    gc.collect()
    before = _status("VmRSS")
    for batch in sparse_records(99) if kind == "sparse" else week_records(8):
        engine.feed(batch)
    engine.windows.evict(engine.now)
    gc.collect()
    after = _status("VmRSS")
    week = engine.windows._data[-1]  # the 7d window: buckets held per series
    with tempfile.TemporaryDirectory() as d:
        path = CheckpointStore(d).save({"engine": engine.snapshot()}, {("p", 0): 1}, 0.0)
        size = path.stat().st_size
    print(json.dumps({
        "series": len(engine.index.series), "joined": engine.counters["joined"],
        "rss_growth": after - before, "peak_rss": _status("VmHWM"), "checkpoint": size,
        "week_buckets": sorted({len(b) for b in week.values()}),
        "buckets": [sorted({len(b) for b in tab.values()}) for tab in engine.windows._data],
        "windows_series": [len(tab) for tab in engine.windows._data]}))


if __name__ == "__main__":
    main(sys.argv[1])
