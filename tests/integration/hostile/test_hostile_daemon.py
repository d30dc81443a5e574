"""The real daemon on the real broker under a producer that tries to break it.

About 30 kinds of hostile record (CONTRACT.md §1 v2 and issue 8: year-9999 and
clock-skewed ts, lone surrogates in model names and ids of predictions and
labels, 2,000 model names, K = 200,000 logits, 300-char / newline / ``..``
model names, 10 KB ids, control characters in segment values, deep nesting,
huge numbers, NaN, tombstones, binary garbage, oversize records, labels naming
unknown models, class count flips, duplicate storms, ...) interleaved with
valid traffic, with a kill -9 in the middle and one after the end.

One scenario (a module fixture) runs it and records what it saw; each test
asserts one guarantee on the record, so one broken guarantee does not hide
another:

- every hostile record is dead-lettered once with an allowed reason, and
  nothing valid is;
- the counters equal what the records imply, exactly once across kill -9;
- the window gauges equal a plain numpy computation over the valid joins;
- /metrics, /status, /reliability, /healthz, /readyz answered 200 throughout;
- RSS, the checkpoint and the /metrics page stay bounded;
- nothing is written outside ``recalibration.output_dir`` and the state dir;
- no log line is forged, and no model name becomes a label of a made-up model.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import socket
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from calmon.io.dead_letter import REASON_HEADER, SOURCE_HEADER
from tests.conftest import FAST_CLIENT, create_topics, free_port, unique_topic
from tests.daemon_helpers import (
    BASE_TS,
    CalmonDaemon,
    Producer,
    confidence_and_correct,
    dumps,
    end_positions,
    http_get,
    interleave,
    make_dataset,
    segment_labels,
    series,
    wait_until,
    write_config,
)
from tests.procfs import KIB, children, status

pytestmark = pytest.mark.integration

MAX_MODELS = 14
MAX_CLASSES = 1000
MAX_ID_BYTES = 256
MAX_NAME_BYTES = 128
SLICES = (("country",), ("device",))
ENDPOINTS = ("/metrics", "/status", "/reliability", "/healthz", "/readyz")
FORGED = "2026-01-01 00:00:00,000 ERROR calmon.daemon: FORGED"
RSS_GROWTH_LIMIT = 300 * 1024 * 1024  # the issue saw 1.3 GB for 2,000 model names
BIG = 2 * 1024 * 1024  # over kafka.max_record_bytes
SECRETS = ("ssl-Pa55word-1x", "webhook-Pa55word-2y", "webhook-Token-3z")
MAX_HTTP_CONNECTIONS = 32  # calmon.io.http.MAX_CONNECTIONS: what the server promises


# ---------------------------------------------------------------- the records


@dataclass
class Plan:
    """What was produced and what each record must become."""

    valid_preds: list[dict[str, Any]] = field(default_factory=list)  # joinable, in the reference
    valid_labels: list[dict[str, Any]] = field(default_factory=list)
    records: list[tuple[Any, ...]] = field(default_factory=list)  # (topic, key, value[, part])
    allowed: list[frozenset[str] | None] = field(default_factory=list)  # None: valid
    extra_predictions: int = 0  # valid predictions outside the reference (pending, dups)
    extra_labels: int = 0
    duplicates: int = 0
    pending: int = 0
    pending_labels: int = 0

    def valid(self, rec: tuple[Any, ...]) -> None:
        self.records.append(rec)
        self.allowed.append(None)

    def bad(self, rec: tuple[Any, ...], *reasons: str) -> None:
        self.records.append(rec)
        self.allowed.append(frozenset(reasons))

    @classmethod
    def of_valid(cls, n: int, seed: int, pt: str, lt: str) -> Plan:
        """``n`` valid pairs (dataset ``seed``), interleaved by ``seed + 1``."""
        plan = cls()
        preds, labels = make_dataset(n, seed=seed)
        for r in interleave(preds, labels, pt, lt, seed=seed + 1):
            plan.valid(r)
        plan.valid_preds += preds
        plan.valid_labels += labels
        return plan


def raw_json(text: str) -> bytes:
    """A JSON document written by hand (escapes such as ``\\udc00`` kept as they are)."""
    return text.encode("utf-8")


def phase1(pt: str, lt: str) -> Plan:
    """Valid traffic that admits the models, plus valid-but-odd records: ``..`` and
    ``../escape`` model names, a model that will flip its class count, the targets of
    out-of-range labels, labels naming models nobody predicts, a duplicate storm."""
    plan = Plan.of_valid(300, 81, pt, lt)
    rng = np.random.default_rng(83)
    # path-like model names are valid names; badly calibrated so recalibration publishes
    for model in ("..", "../escape"):
        for i in range(400):
            p = {"id": f"dots-{model}-{i}", "model": model, "ts": BASE_TS + 10 * i,
                 "prob": 0.9}
            lab = {"id": p["id"], "label": int(rng.random() < 0.3), "ts": p["ts"] + 5}
            plan.valid((pt, p["id"].encode(), dumps(p)))
            plan.valid((lt, p["id"].encode(), dumps(lab)))
            plan.valid_preds.append(p)
            plan.valid_labels.append(lab)
    # names that are valid but must be escaped wherever they are shown: in the
    # Prometheus text format (a label-injection attempt), in HTML, non-ASCII
    for j, model in enumerate(ODD_MODELS):
        for i in range(60):
            p = {"id": f"odd-{j}-{i}", "model": model, "ts": BASE_TS + 20 * i,
                 "prob": float(rng.uniform()),
                 "segment": {"country": ("🇩🇪", 'c"},y="2', "<b>x</b>")[i % 3]}}
            lab = {"id": p["id"], "label": int(rng.random() < p["prob"]), "ts": p["ts"] + 3}
            # valid records under absurd Kafka keys (the key is not the join key)
            key = rng.bytes(100_000) if i % 20 == 0 else p["id"].encode()
            plan.valid((pt, key, dumps(p)))
            plan.valid((lt, key, dumps(lab)))
            plan.valid_preds.append(p)
            plan.valid_labels.append(lab)
    # a binary model with live series: K-class records for it are classes_mismatch later
    for i in range(100):
        p = {"id": f"flip-{i}", "model": "flip", "ts": BASE_TS + 30 * i,
             "prob": float(rng.uniform())}
        lab = {"id": p["id"], "label": int(rng.random() < p["prob"]), "ts": p["ts"] + 1}
        plan.valid((pt, p["id"].encode(), dumps(p)))
        plan.valid((lt, p["id"].encode(), dumps(lab)))
        plan.valid_preds.append(p)
        plan.valid_labels.append(lab)
    # predictions whose labels (phase 2) are out of range: they stay pending
    for i in range(50):
        p = {"id": f"oor-{i}", "model": "ctr-prob", "ts": BASE_TS + i, "prob": 0.25}
        plan.valid((pt, p["id"].encode(), dumps(p)))
        plan.extra_predictions += 1
        plan.pending += 1
    # a duplicate storm: one prediction and one label, each sent 300 times
    storm_p = {"id": "storm", "model": "ctr-prob", "ts": BASE_TS + 77, "prob": 0.6}
    storm_l = {"id": "storm", "label": 1, "ts": BASE_TS + 99}
    for _ in range(300):
        plan.valid((pt, b"storm", dumps(storm_p), 0))
        plan.valid((lt, b"storm", dumps(storm_l), 0))
    plan.valid_preds.append(storm_p)
    plan.valid_labels.append(storm_l)
    plan.extra_predictions += 299
    plan.extra_labels += 299
    plan.duplicates += 2 * 299
    # labels naming models that never predicted: valid labels, no model, no series
    for i in range(300):
        lab = {"id": f"ghost-{i}", "label": 1, "model": f"ghost-model-{i}", "ts": BASE_TS + i}
        plan.valid((lt, lab["id"].encode(), dumps(lab)))
        plan.extra_labels += 1
        plan.pending_labels += 1
    return plan


ODD_MODELS = ("modèle-✓", 'inj"},x="1', "<script>alert(1)</script>")
# ctr-prob, ctr-logit, intent4, "..", "../escape", the odd ones, flip
ADMITTED_IN_PHASE1 = 6 + len(ODD_MODELS)


def phase2(pt: str, lt: str) -> Plan:
    """Hostile records of every kind among more valid traffic."""
    plan = Plan.of_valid(300, 84, pt, lt)
    rng = np.random.default_rng(86)
    ts = BASE_TS + 1000.0
    now = time.time()

    def pred(i: int, kind: str, **over: Any) -> dict[str, Any]:
        rec = {"id": f"h-{kind}-{i}", "model": "ctr-prob", "ts": ts, "prob": 0.5}
        rec.update(over)
        return {k: v for k, v in rec.items() if v is not None}  # None: drop the field

    def many(n: int, kind: str, topic: str, make: Any, *reasons: str) -> None:
        for i in range(n):
            value = make(i)
            plan.bad((topic, f"h-{kind}-{i}".encode(), value), *reasons)

    # 1-2: event time from the far future (year 9999), or beyond the clock skew
    many(20, "y9999", pt, lambda i: dumps(pred(i, "y9999", ts=253402300799)), "bad_ts")
    many(20, "skew", pt, lambda i: dumps(pred(i, "skew", ts=now + 3 * 3600)), "bad_ts")
    many(10, "isots", pt, lambda i: dumps(pred(i, "isots", ts="9999-12-31T23:59:59Z")),
         "bad_ts")
    many(10, "hugets", pt, lambda i: dumps(pred(i, "hugets", ts=1e300)), "bad_ts")
    many(10, "strts", pt, lambda i: dumps(pred(i, "strts", ts="yesterday")), "bad_ts")
    # 3-5: lone surrogates in a prediction's model, a label's model, an id
    many(20, "surp", pt, lambda i: raw_json(
        f'{{"id": "h-surp-{i}", "model": "m\\udc00{i}", "ts": {ts}, "prob": 0.5}}'), "not_utf8")
    many(20, "surl", lt, lambda i: raw_json(
        f'{{"id": "h-surl-{i}", "model": "\\ud800", "label": 1, "ts": {ts}}}'), "not_utf8")
    many(10, "surid", lt, lambda i: raw_json(
        f'{{"id": "h-\\udfff-{i}", "label": 1, "ts": {ts}}}'), "not_utf8")
    # 6: thousands of model names, in order on one partition: the first few fill
    # limits.max_models, the rest are too_many_models
    free = MAX_MODELS - ADMITTED_IN_PHASE1
    for i in range(2000):
        rec = (pt, f"flood-{i}".encode(),
               dumps({"id": f"flood-{i}", "model": f"flood-model-{i}", "ts": ts, "prob": 0.5}), 0)
        if i < free:
            plan.valid(rec)
            plan.extra_predictions += 1
            plan.pending += 1
        else:
            plan.bad(rec, "too_many_models")
    # 7: K = 200,000 logits (400 KB) for a new model and for a known one
    huge_k = b"[" + b",".join([b"0"] * 200_000) + b"]"
    plan.bad((pt, b"h-k200k-0", b'{"id": "h-k200k-0", "model": "wide", "ts": %.3f, "logits": %s}'
              % (ts, huge_k)), "too_many_classes")
    plan.bad((pt, b"h-k200k-1", b'{"id": "h-k200k-1", "model": "intent4", "ts": %.3f, '
              b'"logits": %s}' % (ts, huge_k)), "too_many_classes", "classes_mismatch")
    many(5, "k1001", pt, lambda i: dumps(pred(i, "k1001", model="wide2", prob=None,
                                              logits=[0.0] * (MAX_CLASSES + 1))),
         "too_many_classes", "multiple_scores")
    # 8-10: model names too long, with a newline (a forged log line), with ESC
    many(10, "long", pt, lambda i: dumps(pred(i, "long", model="M" * 300 + str(i))),
         "bad_model")
    many(10, "nl", pt, lambda i: dumps(pred(i, "nl", model=f"m{i}\n{FORGED}")), "bad_model")
    many(5, "esc", pt, lambda i: dumps(pred(i, "esc", model=f"m{i}\x1b[2J")), "bad_model")
    many(5, "nul", pt, lambda i: dumps(pred(i, "nul", model=f"m{i}\x00")), "bad_model")
    # 11: ids of 10 KB, on both topics; an id of another type
    many(10, "bigid", pt, lambda i: dumps(pred(i, "bigid", id="I" * 10_240 + str(i))), "bad_id")
    many(10, "bigidl", lt, lambda i: dumps({"id": "L" * 10_240 + str(i), "label": 1, "ts": ts}),
         "bad_id")
    many(5, "listid", pt, lambda i: dumps(pred(i, "listid", id=[i])), "bad_id")
    # 12: segment values with control characters, too long, of the wrong type
    many(10, "segcc", pt, lambda i: dumps(pred(i, "segcc", segment={"country": f"U\nS{i}"})),
         "bad_segment")
    many(10, "seglong", pt, lambda i: dumps(pred(i, "seglong",
                                                 segment={"country": "C" * 300})), "bad_segment")
    many(5, "segtype", pt, lambda i: dumps(pred(i, "segtype", segment=[1, 2])), "bad_segment")
    # 13: deep nesting
    many(3, "deep", pt, lambda i: b'{"id": "h-deep-%d", "model": "ctr-prob", "prob": 0.5, '
         b'"x": %s%s}' % (i, b"[" * 100_000, b"]" * 100_000), "not_json")
    # 14: huge numbers, NaN, infinities
    many(10, "hugep", pt, lambda i: b'{"id": "h-hugep-%d", "model": "ctr-prob", "ts": %.3f, '
         b'"prob": 1e400}' % (i, ts), "not_finite", "prob_out_of_range")
    many(10, "nan", pt, lambda i: b'{"id": "h-nan-%d", "model": "ctr-prob", "ts": %.3f, '
         b'"prob": NaN}' % (i, ts), "not_finite")
    many(10, "inf", pt, lambda i: b'{"id": "h-inf-%d", "model": "ctr-logit", "ts": %.3f, '
         b'"logit": -Infinity}' % (i, ts), "not_finite")
    many(5, "bignum", pt, lambda i: b'{"id": "h-bignum-%d", "model": "ctr-logit", "ts": %.3f, '
         b'"logit": %s}' % (i, ts, b"9" * 5000), "not_finite", "bad_score", "not_json")
    # 15: tombstones on both topics
    many(10, "tombp", pt, lambda i: None, "empty")
    many(10, "tombl", lt, lambda i: None, "empty")
    # 16: binary garbage
    many(20, "garbage", pt, lambda i: b"\xff\xfe" + rng.bytes(200), "not_utf8", "not_json")
    many(10, "garbagel", lt, lambda i: b"\x80" + rng.bytes(64), "not_utf8", "not_json")
    # 17: oversize
    many(2, "big", pt, lambda i: dumps(pred(i, "big", pad="x" * BIG)), "oversize")
    # 18: class count flips of a model with live series
    many(20, "flip", pt, lambda i: dumps(pred(i, "flip", model="flip", prob=None,
                                              probs=[0.2, 0.3, 0.5])), "classes_mismatch")
    # 19: out-of-range labels for the phase 1 "oor-*" predictions
    for i in range(50):
        plan.bad((lt, f"oor-{i}".encode(), dumps({"id": f"oor-{i}", "label": 7, "ts": ts})),
                 "label_out_of_range")
    # 20+: everything else a producer can get wrong
    many(10, "arr", pt, lambda i: b"[1, 2, %d]" % i, "not_object")
    many(10, "str", lt, lambda i: b'"just a string %d"' % i, "not_object")
    many(10, "trunc", pt, lambda i: b'{"id": "h-trunc-%d", "model": ' % i, "not_json")
    many(10, "noid", pt, lambda i: dumps({"model": "ctr-prob", "ts": ts, "prob": 0.5}),
         "missing_id")
    many(10, "nomodel", pt, lambda i: dumps({"id": f"h-nomodel-{i}", "ts": ts, "prob": 0.5}),
         "missing_model")
    many(10, "noscore", pt, lambda i: dumps(pred(i, "noscore", prob=None)), "no_score",
         "bad_score")
    many(10, "two", pt, lambda i: dumps(pred(i, "two", logit=0.0)), "multiple_scores")
    many(10, "range", pt, lambda i: dumps(pred(i, "range", prob=1.5 + i)), "prob_out_of_range")
    many(10, "norm", pt, lambda i: dumps(pred(i, "norm", model="intent4", prob=None,
                                              probs=[0.5, 0.3, 0.3, 0.1])),
         "probs_not_normalized")
    many(10, "badlabel", lt, lambda i: dumps({"id": f"h-badlabel-{i}", "label": [1]}),
         "bad_label")
    many(10, "nolabel", lt, lambda i: dumps({"id": f"h-nolabel-{i}", "ts": ts}),
         "missing_label", "bad_label")
    many(10, "numlabel", lt, lambda i: dumps({"id": f"h-numlabel-{i}", "label": 0.5}),
         "bad_label")
    return plan


def phase3(pt: str, lt: str) -> Plan:
    """Valid traffic after the last restart: joins still work."""
    plan = Plan.of_valid(150, 87, pt, lt)
    return plan


# ---------------------------------------------------------------- observing


def rss_bytes(pid: int) -> int:
    """Resident memory of ``pid`` and its children (the consumer process); a process
    that is gone by the time it is read counts nothing."""
    total = 0
    try:
        pids = [pid, *children(pid)]
    except OSError:
        pids = [pid]
    for p in pids:
        with contextlib.suppress(OSError, AssertionError):
            total += KIB * status(p, "VmRSS")
    return total


def threads(pid: int) -> int:
    return status(pid, "Threads")


def files_under(root: Path) -> set[Path]:
    return {p for p in root.rglob("*") if p.is_file()}


def files_beside(root: Path) -> set[Path]:
    """The files under ``root``'s parent but not under ``root``, less the brokers' own
    data (the broker fixtures keep theirs beside it, and write there all along)."""
    return {p for p in files_under(root.parent) - files_under(root)
            if not p.relative_to(root.parent).parts[0].startswith("broker-")}


@dataclass
class Seen:
    plan: Plan
    sent: list[Any]  # RecordMetadata, one per record of plan.records
    dlq: str
    bootstrap: str
    root: Path
    out_dir: Path
    state_dir: Path
    log: Path
    endpoint_codes: list[tuple[str, str, int]] = field(default_factory=list)  # when, path, code
    rss_start: int = 0
    rss_most: int = 0
    metrics_bytes_most: int = 0
    threads_base: int = 0
    threads_most: int = 0
    before_kill: dict[str, Any] = field(default_factory=dict)
    after_restart: dict[str, Any] = field(default_factory=dict)
    final_status: dict[str, Any] = field(default_factory=dict)
    final_scrape: dict[str, Any] = field(default_factory=dict)
    final_metrics_text: bytes = b""
    final_reliability: bytes = b""
    published: dict[str, float] = field(default_factory=dict)
    files_before: set[Path] = field(default_factory=set)
    outside_before: set[Path] = field(default_factory=set)
    outside_after: set[Path] = field(default_factory=set)


def probe(daemon: CalmonDaemon, seen: Seen, when: str) -> None:
    for path in ENDPOINTS:
        code, body = http_get(daemon.port, path, timeout=10)
        seen.endpoint_codes.append((when, path, code))
        if path == "/metrics":
            seen.metrics_bytes_most = max(seen.metrics_bytes_most, len(body))
    seen.rss_most = max(seen.rss_most, rss_bytes(daemon.pid))


def wait_positions_probing(daemon: CalmonDaemon, seen: Seen, expected: dict[str, int],
                           when: str, timeout: float = 120.0) -> None:
    def reached() -> bool:
        assert daemon.running, f"calmon died:\n{daemon.log_tail()}"
        probe(daemon, seen, when)
        code, body = http_get(daemon.port, "/status", timeout=10)
        return code == 200 and json.loads(body)["positions"] == expected

    wait_until(reached, timeout, f"positions {expected} ({when})", interval=0.2,
               detail=daemon.log_tail)


@pytest.fixture(scope="module")
def seen(tmp_path_factory: pytest.TempPathFactory, kafka_bootstrap: str) -> Iterator[Seen]:
    root = tmp_path_factory.mktemp("hostile")
    work = root / "work"
    work.mkdir()
    out_dir = work / "deep" / "er" / "calibrators"  # ".." twice would leave work/
    out_dir.mkdir(parents=True)
    pt, lt, dlq = unique_topic("hp"), unique_topic("hl"), unique_topic("hdlq")
    create_topics(kafka_bootstrap, [pt, lt, dlq], partitions=2,
                  configs={"max.message.bytes": str(16 * 1024 * 1024)})
    cfg = write_config(
        work / "calmon.yaml", kafka_bootstrap, pt, lt,
        kafka={"dead_letter_topic": dlq, "max_clock_skew": "1h",
               "client": {**FAST_CLIENT, "ssl_password": SECRETS[0]}},
        # a webhook nobody answers, with credentials: failed alerts are logged, masked
        alerts={"webhook": f"http://calmon:{SECRETS[1]}@127.0.0.1:{free_port()}"
                           f"/api/v2/alerts?token={SECRETS[2]}"},
        limits={"max_models": MAX_MODELS, "max_classes": MAX_CLASSES,
                "max_id_bytes": MAX_ID_BYTES, "max_name_bytes": MAX_NAME_BYTES},
        metrics={"bins": 15, "windows": ["7d"]},
        segments={"slices": [list(s) for s in SLICES], "max_values": 50},
        recalibration={"enabled": True, "interval": "3s", "min_samples": 200,
                       "cooldown": "1h", "method": "temperature", "output_dir": str(out_dir),
                       "window": "7d",
                       "triggers": {"ece_above": 0.05}},
    )
    p1, p2, p3 = phase1(pt, lt), phase2(pt, lt), phase3(pt, lt)
    plan = Plan()
    for p in (p1, p2, p3):
        plan.valid_preds += p.valid_preds
        plan.valid_labels += p.valid_labels
        plan.records += p.records
        plan.allowed += p.allowed
        for k in ("extra_predictions", "extra_labels", "duplicates", "pending",
                  "pending_labels"):
            setattr(plan, k, getattr(plan, k) + getattr(p, k))
    daemon = CalmonDaemon(cfg)
    seen_ = Seen(plan, [], dlq, kafka_bootstrap, root, out_dir, work / "calmon-state",
                 daemon.log)
    seen_.files_before = files_under(root)
    seen_.outside_before = files_beside(root)
    with daemon.start(), Producer(kafka_bootstrap) as producer:
        seen_.rss_start = rss_bytes(daemon.pid)
        # phase 1: admit the models
        md1 = producer.send(p1.records)
        wait_positions_probing(daemon, seen_, end_positions(md1), "phase 1")
        # the kill -9 below replays from the last checkpoint: let it hold phase 1 whole, so
        # "flip" has joined (live) samples in every consumption order of the replay
        daemon.wait_checkpoint_of(end_positions(md1), "a checkpoint after phase 1")
        # phase 2: the attack; kill -9 while it is being consumed, then restart
        rng = np.random.default_rng(89)
        order = list(range(len(p2.records)))
        # the flood keeps its order on partition 0; everything else is shuffled around it
        flood = [i for i, r in enumerate(p2.records) if r[1].startswith(b"flood-")]
        rest = [i for i in order if i not in set(flood)]
        rest = [rest[i] for i in rng.permutation(len(rest))]
        mixed: list[int] = []
        step = max(1, len(rest) // len(flood))
        for j, fi in enumerate(flood):
            mixed += [*rest[j * step:(j + 1) * step], fi]
        mixed += rest[len(flood) * step:]
        assert sorted(mixed) == order
        md2_mixed = producer.send([p2.records[i] for i in mixed])
        md2: list[Any] = [None] * len(mixed)
        for i, m in zip(mixed, md2_mixed):
            md2[i] = m
        wait_until(lambda: daemon.counters()["invalid"] > 0, 60, "the attack to be consumed")
        daemon.kill()
        daemon.start()
        probe(daemon, seen_, "after kill -9 mid-attack")
        wait_positions_probing(daemon, seen_, end_positions(md1 + md2), "phase 2")
        daemon.wait_checkpoint_of(end_positions(md1 + md2), "a checkpoint after the attack")
        # kill -9 once everything is checkpointed: the same counters come back
        seen_.before_kill = daemon.status()
        daemon.kill()
        daemon.start()
        seen_.after_restart = daemon.status()
        probe(daemon, seen_, "after the second kill -9")
        # 300 half-sent HTTP requests: a bounded number of threads, and probes answer again
        # once the held ones reach their deadline
        seen_.threads_base = seen_.threads_most = threads(daemon.pid)
        socks = []
        try:
            for _ in range(300):
                sock = socket.create_connection(("127.0.0.1", daemon.port), timeout=10)
                sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: calmon\r\n")
                socks.append(sock)
                seen_.threads_most = max(seen_.threads_most, threads(daemon.pid))

            def answers() -> bool:
                seen_.threads_most = max(seen_.threads_most, threads(daemon.pid))
                return http_get(daemon.port, "/healthz", timeout=2)[0] == 200

            wait_until(answers, 60, "/healthz 200 beside 300 half-sent requests")
        finally:
            for sock in socks:
                sock.close()
        # phase 3: joins go on
        md3 = producer.send(p3.records)
        wait_positions_probing(daemon, seen_, end_positions(md1 + md2 + md3), "phase 3")
        seen_.sent = md1 + md2 + md3
        # recalibration of the ".." models, so their calibrators are written somewhere
        # the live version (from output_dir): a publish before one of the restarts counts
        # too, where the process's recalibrations_total began again at 0
        def published() -> dict[str, float] | None:
            got = series(daemon.scrape(), "calmon_calibrator_version", "model", "segment")
            ok = {m: v for (m, _), v in got.items() if v >= 1 and m.startswith("..")}
            return ok if len(ok) == 2 else None

        try:
            seen_.published = wait_until(published, 90, "recalibration of the '..' models")
        except AssertionError:
            seen_.published = {}
        probe(daemon, seen_, "end")
        seen_.final_status = daemon.status()
        seen_.final_scrape = daemon.scrape()
        seen_.final_metrics_text = http_get(daemon.port, "/metrics")[1]
        seen_.final_reliability = http_get(daemon.port, "/reliability?window=7d")[1]
    seen_.outside_after = files_beside(root)
    yield seen_


# ---------------------------------------------------------------- the guarantees


def test_every_hostile_record_is_dead_lettered_once_with_an_allowed_reason(seen: Seen) -> None:
    plan = seen.plan
    want: dict[str, frozenset[str]] = {}
    key_of: dict[str, bytes | None] = {}
    for allowed, md, rec in zip(plan.allowed, seen.sent, plan.records):
        if allowed is not None:
            want[f"{md.topic}/{md.partition}/{md.offset}"] = allowed
            key_of[f"{md.topic}/{md.partition}/{md.offset}"] = rec[1]
    # dead letters are at-least-once across kill -9: read them all, keep one per source
    got = dead_letter_reasons(seen.bootstrap, seen.dlq, set(want), timeout=90)
    missing = set(want) - set(got)
    assert not missing, (len(missing), Counter((key_of[s] or b"").rstrip(b"0123456789")
                                               for s in missing))
    assert set(got) == set(want), f"valid records dead-lettered: {sorted(set(got) - set(want))}"
    wrong = {s: (got[s], sorted(want[s])) for s in want if got[s] not in want[s]}
    assert not wrong, f"{len(wrong)} with a wrong reason, e.g. {list(wrong.items())[:8]}"
    assert len(set(want.values())) >= 25  # kinds of attack


def dead_letter_reasons(bootstrap: str, topic: str, want: set[str],
                        timeout: float) -> dict[str, str]:
    """``calmon-source`` -> ``calmon-reason`` of every record on the dead-letter topic,
    read until every source in ``want`` is seen or ``timeout`` passes."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                             max_partition_fetch_bytes=16 * 1024 * 1024, **FAST_CLIENT)
    got: dict[str, str] = {}
    try:
        parts = wait_until(lambda: consumer.partitions_for_topic(topic), 30,
                           f"partitions of {topic}")
        tps = [TopicPartition(topic, p) for p in sorted(parts)]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        deadline = time.monotonic() + timeout
        while not want <= set(got) and time.monotonic() < deadline:
            for recs in consumer.poll(timeout_ms=500).values():
                for r in recs:
                    h = dict(r.headers)
                    got[h[SOURCE_HEADER].decode()] = h[REASON_HEADER].decode()
    finally:
        consumer.close(autocommit=False)
    return got


