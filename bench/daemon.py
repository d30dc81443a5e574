"""End-to-end throughput of ``calmon run`` against a bare consumer of the same
client library, for each ``kafka.library`` (kafka-python, confluent), in one run.

    python bench/daemon.py [--n N] [--quick] [--bootstrap host:port] [--repeat R]
                           [--libraries kafka-python,confluent] [--py-spy PATH]

On one broker in one run (an embedded Tansu from ``calmon.demo.broker`` unless
``--bootstrap`` is given), N binary predictions and their N labels are produced
to two fresh 4-partition topics, keyed by id (so a prediction and its label
share a partition number), each label shortly after its prediction. Production
is not timed. Then, over exactly those 2N records:

1. **bare consumer** of the library: a kafka-python ``KafkaConsumer`` (or a
   confluent-kafka ``Consumer``) with static ``assign()`` of every partition of
   both topics from the beginning, raw bytes, no auto-commit, the consumer
   settings ``calmon run`` uses (taken from ``KafkaSource`` / ``ConfluentSource``
   itself: fetch sizes from ``calmon.io.topics.fetch_bytes``, ``kafka.client``
   passthrough) and the daemon's poll size and timeout
   (``calmon.daemon.MAX_RECORDS``, ``POLL_TIMEOUT_MS``), reading until it has
   counted 2N records. The clock starts after assign + seek (connection and
   metadata already done) and stops at the 2N-th record: input records/s.
2. **calmon run** (``kafka.library`` set to the library): ``python -m calmon run
   -c cfg`` as a subprocess with a fresh
   state dir, a fresh group id, recalibration off, ``checkpoint_interval`` 10s,
   a free port. The clock starts when ``/readyz`` first answers 200 (partitions
   assigned and the broker connected, so both clocks start at the same point)
   and stops when ``/status`` shows ``counters.joined == N``. Printed: input
   records/s (2N / t) and joined samples/s (N / t); the time from process start
   is printed too. ``/readyz`` is polled every 10 ms; ``/status`` (which costs the
   daemon a few ms of engine time per call) at most once a second, then more
   often as the predicted end nears, down to ``--status-interval`` (20 ms), so
   the end time is known to within that and polling costs the daemon ~1-2%.
3. the ratio calmon input records/s / bare consumer records/s, next to the
   target (>= 0.8), and **CPU-seconds per million input records** of calmon's
   processes (the daemon + its consumer child, user + system from
   ``/proc/<pid>/stat``, over the measured interval) and of the bare consumer
   (its own process time). With both libraries: the speed-up of calmon on
   confluent over calmon on kafka-python (target >= 2.5), and whether the two
   ended in the same state (counters and positions). Speed is measured and
   printed, never asserted.

Each measurement is repeated ``--repeat`` times (fresh consumer, fresh state dir
and group, same topics), bare and calmon runs alternating so that a noisy
neighbour slows both alike, and the best of each is reported. Completion is
always decided by counting records (never by end offsets, which Tansu reports
wrongly), and every wait is a condition polled with a deadline.

``--py-spy PATH`` adds one more, untimed, ``calmon run`` sampled by py-spy from
readiness to completion (``.txt`` -> raw collapsed stacks plus a printed
hotspot table, ``.svg`` -> flame graph, ``.json`` -> speedscope).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# the checkout's root: for calmon without `pip install -e .`, and for the tests' helpers,
# which the benchmark shares instead of copying
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import yaml

from calmon.config import KafkaConfig
from calmon.daemon import MAX_RECORDS, POLL_TIMEOUT_MS
from calmon.demo.broker import BrokerUnavailable, TansuBroker, free_port, resolve_binary
from calmon.io.kafka_source import KafkaSource
from tests.conftest import create_topics
from tests.daemon_helpers import http_get, wait_until

LIBRARIES = ("kafka-python", "confluent")
TARGET_SPEEDUP = 2.5  # calmon on confluent over calmon on kafka-python

REPO = Path(__file__).resolve().parents[1]
TARGET_RATIO = 0.8  # calmon input records/s over bare consumer records/s
PARTITIONS = 4
BASE_TS = 1_764_460_800.0  # 2025-11-30T00:00:00Z
EVENT_RATE = 2000.0  # predictions per second of event time
LABEL_LAG = 500  # a label is produced this many predictions after its own
COUNTRIES = ("US", "DE", "FR", "BR", "IN", "JP", "GB", "ES")
DEVICES = ("ios", "android", "web", "tv")
MODEL = "ctr-v3"
MODEL_VERSION = "2025-11-28.1"
LABEL_SOURCES = ("click-stream", "conversion-log")
READY_POLL_S = 0.01
STATUS_FIRST_S = 0.25
STATUS_MAX_S = 1.0


def log(msg: str) -> None:
    print(msg, flush=True)


# ---------------------------------------------------------------- data


def prediction_value(prefix: str, i: int, rng: random.Random) -> tuple[bytes, bytes, int, float]:
    """(key, JSON value ~150 bytes, label, ts) of prediction ``i``."""
    pid = f"{prefix}-{i:09d}"
    ts = round(BASE_TS + i / EVENT_RATE + rng.uniform(0.0, 0.05), 3)
    p = round(rng.betavariate(1.5, 6.0), 6)
    y = int(rng.random() < min(1.0, p * 1.15))
    value = (
        f'{{"id":"{pid}","model":"{MODEL}","model_version":"{MODEL_VERSION}","ts":{ts},'
        f'"segment":{{"country":"{rng.choice(COUNTRIES)}","device":"{rng.choice(DEVICES)}"}},'
        f'"prob":{p}}}'
    )
    return pid.encode(), value.encode(), y, ts


def label_value(pid: bytes, y: int, ts: float, rng: random.Random) -> bytes:
    lts = round(ts + rng.uniform(0.2, 30.0), 3)
    src = rng.choice(LABEL_SOURCES)
    return f'{{"id":"{pid.decode()}","label":{y},"ts":{lts},"source":"{src}"}}'.encode()


def _produce_slice(bootstrap: str, pred_topic: str, label_topic: str, prefix: str,
                   start: int, stop: int, seed: int) -> tuple[int, int, int]:
    """In a worker process: produce predictions ``start..stop`` and their labels,
    each label LABEL_LAG predictions after its own. Returns (predictions acked,
    labels acked, prediction bytes)."""
    from kafka import KafkaProducer

    rng = random.Random(seed * 1_000_003 + start)
    producer = KafkaProducer(
        bootstrap_servers=bootstrap,
        acks=1,
        enable_idempotence=False,
        linger_ms=20,
        batch_size=512 * 1024,
        max_request_size=16 * 1024 * 1024,
        request_timeout_ms=30000,
    )
    futures: list[Any] = []
    pred_bytes = 0
    waiting: list[tuple[bytes, int, float]] = []
    try:
        for i in range(start, stop):
            key, value, y, ts = prediction_value(prefix, i, rng)
            pred_bytes += len(value)
            futures.append(producer.send(pred_topic, key=key, value=value))
            waiting.append((key, y, ts))
            if len(waiting) > LABEL_LAG:
                k, yy, tt = waiting[len(waiting) - LABEL_LAG - 1]
                futures.append(producer.send(label_topic, key=k,
                                             value=label_value(k, yy, tt, rng)))
        for k, yy, tt in waiting[max(0, len(waiting) - LABEL_LAG):]:
            futures.append(producer.send(label_topic, key=k, value=label_value(k, yy, tt, rng)))
        producer.flush(timeout=300)
        acked: Counter[str] = Counter()
        for f in futures:
            md = f.get(timeout=60)  # raises the send error, if any
            acked[md.topic] += 1
        return acked[pred_topic], acked[label_topic], pred_bytes
    finally:
        producer.close(timeout=10)


def produce_all(bootstrap: str, pred_topic: str, label_topic: str, n: int,
                workers: int, seed: int) -> int:
    """Produce N predictions and N labels with ``workers`` processes; returns the
    mean prediction size in bytes. Raises if any record was not acknowledged."""
    prefix = uuid.uuid4().hex[:8]
    bounds = [n * k // workers for k in range(workers + 1)]
    methods = multiprocessing.get_all_start_methods()
    ctx = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
    with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
        jobs = [pool.submit(_produce_slice, bootstrap, pred_topic, label_topic, prefix,
                            bounds[k], bounds[k + 1], seed)
                for k in range(workers) if bounds[k + 1] > bounds[k]]
        results = [j.result() for j in jobs]
    preds = sum(r[0] for r in results)
    labels = sum(r[1] for r in results)
    if preds != n or labels != n:
        raise RuntimeError(f"produced {preds} predictions and {labels} labels, expected {n}")
    return sum(r[2] for r in results) // max(1, n)


# ---------------------------------------------------------------- bare consumer


def confluent_settings(kafka: KafkaConfig) -> dict[str, Any]:
    """As ``consumer_settings`` for librdkafka (from ``ConfluentSource``), with a group
    of its own (librdkafka wants one; nothing is committed) and no callbacks."""
    from calmon.io.confluent_source import ConfluentSource

    settings = ConfluentSource(kafka)._settings()
    for key in ("error_cb", "stats_cb", "on_commit", "logger", "statistics.interval.ms"):
        settings.pop(key, None)
    settings["group.id"] = f"bench-bare-{uuid.uuid4().hex[:8]}"
    return settings


def consumer_settings(kafka: KafkaConfig) -> dict[str, Any]:
    """The settings ``calmon run`` gives its consumer for this ``kafka`` config (taken
    from ``KafkaSource`` itself, so the two stay the same), without a group."""
    settings = KafkaSource(kafka)._settings()
    settings["group_id"] = None  # no committed offsets to look up: seek_to_beginning
    return settings


@dataclass
class BareResult:
    seconds: float
    records: int
    bytes: int
    cpu: float = 0.0  # CPU seconds of this process (all its threads) while measured

    @property
    def rate(self) -> float:
        return self.records / self.seconds

    @property
    def cpu_per_million(self) -> float:
        return self.cpu / self.records * 1e6


def bare_consumer(kafka: KafkaConfig, topics: list[str], total: int,
                  timeout: float) -> BareResult:
    """The bare consumer of ``kafka.library``."""
    if kafka.library == "confluent":
        return bare_confluent(kafka, topics, total, timeout)
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(**consumer_settings(kafka))
    try:
        tps = []
        for topic in topics:
            parts = wait_until(lambda t=topic: consumer.partitions_for_topic(t), 30.0,
                               f"metadata of {topic}")
            tps += [TopicPartition(topic, p) for p in sorted(parts)]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        count = nbytes = 0
        t0, c0 = time.perf_counter(), time.process_time()
        deadline = time.monotonic() + timeout
        while count < total:
            polled = consumer.poll(timeout_ms=POLL_TIMEOUT_MS, max_records=MAX_RECORDS)
            for recs in polled.values():
                count += len(recs)
                for r in recs:
                    nbytes += len(r.value)
            if time.monotonic() > deadline:
                raise TimeoutError(f"bare consumer read {count} of {total} records "
                                   f"in {timeout:.0f}s")
        dt, cpu = time.perf_counter() - t0, time.process_time() - c0
        if count != total:
            raise RuntimeError(f"bare consumer read {count} records, expected {total}")
        return BareResult(dt, count, nbytes, cpu)
    finally:
        consumer.close(autocommit=False)


def bare_confluent(kafka: KafkaConfig, topics: list[str], total: int,
                   timeout: float, decode: bool = False) -> BareResult:
    """The bare librdkafka consumer; with ``decode`` it also parses every value with
    ``json.loads`` (the least a consumer of these records does with them)."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer(confluent_settings(kafka))
    try:
        tps = []
        for topic in topics:
            meta = wait_until(lambda t=topic: consumer.list_topics(t, timeout=5).topics[t],
                              30.0, f"metadata of {topic}")
            tps += [TopicPartition(topic, p, OFFSET_BEGINNING) for p in sorted(meta.partitions)]
        consumer.assign(tps)
        count = nbytes = 0
        t0, c0 = time.perf_counter(), time.process_time()
        deadline = time.monotonic() + timeout
        loads = json.loads
        while count < total:
            for m in consumer.consume(MAX_RECORDS, POLL_TIMEOUT_MS / 1000.0):
                if m.error() is None:
                    count += 1
                    value: Any = m.value()
                    nbytes += len(value)
                    if decode:
                        loads(value)
            if time.monotonic() > deadline:
                raise TimeoutError(f"bare consumer read {count} of {total} records "
                                   f"in {timeout:.0f}s")
        dt, cpu = time.perf_counter() - t0, time.process_time() - c0
        if count != total:
            raise RuntimeError(f"bare consumer read {count} records, expected {total}")
        return BareResult(dt, count, nbytes, cpu)
    finally:
        consumer.close()


