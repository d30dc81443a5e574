"""Helpers for the ``calmon run`` acceptance tests (tests/integration/test_daemon_*.py).

The daemon always runs as a real subprocess (``python -m calmon run -c cfg``)
against a real Kafka-compatible broker. Every wait is a condition polled with a
deadline (``wait_until``), never a bare sleep. Expected numbers come from what
the tests produced or from ``calmon replay --json`` over the same records.
"""

from __future__ import annotations

import json
import math
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import FAST_CLIENT, _free_port

REPO = Path(__file__).resolve().parent.parent
BASE_TS = 1_764_460_800.0  # 2025-11-30T00:00:00Z
COUNTER_KEYS = ("predictions", "labels", "joined", "invalid", "expired", "duplicates")
ROW_METRICS = {  # Prometheus gauge -> key of a `calmon replay --json` row
    "calmon_window_samples": "samples",
    "calmon_ece": "ece",
    "calmon_mce": "mce",
    "calmon_ace": "ace",
    "calmon_brier": "brier",
    "calmon_nll": "nll",
    "calmon_accuracy": "accuracy",
    "calmon_mean_confidence": "mean_confidence",
    "calmon_observed_rate": "observed_rate",
    "calmon_observed_over_expected": "observed_over_expected",
    "calmon_ece_noise_floor": "noise_floor",
}
STOP_TIMEOUT_S = 10.0
# Deadlines of waits on the daemon. Generous: a 2-core machine running a test suite
# beside a load generator (tests/stress.py) can be many times slower than an idle one,
# and a wait that succeeds returns as soon as its condition holds, so headroom is free.
START_TIMEOUT_S = 60.0
PROGRESS_TIMEOUT_S = 120.0  # consuming what a test produced
CHECKPOINT_TIMEOUT_S = 60.0  # a checkpoint flushes dead letters (up to 5 s) and fsyncs
HTTP_TIMEOUT_S = 10.0


# ---------------------------------------------------------------- waiting


def wait_until(
    cond: Callable[[], Any],
    timeout: float,
    what: str = "condition",
    interval: float = 0.05,
    detail: Callable[[], Any] | None = None,
    retry_on: tuple[type[Exception], ...] = (),
) -> Any:
    """Poll ``cond`` until it returns something truthy (returned) or fail after
    ``timeout`` seconds, naming ``what`` it waited for. ``detail`` adds context to
    the failure message; ``retry_on``: exceptions of ``cond`` that count as "not
    yet" (the last one is chained to the failure)."""
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while True:
        try:
            value = cond()
        except retry_on as exc:
            value, last = None, exc
        if value:
            return value
        if time.monotonic() > deadline:
            extra = "" if last is None else f" (last error: {last!r})"
            if detail is not None:
                try:
                    extra += f"\n{detail()}"
                except Exception as exc:  # the detail is best effort
                    extra += f"\n(no detail: {exc!r})"
            raise AssertionError(f"timed out after {timeout}s waiting for {what}{extra}") from last
        time.sleep(interval)  # polling interval of a deadline-bounded wait


# ---------------------------------------------------------------- HTTP