def expected_counters(plan: Plan) -> dict[str, int]:
    invalid = sum(a is not None for a in plan.allowed)
    return {"predictions": len(plan.valid_preds) + plan.extra_predictions,
            "labels": len(plan.valid_labels) + plan.extra_labels,
            "joined": len(plan.valid_preds), "invalid": invalid,
            "duplicates": plan.duplicates, "expired": 0}


def test_counters_are_exact_across_kill_9(seen: Seen) -> None:
    want = expected_counters(seen.plan)
    c = seen.final_status["counters"]
    assert {k: c[k] for k in want} == want
    assert seen.final_status["pending"] == seen.plan.pending
    assert seen.final_status["pending_labels"] == seen.plan.pending_labels


def test_kill_9_after_a_checkpoint_restores_the_same_counters(seen: Seen) -> None:
    keys = ("counters", "pending", "pending_labels", "positions", "event_time")
    assert {k: seen.after_restart[k] for k in keys} == {k: seen.before_kill[k] for k in keys}


def test_window_gauges_equal_the_reference(seen: Seen) -> None:
    """Per model and segment: sample count exact, ECE equal to a plain numpy ECE over
    the valid joins (to 1e-9)."""
    plan = seen.plan
    label_of = {str(lab["id"]): int(lab["label"]) for lab in plan.valid_labels}
    conf: dict[tuple[str, str], list[float]] = {}
    corr: dict[tuple[str, str], list[int]] = {}
    for p in plan.valid_preds:
        c, k = confidence_and_correct(p, label_of[str(p["id"])])
        for seg in segment_labels(p, SLICES):
            conf.setdefault((p["model"], seg), []).append(c)
            corr.setdefault((p["model"], seg), []).append(k)
    sc = seen.final_scrape
    samples = series(sc, "calmon_window_samples", "model", "segment", "window")
    eces = series(sc, "calmon_ece", "model", "segment", "window")
    got_n = {(m, s): v for (m, s, w), v in samples.items() if w == "7d" and v > 0}
    assert got_n == {k: float(len(v)) for k, v in conf.items()}
    edges = np.linspace(0, 1, 16)
    for key, cs in conf.items():
        x, y = np.array(cs), np.array(corr[key], dtype=float)
        b = np.clip(np.searchsorted(edges, x, side="left") - 1, 0, 14)
        want = sum(abs(x[b == i].mean() - y[b == i].mean()) * (b == i).sum()
                   for i in range(15) if (b == i).any()) / len(x)
        assert math.isclose(eces[(*key, "7d")], want, abs_tol=1e-9), key