# ---------------------------------------------------------------- calmon run


@dataclass
class CalmonResult:
    startup: float  # process start -> /readyz 200
    seconds: float  # /readyz 200 -> joined == N
    n: int
    counters: dict[str, int]
    cpu: dict[str, float]  # CPU seconds while measured, per process ("daemon", "consumer")
    positions: dict[str, int]  # /status positions at the end

    @property
    def cpu_per_million(self) -> float:
        """CPU seconds of calmon's processes per million input records."""
        return sum(self.cpu.values()) / (2 * self.n) * 1e6

    @property
    def input_rate(self) -> float:
        return 2 * self.n / self.seconds

    @property
    def joined_rate(self) -> float:
        return self.n / self.seconds

    @property
    def input_rate_from_start(self) -> float:
        return 2 * self.n / (self.startup + self.seconds)


def write_config(workdir: Path, bootstrap: str, pred_topic: str, label_topic: str,
                 library: str = "kafka-python") -> Path:
    cfg = {
        "kafka": {
            "bootstrap_servers": bootstrap,
            # fresh group: no committed offsets, so the run starts at the beginning
            "group_id": f"calmon-bench-{uuid.uuid4().hex[:10]}",
            "predictions_topic": pred_topic,
            "labels_topic": label_topic,
            "auto_offset_reset": "earliest",
            "library": library,
        },
        "recalibration": {"enabled": False},
        "server": {"host": "127.0.0.1", "port": free_port()},
        "state": {"dir": str(workdir / "state"), "checkpoint_interval": "10s"},
    }
    path = workdir / "calmon.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False), encoding="utf-8")
    return path