def http_get(port: int, path: str, timeout: float = HTTP_TIMEOUT_S) -> tuple[int, bytes]:
    """(status, body); (0, b"") when nothing answers."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except (OSError, urllib.error.URLError):
        return 0, b""


@contextmanager
def idle_connections(port: int, count: int) -> Iterator[None]:
    """``count`` idle connections to ``port``, held open by a thread and each re-opened
    as the server closes it (the slow-client attack), for as long as the block runs."""
    stop = threading.Event()
    opened = threading.Event()

    def attack() -> None:
        idle: list[socket.socket] = []
        try:
            while not stop.is_set():
                while len(idle) < count:
                    idle.append(socket.create_connection(("127.0.0.1", port), timeout=5))
                opened.set()
                for s in list(idle):  # re-open the ones the server closed
                    s.setblocking(False)
                    try:
                        if s.recv(1) == b"":
                            idle.remove(s)
                            s.close()
                    except BlockingIOError:
                        pass
                    except OSError:
                        idle.remove(s)
                        s.close()
                stop.wait(0.01)  # the attack's pace, not a synchronisation
        finally:
            for s in idle:
                s.close()

    attacker = threading.Thread(target=attack, daemon=True)
    attacker.start()
    try:
        assert opened.wait(30), f"{count} connections to port {port} did not open"
        yield
    finally:
        stop.set()
        attacker.join(10)


def get_status(port: int) -> dict[str, Any]:
    code, body = http_get(port, "/status")
    assert code == 200, f"/status answered {code}"
    return json.loads(body)


Scrape = dict[str, dict[frozenset[tuple[str, str]], float]]


def parse_metrics(text: str) -> Scrape:
    """Sample name -> {frozenset(label items): value} (counters keep ``_total``)."""
    out: Scrape = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, {})[frozenset(s.labels.items())] = s.value
    return out


def scrape(port: int) -> Scrape:
    code, body = http_get(port, "/metrics")
    assert code == 200, f"/metrics answered {code}"
    return parse_metrics(body.decode("utf-8"))


def series(sc: Scrape, name: str, *labels: str) -> dict[tuple[str, ...], float]:
    """The samples of ``name`` keyed by the values of ``labels`` (in that order)."""
    out: dict[tuple[str, ...], float] = {}
    for key, value in sc.get(name, {}).items():
        d = dict(key)
        k = tuple(d[lab] for lab in labels)
        assert k not in out, f"{name}: two samples for {k}"
        out[k] = value
    return out


# ---------------------------------------------------------------- configs


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        else:
            out[k] = v
    return out


def write_config(
    path: Path,
    bootstrap: str,
    predictions_topic: str,
    labels_topic: str,
    **overrides: Any,
) -> Path:
    """A daemon config: free port, state under ``path``'s directory, unique group,
    checkpoints every 500 ms, recalibration off, join TTLs far beyond the test data
    (so nothing expires and any consumption order gives the same joins).
    ``overrides`` are merged section by section."""
    cfg: dict[str, Any] = {
        "kafka": {
            "bootstrap_servers": bootstrap,
            "group_id": f"calmon-test-{uuid.uuid4().hex[:10]}",
            "predictions_topic": predictions_topic,
            "labels_topic": labels_topic,
            "client": dict(FAST_CLIENT),
        },
        "join": {"ttl": "7d", "label_ttl": "2d"},
        # every family of every series (the tests compare them all with replay), and the
        # expensive statistics refreshed every second
        "metrics": {"bins": 15, "windows": ["1h", "24h", "7d"], "refresh": "1s",
                    "export": {"bins": "all", "segment_families": None}},
        "segments": {"slices": [["country"], ["device"]], "max_values": 50},
        "recalibration": {"enabled": False},
        "server": {"host": "127.0.0.1", "port": _free_port()},
        "state": {"dir": str(path.parent / f"{path.stem}-state"), "checkpoint_interval": "500ms"},
    }
    cfg = _merge(cfg, overrides)
    path.write_text(yaml.safe_dump(cfg, sort_keys=False), encoding="utf-8")
    return path


def load_config(path: Path) -> dict[str, Any]:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def subprocess_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env.setdefault("CALMON_LOG_LEVEL", "INFO")
    env["PYTHONUNBUFFERED"] = "1"
    return env


# ---------------------------------------------------------------- the daemon


class CalmonDaemon:
    """``calmon run -c cfg`` as a subprocess; a context manager.

    ``start()`` waits (with a deadline) until /readyz answers 200 unless
    ``wait_ready=False``; leaving the context SIGTERMs it, SIGKILLs it if it does not
    exit, and asserts that nothing is left running.
    """

    def __init__(self, config: Path, log: Path | None = None, args: Sequence[str] = ()) -> None:
        self.config = config
        self.args = tuple(args)  # more arguments of ``calmon run``
        self.port = int(load_config(config)["server"]["port"])
        self.log = log or config.with_suffix(".log")
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    # -- lifecycle

    def start(self, *, wait_ready: bool = True, timeout: float = START_TIMEOUT_S
              ) -> CalmonDaemon:
        assert self.proc is None or self.proc.poll() is not None, "already running"
        self.starts += 1
        with self.log.open("ab") as out:
            out.write(f"\n===== start {self.starts} =====\n".encode())
            out.flush()
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "calmon", "run", "-c", str(self.config), *self.args],
                cwd=str(self.config.parent),
                env=subprocess_env(),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        if wait_ready:
            self.wait_ready(timeout)
        return self

    def wait_ready(self, timeout: float = START_TIMEOUT_S) -> None:
        def ready() -> bool:
            if self.proc is not None and self.proc.poll() is not None:
                raise AssertionError(
                    f"calmon exited with {self.proc.returncode} before /readyz was 200:\n"
                    f"{self.log_tail()}"
                )
            return http_get(self.port, "/readyz", timeout=1.0)[0] == 200

        wait_until(ready, timeout, "calmon /readyz 200", detail=self.log_tail)

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def kill(self) -> int:
        """SIGKILL (a crash); returns the exit status."""
        assert self.proc is not None and self.running, "not running"
        self.proc.send_signal(signal.SIGKILL)
        return self.proc.wait(10)

    def terminate(self, timeout: float = STOP_TIMEOUT_S) -> int:
        """SIGTERM and wait up to ``timeout`` s; returns the exit code (raises
        subprocess.TimeoutExpired when it is still running)."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def stop(self) -> None:
        proc = self.proc
        if proc is None:
            return
        try:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(STOP_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(10)
        finally:
            assert proc.poll() is not None, f"calmon pid {proc.pid} is still running"
            # the HTTP port is free again once the process is gone
            assert http_get(self.port, "/healthz", timeout=0.5)[0] == 0

    def __enter__(self) -> CalmonDaemon:
        if self.proc is None:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- reading

    def status(self) -> dict[str, Any]:
        return get_status(self.port)

    def counters(self) -> dict[str, int]:
        return self.status()["counters"]

    def scrape(self, fresh: float | None = START_TIMEOUT_S) -> Scrape:
        """/metrics, once the statistics served reflect the engine's latest batch (the
        loop publishes them shortly after it). Fails after ``fresh`` seconds without
        that, saying what /status showed. ``fresh=None``: at once, for a daemon under
        steady traffic, whose statistics are never caught up with its latest batch."""
        if fresh is None:
            return scrape(self.port)
        wait_until(lambda: (self.status().get("statistics") or {}).get("current"), fresh,
                   "/status statistics.current (the served statistics of the latest batch)",
                   detail=lambda: {"statistics": self.status().get("statistics"),
                                   "log": self.log_tail(10)})
        return scrape(self.port)

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def wait_counters(self, expected: dict[str, int], timeout: float = PROGRESS_TIMEOUT_S
                      ) -> dict[str, Any]:
        """Wait until every /status counter in ``expected`` has at least its value;
        returns that /status."""

        def reached() -> dict[str, Any] | None:
            assert self.running, f"calmon died:\n{self.log_tail()}"
            st = self.status()
            c = st["counters"]
            return st if all(c.get(k, 0) >= v for k, v in expected.items()) else None

        return wait_until(reached, timeout, f"/status counters >= {expected}",
                          detail=lambda: self.status())

    def wait_positions(self, expected: dict[str, int], timeout: float = PROGRESS_TIMEOUT_S
                       ) -> dict[str, Any]:
        """Wait until /status positions (``topic/partition`` -> next offset) equal
        ``expected`` (from the produce acknowledgements, never from end offsets)."""

        def reached() -> dict[str, Any] | None:
            assert self.running, f"calmon died:\n{self.log_tail()}"
            st = self.status()
            return st if st["positions"] == expected else None

        return wait_until(reached, timeout, f"/status positions == {expected}",
                          detail=lambda: self.status())

    def wait_checkpoint_of(self, expected: dict[str, int], what: str = "a checkpoint",
                           timeout: float = CHECKPOINT_TIMEOUT_S) -> dict[str, Any]:
        """Wait until the newest checkpoint holds these positions (``topic/partition`` ->
        next offset): what a checkpoint covers, not when it was written, so a checkpoint
        written just before the caller looked counts too."""

        def covered() -> dict[str, Any] | None:
            assert self.running, f"calmon died:\n{self.log_tail()}"
            st = self.status()
            return st if st["checkpoint_positions"] == expected else None

        return wait_until(covered, timeout, what, detail=lambda: self.status())

    def wait_checkpoint(self, after: float | None = None, what: str = "a checkpoint",
                        timeout: float = CHECKPOINT_TIMEOUT_S) -> dict[str, Any]:
        """Wait until /status shows a checkpoint (written after the Unix time ``after``
        when given); returns that /status."""

        def written() -> dict[str, Any] | None:
            assert self.running, f"calmon died:\n{self.log_tail()}"
            st = self.status()
            ts = st["last_checkpoint_timestamp"]
            return st if ts is not None and (after is None or ts > after) else None

        return wait_until(written, timeout, what, detail=self.log_tail)


def run_calmon(*args: str, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "calmon", *args],
        cwd=str(REPO),
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def replay_json(config: Path, predictions: Path, labels: Path) -> dict[str, Any]:
    """``calmon replay --json`` over the given files (the independent reference)."""
    proc = run_calmon("replay", "--predictions", str(predictions), "--labels", str(labels),
                      "-c", str(config), "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


# ---------------------------------------------------------------- producing


class Producer:
    """One KafkaProducer for several topics; ``send`` waits for every ack and
    returns the RecordMetadata."""

    def __init__(self, bootstrap: str, **settings: Any) -> None:
        from kafka import KafkaProducer

        self._p = KafkaProducer(
            bootstrap_servers=bootstrap,
            max_request_size=16 * 1024 * 1024,
            request_timeout_ms=5000,
            linger_ms=5,
            **settings,
        )

    def send(self, records: Iterable[tuple[Any, ...]], timeout: float = 30.0) -> list[Any]:
        """``records``: (topic, key, value) or (topic, key, value, partition)."""
        futures = [self._p.send(r[0], key=r[1], value=r[2],
                                partition=r[3] if len(r) > 3 else None) for r in records]
        self._p.flush(timeout)
        return [f.get(timeout) for f in futures]

    def close(self) -> None:
        self._p.close(timeout=5)

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def produce_all(bootstrap: str, records: Iterable[tuple[str, bytes, bytes]],
                timeout: float = 300.0) -> int:
    """Every (topic, key, value) produced and acknowledged, through librdkafka: a
    backlog of 100,000s of records in seconds (kafka-python's send costs ~100 us of
    Python a record). Keyed records go where kafka-python's default partitioner puts
    them (murmur2, as Java's). Returns how many were sent."""
    from confluent_kafka import Producer as RdProducer

    p = RdProducer({"bootstrap.servers": bootstrap, "linger.ms": 5,
                    "partitioner": "murmur2_random", "message.max.bytes": 16 * 1024 * 1024,
                    "queue.buffering.max.messages": 200_000})
    errors: list[str] = []

    def delivered(err: object, _msg: object) -> None:
        if err is not None:
            errors.append(str(err))

    n = 0
    for topic, key, value in records:
        while True:
            try:
                p.produce(topic, value=value, key=key, on_delivery=delivered)
                break
            except BufferError:  # the local queue is full: let it drain
                p.poll(0.05)
        n += 1
    assert p.flush(timeout) == 0 and not errors, errors[:3]
    return n


def end_positions(metadata: Iterable[Any]) -> dict[str, int]:
    """``topic/partition`` -> last produced offset + 1, from produce acknowledgements."""
    out: dict[str, int] = {}
    for md in metadata:
        key = f"{md.topic}/{md.partition}"
        out[key] = max(out.get(key, 0), md.offset + 1)
    return out


def dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


# ---------------------------------------------------------------- test data


COUNTRIES = ("US", "DE", "FR", "BR", "JP")
DEVICES = ("ios", "android", "web")
EDGE_PROBS = (0.0, 0.2, 0.4, 1.0, 1.0 / 3.0)  # on or near bin edges (right-closed bins)


def make_dataset(n: int, seed: int, span_s: float = 7200.0,
                 max_delay_s: float = 900.0) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``n`` predictions over three models and a label for each, ids unique.

    Models: ``ctr-prob`` (binary ``prob``), ``ctr-logit`` (binary ``logit``),
    ``intent4`` (4 classes, ``probs`` or ``logits`` at random). Segment keys
    ``country`` and ``device`` (device sometimes absent). Prediction ts spread
    over ``span_s``; each label ``ts`` is its prediction's plus a random delay.
    """
    rng = np.random.default_rng(seed)
    preds: list[dict[str, Any]] = []
    labels: list[dict[str, Any]] = []
    models = ("ctr-prob", "ctr-logit", "intent4")
    for i in range(n):
        model = models[i % 3]
        ts = round(BASE_TS + float(rng.uniform(0, span_s)), 3)
        seg: dict[str, str] = {"country": COUNTRIES[int(rng.integers(len(COUNTRIES)))]}
        if rng.random() > 0.05:
            seg["device"] = DEVICES[int(rng.integers(len(DEVICES)))]
        rec: dict[str, Any] = {"id": f"{model}-{seed}-{i}", "model": model, "ts": ts,
                               "segment": seg}
        if model == "ctr-prob":
            p = (EDGE_PROBS[int(rng.integers(len(EDGE_PROBS)))] if rng.random() < 0.05
                 else float(rng.beta(1.2, 3.0)))
            rec["prob"] = p
            y = int(rng.random() < min(1.0, p * 1.3))
        elif model == "ctr-logit":
            z = float(rng.normal(-1.0, 2.0))
            rec["logit"] = z
            y = int(rng.random() < 1.0 / (1.0 + math.exp(-0.7 * z)))
        else:
            z = rng.normal(0.0, 1.5, 4)
            probs = np.exp(z) / np.exp(z).sum()
            if rng.random() < 0.5:
                rec["logits"] = [float(v) for v in z]
            else:
                rec["probs"] = [float(v) for v in probs]
            y = int(rng.choice(4, p=0.6 * probs + 0.1))
        preds.append(rec)
        labels.append({"id": rec["id"], "label": y,
                       "ts": round(ts + float(rng.uniform(0, max_delay_s)), 3)})
    return preds, labels


def interleave(preds: Sequence[dict[str, Any]], labels: Sequence[dict[str, Any]],
               pred_topic: str, label_topic: str, seed: int,
               ) -> list[tuple[str, bytes, bytes]]:
    """Every record as (topic, key=id, JSON value) in a random order, so many labels
    are sent before their prediction."""
    rng = np.random.default_rng(seed)
    out = [(pred_topic, str(p["id"]).encode(), dumps(p)) for p in preds]
    out += [(label_topic, str(lab["id"]).encode(), dumps(lab)) for lab in labels]
    order = rng.permutation(len(out))
    return [out[i] for i in order]


def write_jsonl(path: Path, records: Iterable[dict[str, Any]]) -> Path:
    with path.open("wb") as f:
        for r in records:
            f.write(dumps(r) + b"\n")
    return path


# ---------------------------------------------------------------- independent numbers


def _sigmoid(z: np.ndarray) -> np.ndarray:
    out = np.empty_like(z)
    pos = z >= 0
    out[pos] = 1.0 / (1.0 + np.exp(-z[pos]))
    e = np.exp(z[~pos])
    out[~pos] = e / (1.0 + e)
    return out


def confidence_and_correct(pred: dict[str, Any], label: int) -> tuple[float, int]:
    """The calibration target of one joined pair: binary P(y=1) vs y; multiclass
    top-label probability vs correctness."""
    if "prob" in pred:
        return float(pred["prob"]), label
    if "logit" in pred:
        return float(_sigmoid(np.array([pred["logit"]], dtype=np.float64))[0]), label
    if "probs" in pred:
        p = np.array([pred["probs"]], dtype=np.float64)
        p /= p.sum(axis=1, keepdims=True)
    else:
        z = np.array([pred["logits"]], dtype=np.float64)
        e = np.exp(z - z.max(axis=1, keepdims=True))
        p = e / e.sum(axis=1, keepdims=True)
    return float(p.max()), int(int(p.argmax()) == label)


def segment_labels(pred: dict[str, Any], slices: Sequence[Sequence[str]]) -> list[str]:
    seg = pred.get("segment") or {}
    out = ["__all__"]
    for sl in slices:
        if all(k in seg for k in sl):
            out.append(",".join(f"{k}={seg[k]}" for k in sl))
    return out


def expected_bins(
    preds: Sequence[dict[str, Any]],
    labels: Sequence[dict[str, Any]],
    bins: int = 15,
    slices: Sequence[Sequence[str]] = (("country",), ("device",)),
) -> tuple[Counter[tuple[str, str, str]], Counter[tuple[str, str, str]]]:
    """(samples, correct) per (model, segment, bin) of the joined pairs, right-closed
    equal-width bins as scikit-learn's calibration_curve."""
    by_id = {str(lab["id"]): int(lab["label"]) for lab in labels}
    edges = np.linspace(0.0, 1.0, bins + 1)[1:-1]
    counts: Counter[tuple[str, str, str]] = Counter()
    correct: Counter[tuple[str, str, str]] = Counter()
    for p in preds:
        y = by_id.get(str(p["id"]))
        if y is None:
            continue
        conf, corr = confidence_and_correct(p, y)
        b = str(int(np.searchsorted(edges, conf, side="left")))
        for seg in segment_labels(p, slices):
            counts[(p["model"], seg, b)] += 1
            correct[(p["model"], seg, b)] += corr
    return counts, correct


def replay_rows(replay: dict[str, Any]) -> dict[tuple[str, str, str], dict[str, Any]]:
    return {(r["model"], r["segment"], r["window"]): r for r in replay["rows"]}


def assert_gauges_match_replay(sc: Scrape, replay: dict[str, Any], tol: float = 1e-12) -> int:
    """Every row gauge on /metrics equals the replay's row value (and no series is
    missing or extra). Returns how many values were compared."""
    rows = replay_rows(replay)
    compared = 0
    for metric, key in ROW_METRICS.items():
        got = series(sc, metric, "model", "segment", "window")
        want = {k: r[key] for k, r in rows.items() if r[key] is not None}
        assert set(got) == set(want), (
            f"{metric}: series differ: only on /metrics {sorted(set(got) - set(want))[:5]}, "
            f"only in replay {sorted(set(want) - set(got))[:5]}")
        for k, v in want.items():
            assert math.isclose(got[k], v, rel_tol=0.0, abs_tol=tol), (metric, k, got[k], v)
            compared += 1
    return compared


def window_gauges(sc: Scrape) -> dict[tuple[str, str, str, str], float]:
    """All row gauges as (metric, model, segment, window) -> value."""
    out = {}
    for metric in ROW_METRICS:
        for k, v in series(sc, metric, "model", "segment", "window").items():
            out[(metric, *k)] = v
    return out