def test_every_endpoint_answered_200_throughout(seen: Seen) -> None:
    assert len(seen.endpoint_codes) >= 5 * 4
    bad = [(w, p, c) for w, p, c in seen.endpoint_codes if c != 200]
    assert not bad, bad[:10]


def test_half_sent_requests_hold_a_bounded_number_of_threads(seen: Seen) -> None:
    assert seen.threads_base > 0
    # (+8: threads the scheduler, alerts or the producer may start meanwhile)
    assert seen.threads_most - seen.threads_base <= MAX_HTTP_CONNECTIONS + 8, (
        seen.threads_base, seen.threads_most)


def test_memory_checkpoint_and_metrics_stay_bounded(seen: Seen) -> None:
    assert seen.rss_most - seen.rss_start < RSS_GROWTH_LIMIT, (seen.rss_start, seen.rss_most)
    assert seen.metrics_bytes_most < 4 * 1024 * 1024, seen.metrics_bytes_most
    state = sum(p.stat().st_size for p in seen.state_dir.rglob("*") if p.is_file())
    assert state < 64 * 1024 * 1024, state


def test_nothing_written_outside_output_dir(seen: Seen) -> None:
    assert seen.outside_after == seen.outside_before
    new = files_under(seen.root) - seen.files_before
    allowed_roots = (seen.out_dir, seen.state_dir)
    stray = [p for p in new if not any(p.is_relative_to(r) for r in allowed_roots)
             and p not in (seen.log,)]
    assert not stray, stray
    # recalibration did run on the ".." models, and their calibrators are inside
    assert seen.published, "no calibrator published for the '..' models within 90 s"
    assert any(p.is_relative_to(seen.out_dir) for p in new)