def calmon_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env.setdefault("CALMON_LOG_LEVEL", "INFO")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _log_tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def run_calmon(workdir: Path, bootstrap: str, pred_topic: str, label_topic: str, n: int,
               timeout: float, status_interval: float,
               py_spy: tuple[str, Path] | None = None,
               library: str = "kafka-python") -> CalmonResult:
    """One ``calmon run`` from an empty state until it has joined ``n`` samples."""
    workdir.mkdir(parents=True)
    cfg_path = write_config(workdir, bootstrap, pred_topic, label_topic, library)
    port = int(yaml.safe_load(cfg_path.read_text())["server"]["port"])
    log_path = workdir / "calmon.log"
    spy: subprocess.Popen[bytes] | None = None
    with log_path.open("wb") as out:
        t_spawn = time.perf_counter()
        proc = subprocess.Popen(
            [sys.executable, "-m", "calmon", "run", "-c", str(cfg_path)],
            cwd=str(workdir), env=calmon_env(), stdin=subprocess.DEVNULL,
            stdout=out, stderr=subprocess.STDOUT)
    try:
        def alive() -> None:
            if proc.poll() is not None:
                raise RuntimeError(f"calmon exited with {proc.returncode}:\n"
                                   f"{_log_tail(log_path)}")

        def ready() -> bool:
            alive()
            return http_get(port, "/readyz", timeout=1.0)[0] == 200

        wait_until(ready, 60.0, "calmon /readyz 200", interval=READY_POLL_S)
        t_ready = time.perf_counter()
        cpu_ready = process_cpu(proc.pid)
        if py_spy is not None:
            spy = start_py_spy(proc.pid, *py_spy)
        last: dict[str, Any] = {}
        # /status builds a full engine view under the engine lock (a few ms), so it is
        # polled sparingly: every STATUS_MAX_S at most, then at half the predicted time
        # left, down to ``status_interval`` near the end (an end-time error of at most
        # that, for a few dozen polls per run).
        deadline = time.monotonic() + timeout
        prev: tuple[float, int] | None = None
        while True:
            alive()
            code, body = http_get(port, "/status")
            now = time.perf_counter()
            if code == 200:
                last.update(json.loads(body))
                joined = int(last["counters"]["joined"])
                if joined > n:
                    raise RuntimeError(f"calmon joined {joined} samples, more than the {n} "
                                       "produced")
                if joined == n:
                    break
                wait = STATUS_FIRST_S
                if prev is not None and joined > prev[1]:
                    eta = (n - joined) * (now - prev[0]) / (joined - prev[1])
                    wait = min(STATUS_MAX_S, max(status_interval, eta / 2))
                prev = (now, joined)
            else:
                wait = status_interval
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out after {timeout:.0f}s waiting for calmon joined "
                                   f"== {n}; last counters {last.get('counters')}")
            time.sleep(wait)  # polling interval of a deadline-bounded wait
        t_done = time.perf_counter()
        cpu_done = process_cpu(proc.pid)
        counters = {k: int(v) for k, v in last["counters"].items()}
        positions = {k: int(v) for k, v in last.get("positions", {}).items()}
    finally:
        if spy is not None:
            stop_py_spy(spy)
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
    bad = {k: v for k, v in counters.items()
           if k in ("invalid", "expired", "duplicates") and v}
    if bad or counters.get("predictions") != n or counters.get("labels") != n:
        raise RuntimeError(f"unexpected counters {counters}")
    cpu = {k: cpu_done[k] - cpu_ready.get(k, 0.0) for k in cpu_done}
    return CalmonResult(t_ready - t_spawn, t_done - t_ready, n, counters, cpu, positions)


def process_cpu(pid: int) -> dict[str, float]:
    """CPU seconds (user + system) of the daemon and of its consumer process (its
    multiprocessing child), from /proc; empty where /proc is unavailable."""
    tick = os.sysconf("SC_CLK_TCK")

    def stat(p: int | str) -> list[str]:
        with open(f"/proc/{p}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()

    out: dict[str, float] = {}
    try:
        fields = stat(pid)
        out["daemon"] = (int(fields[11]) + int(fields[12])) / tick
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    with open(f"/proc/{entry}/cmdline", "rb") as f:
                        spawned = b"spawn_main" in f.read()
                    fields = stat(entry)
                except OSError:
                    continue
                if spawned and int(fields[1]) == pid:
                    out["consumer"] = (int(fields[11]) + int(fields[12])) / tick
    except OSError:
        pass
    return out


# ---------------------------------------------------------------- py-spy


def start_py_spy(pid: int, fmt: str, out: Path) -> subprocess.Popen[bytes]:
    exe = shutil.which("py-spy")
    if exe is None:
        raise RuntimeError("py-spy not found (pip install py-spy)")
    cmd = [exe, "record", "--pid", str(pid), "--rate", "200", "--nonblocking",
           "--format", fmt, "-o", str(out)]
    if fmt == "raw":
        cmd.append("--nolineno")
    return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)