def test_no_secret_in_the_log(seen: Seen) -> None:
    text = seen.log.read_text(encoding="utf-8", errors="replace")
    leaked = [s for s in SECRETS if s in text]
    assert not leaked, leaked
    # the webhook is dead, so every alert fails: each failure of the last process is
    # logged once, naming the masked URL (a process killed between a publish and its
    # alert's last retry logs none: tests/unit/recal/test_alerts.py covers that path)
    last = text.rpartition("===== start ")[2]
    failed = sum(series(seen.final_scrape, "calmon_alerts_failed_total").values())
    assert last.count("not delivered to http://***@127.0.0.1:") >= failed, failed


def test_no_forged_log_line_and_no_made_up_model(seen: Seen) -> None:
    lines = seen.log.read_text(encoding="utf-8", errors="replace").splitlines()
    assert not [ln for ln in lines if ln.startswith(FORGED[:30])]
    stamp = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} [A-Z]+ ")
    for ln in lines:  # every line is a log record, a traceback line, or a start marker
        assert (stamp.match(ln) or ln.startswith(("=====", " ", "Traceback", "\t")) or not ln
                or re.match(r"^[A-Za-z_.]+(Error|Exception|Interrupt)\b", ln)), ln
    sc = seen.final_scrape
    models = {dict(k).get("model") for name, samples in sc.items() for k in samples
              if name.startswith("calmon_")}
    models.discard(None)
    assert not {m for m in models if m.startswith(("ghost-model", "wide", "M" * 50))}
    assert sum(m.startswith("flood-model-") for m in models) <= MAX_MODELS - ADMITTED_IN_PHASE1
    counts = Counter(len(m.encode()) <= MAX_NAME_BYTES and m.isprintable() for m in models)
    assert counts[False] == 0


def test_odd_names_are_escaped_not_injected(seen: Seen) -> None:
    """A model name with quotes and braces stays one label value on /metrics (no label
    ``x``, no extra series); HTML in a name or segment value is escaped on /reliability."""
    sc = seen.final_scrape
    labels = {k for samples in sc.values() for key in samples for k, _ in key}
    assert "x" not in labels and "y" not in labels
    models = {dict(key).get("model") for samples in sc.values() for key in samples}
    assert set(ODD_MODELS) <= models
    segments = {dict(key).get("segment") for samples in sc.values() for key in samples}
    assert {"country=🇩🇪", 'country=c"},y="2', "country=<b>x</b>"} <= segments
    text = seen.final_metrics_text.decode("utf-8")
    assert 'model="inj\\"},x=\\"1"' in text
    page = seen.final_reliability.decode("utf-8")
    assert "<script>alert(1)</script>" not in page and "<b>x</b>" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