def stop_py_spy(spy: subprocess.Popen[bytes]) -> None:
    if spy.poll() is None:
        spy.send_signal(signal.SIGINT)  # py-spy writes its output on Ctrl+C
    try:
        _, err = spy.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        spy.kill()
        spy.communicate()
        raise RuntimeError("py-spy did not write its output in 60s") from None
    if spy.returncode not in (0, -signal.SIGINT, 130):
        log(f"py-spy exited with {spy.returncode}: {err.decode(errors='replace')[-500:]}")


def _frame_name(frame: str) -> str:
    """``function (path/to/file.py)`` -> ``file.py:function``."""
    name, _, where = frame.partition(" (")
    return f"{Path(where.rstrip(')')).name}:{name}" if where else name


def summarize_raw(path: Path, top: int = 25) -> None:
    """Own-time and inclusive shares per function from py-spy's raw (collapsed) stacks,
    over the samples of the consumer thread (the one running ``Daemon._loop``)."""
    own: Counter[str] = Counter()
    incl: Counter[str] = Counter()
    total = other = 0
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        k = int(count)
        frames = [_frame_name(f) for f in stack.split(";")]
        if not any(f.endswith("Daemon._loop") for f in frames):
            other += k
            continue
        total += k
        own[frames[-1]] += k
        for f in set(frames):
            incl[f] += k
    if not total:
        log("py-spy: no samples of the consumer loop")
        return
    log(f"\n== py-spy: {total} samples in the consumer loop "
        f"({other} in other threads, e.g. HTTP /status) ==")
    log(f"  {'own %':>6}  function")
    for f, k in own.most_common(top):
        log(f"  {100 * k / total:6.1f}  {f}")
    log(f"\n  {'incl %':>6}  function")
    for f, k in incl.most_common(top + 10):
        log(f"  {100 * k / total:6.1f}  {f}")


# ---------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=None,
                    help="predictions (and labels) to produce (default 200000; 20000 with "
                         "--quick)")
    ap.add_argument("--quick", action="store_true", help="small N (smoke test): about 10 s in all")
    ap.add_argument("--bootstrap", default=None,
                    help="host:port of a running broker (instead of --broker)")
    ap.add_argument("--broker", choices=("tansu", "kafka", "both"), default="tansu",
                    help="the broker(s) to start: an embedded Tansu, Apache Kafka 4.4 (KRaft, "
                         "from the jars of tests/brokers/pom.xml, Java 17), or both in turn")
    ap.add_argument("--repeat", type=int, default=None,
                    help="runs per measurement, best kept (default 3; 2 with --quick)")
    ap.add_argument("--producers", type=int, default=None,
                    help="producer processes (default: CPU count, at most 4)")
    ap.add_argument("--status-interval", type=float, default=0.02,
                    help="shortest time between /status polls, near the end of a run "
                         "(the end-time resolution)")
    ap.add_argument("--libraries", default=None,
                    help="comma-separated kafka.library values to measure (default: "
                         "kafka-python,confluent, or kafka-python alone without "
                         "confluent-kafka installed)")
    ap.add_argument("--py-spy", type=Path, default=None, metavar="PATH",
                    help="add one untimed calmon run sampled by py-spy; .txt raw stacks "
                         "(+ printed hotspots), .svg flame graph, .json speedscope")
    args = ap.parse_args(argv)
    n = args.n or (20_000 if args.quick else 200_000)
    repeat = args.repeat or (2 if args.quick else 3)
    workers = args.producers or max(1, min(4, os.cpu_count() or 1))

    import kafka

    versions = f"kafka-python {kafka.__version__}"
    try:
        import confluent_kafka

        cv = confluent_kafka.version()  # a (str, int) tuple in most releases
        versions += (f", confluent-kafka {cv[0] if isinstance(cv, tuple) else cv} "
                     f"(librdkafka {confluent_kafka.libversion()[0]})")
        available = LIBRARIES
    except ImportError:
        available = ("kafka-python",)
    libraries = tuple(args.libraries.split(",")) if args.libraries else available
    for lib in libraries:
        if lib not in available:
            print(f"bench/daemon.py: --libraries: {lib!r} is not one of {available} "
                  "(confluent needs pip install 'calmon[fast]')", file=sys.stderr)
            return 2
    log(f"calmon daemon benchmark: python {platform.python_version()}, {versions}, "
        f"{platform.machine()}, {os.cpu_count()} cpus")
    kinds = ["given"] if args.bootstrap else (
        ["tansu", "kafka"] if args.broker == "both" else [args.broker])
    summary: dict[str, dict[str, tuple[BareResult, CalmonResult, BareResult | None]]] = {}
    for kind in kinds:
        tmp = Path(tempfile.mkdtemp(prefix="calmon-bench-"))
        try:
            with start_broker(kind, args.bootstrap, tmp) as (bootstrap, name):
                log(f"\n######## broker: {name} on {bootstrap}")
                summary[name] = bench_broker(bootstrap, args, n, repeat, workers, libraries)
        except BrokerUnavailable as e:
            print(f"bench/daemon.py: {e}; or pass --bootstrap host:port", file=sys.stderr)
            return 2
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    if len(summary) > 1:
        log("\n== every broker, best runs (input records/s) ==")
        log(f"  {'broker':<22} {'library':<13} {'bare':>9} {'bare+json':>10} {'calmon':>9} "
            f"{'calmon/bare':>12} {'calmon/bare+json':>17}")
        for name, libs in summary.items():
            for lib, (bare, top, decoded) in libs.items():
                dj = f"{decoded.rate:>10,.0f}" if decoded else f"{'-':>10}"
                rj = f"{top.input_rate / decoded.rate:>17.2f}" if decoded else f"{'-':>17}"
                log(f"  {name:<22} {lib:<13} {bare.rate:>9,.0f} {dj} {top.input_rate:>9,.0f} "
                    f"{top.input_rate / bare.rate:>12.2f} {rj}")
            if {"kafka-python", "confluent"} <= libs.keys():
                log(f"  {name:<22} calmon confluent / kafka-python: "
                    f"{libs['confluent'][1].input_rate / libs['kafka-python'][1].input_rate:.2f}x")
    return 0


class start_broker:
    """The broker of ``kind`` ("given": ``bootstrap``; "tansu": an embedded Tansu;
    "kafka": Apache Kafka 4.4 from the jars tests/brokers/pom.xml fetches)."""

    def __init__(self, kind: str, bootstrap: str | None, tmp: Path) -> None:
        self.kind, self.bootstrap, self.tmp = kind, bootstrap, tmp
        self.broker: Any = None

    def __enter__(self) -> tuple[str, str]:
        if self.kind == "given":
            assert self.bootstrap is not None
            return self.bootstrap, f"given {self.bootstrap}"
        if self.kind == "tansu":
            self.broker = TansuBroker(resolve_binary(), log=self.tmp / "tansu.log")
            self.broker.start()
            return self.broker.bootstrap, f"Tansu {Path(self.broker.binary).name}"
        from tests.brokers import apache

        try:
            # the broker's own JIT and heap as a deployment would have them
            self.broker = apache.ApacheKafka(self.tmp / "kafka", heap="1g")
        except apache.Unavailable as e:
            raise BrokerUnavailable(f"Apache Kafka: {e}") from None
        self.broker.start()
        return self.broker.bootstrap, f"Apache Kafka {apache.VERSION}"

    def __exit__(self, *exc: object) -> None:
        if self.broker is not None:
            self.broker.stop()


def bench_broker(bootstrap: str, args: argparse.Namespace, n: int, repeat: int, workers: int,
                 libraries: tuple[str, ...],
                 ) -> dict[str, tuple[BareResult, CalmonResult, BareResult | None]]:
    """Every measurement on one broker; returns the best (bare, calmon, bare+json) per
    library (bare+json: confluent only)."""
    total = 2 * n
    timeout = 120.0 + total / 2000.0
    tmp = Path(tempfile.mkdtemp(prefix="calmon-bench-run-"))
    try:
        run_id = uuid.uuid4().hex[:8]
        pred_topic, label_topic = f"bench-predictions-{run_id}", f"bench-labels-{run_id}"
        create_topics(bootstrap, [pred_topic, label_topic], PARTITIONS)
        t = time.perf_counter()
        size = produce_all(bootstrap, pred_topic, label_topic, n, workers, seed=7)
        log(f"produced {n:,} predictions (~{size} B JSON) + {n:,} labels to "
            f"{PARTITIONS}+{PARTITIONS} partitions with {workers} producer processes in "
            f"{time.perf_counter() - t:.1f}s (not measured)")

        kcfgs = {lib: KafkaConfig(bootstrap_servers=(bootstrap,), predictions_topic=pred_topic,
                                  labels_topic=label_topic, library=lib)  # type: ignore[arg-type]
                 for lib in libraries}
        rounds = "1 round" if repeat == 1 else f"{repeat} rounds"
        log(f"\n== {rounds} of, for each of {', '.join(libraries)}: the bare consumer over "
            f"{total:,} records (poll max_records={MAX_RECORDS}), then calmon run until "
            f"{n:,} joined (clock from /readyz 200) ==")
        bares: dict[str, list[BareResult]] = {lib: [] for lib in libraries}
        decoded: list[BareResult] = []
        runs: dict[str, list[CalmonResult]] = {lib: [] for lib in libraries}
        for k in range(repeat):
            # alternated, so a noisy neighbour slows every side alike
            for lib in libraries:
                b = bare_consumer(kcfgs[lib], [pred_topic, label_topic], total, timeout)
                bares[lib].append(b)
                log(f"  {k + 1}. {lib:<12} bare   {b.seconds:6.2f}s  {b.rate:>9,.0f} records/s "
                    f"({b.bytes / b.seconds / 1e6:.1f} MB/s of values; "
                    f"{b.cpu_per_million:.2f} CPU-s per M records)")
                if lib == "confluent":
                    d = bare_confluent(kcfgs[lib], [pred_topic, label_topic], total, timeout,
                                       decode=True)
                    decoded.append(d)
                    log(f"  {k + 1}. {lib:<12} bare+json.loads {d.seconds:6.2f}s  "
                        f"{d.rate:>9,.0f} records/s ({d.cpu_per_million:.2f} CPU-s per M)")
                r = run_calmon(tmp / f"calmon-{lib}-{k}", bootstrap, pred_topic, label_topic,
                               n, timeout, args.status_interval, library=lib)
                runs[lib].append(r)
                log(f"  {k + 1}. {lib:<12} calmon {r.seconds:6.2f}s  {r.input_rate:>9,.0f} input "
                    f"records/s {r.joined_rate:>9,.0f} joined/s  {r.cpu_per_million:.2f} CPU-s "
                    f"per M records (startup {r.startup:.2f}s; from process start "
                    f"{r.input_rate_from_start:,.0f} input records/s; busy: "
                    + ", ".join(f"{k} {v / r.seconds:.0%}" for k, v in r.cpu.items()) + ")")

        log("\n== result (best runs; CPU-s per M = CPU seconds per million input records, "
            "calmon = daemon + consumer process) ==")
        log(f"  {'library':<13} {'bare rec/s':>11} {'bare CPU-s/M':>13} {'calmon rec/s':>13} "
            f"{'joined/s':>10} {'calmon CPU-s/M':>15} {'ratio':>6}")
        best: dict[str, CalmonResult] = {}
        out: dict[str, tuple[BareResult, CalmonResult, BareResult | None]] = {}
        for lib in libraries:
            bare = min(bares[lib], key=lambda r: r.seconds)
            top = best[lib] = min(runs[lib], key=lambda r: r.seconds)
            dec = min(decoded, key=lambda r: r.seconds) if lib == "confluent" else None
            out[lib] = (bare, top, dec)
            ratio = top.input_rate / bare.rate
            log(f"  {lib:<13} {bare.rate:>11,.0f} {bare.cpu_per_million:>13.2f} "
                f"{top.input_rate:>13,.0f} {top.joined_rate:>10,.0f} "
                f"{top.cpu_per_million:>15.2f} {ratio:>6.2f}   ratio target >= {TARGET_RATIO}: "
                f"{'MET' if ratio >= TARGET_RATIO else 'NOT MET'}")
            if dec is not None:
                log(f"  {'':<13} bare+json.loads {dec.rate:,.0f} records/s: calmon "
                    f"{top.input_rate / dec.rate:.2f}x of it (target >= 1: "
                    f"{'MET' if top.input_rate >= dec.rate else 'NOT MET'})")
        if len(best) > 1 and "kafka-python" in best and "confluent" in best:
            slow, fast = best["kafka-python"], best["confluent"]
            speedup = fast.input_rate / slow.input_rate
            same = all(r.counters == slow.counters and r.positions == slow.positions
                       for lib in libraries for r in runs[lib])
            log(f"  calmon confluent / kafka-python: {speedup:.2f}x records/s (target >= "
                f"{TARGET_SPEEDUP}: {'MET' if speedup >= TARGET_SPEEDUP else 'NOT MET'}), "
                f"{slow.cpu_per_million / fast.cpu_per_million:.2f}x less CPU per record; "
                f"same counters and positions in every run: {'yes' if same else 'NO'}")
            if not same:
                for lib in libraries:
                    for r in runs[lib]:
                        log(f"    {lib}: counters {r.counters}, positions {r.positions}")

        if args.py_spy is not None:
            suffix = args.py_spy.suffix.lower()
            fmt = {".svg": "flamegraph", ".json": "speedscope"}.get(suffix, "raw")
            r = run_calmon(tmp / "calmon-py-spy", bootstrap, pred_topic, label_topic, n,
                           timeout, args.status_interval, py_spy=(fmt, args.py_spy),
                           library=libraries[-1])
            log(f"\npy-spy run (not counted): {r.seconds:.2f}s, {r.input_rate:,.0f} input "
                f"records/s under sampling; {fmt} profile in {args.py_spy}")
            if fmt == "raw":
                summarize_raw(args.py_spy)
        return out
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
