"""Issue 21, the I/O side, against the real daemon on the real broker: every codec
joins exactly; a gzip bomb and a garbage batch are skipped with a reason, dead-lettered,
in bounded memory; a confluent message error is counted, not fatal; probes answer under
40 idle connections; ``${VAR}`` values stay strings; an alias bomb and hostile
checkpoints are refused cleanly."""

from __future__ import annotations

import hashlib
import io
import json
import math
import struct
import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from calmon.io.checkpoint import _HEADER, FORMAT_VERSION, MAGIC, encode
from calmon.io.dead_letter import REASON_HEADER, SOURCE_HEADER
from tests.conftest import consume
from tests.daemon_helpers import (
    REPO,
    CalmonDaemon,
    Producer,
    confidence_and_correct,
    dumps,
    end_positions,
    http_get,
    idle_connections,
    interleave,
    make_dataset,
    series,
    subprocess_env,
    wait_until,
    write_config,
)
from tests.hostile_batches import ALIAS_BOMB, MIB, gzip_bomb, gzip_payload, send_one_batch
from tests.procfs import KIB, children, status

pytestmark = pytest.mark.integration

CODECS = ("lz4", "zstd", "snappy")
MEMORY_LIMIT = 2 * 1024 * MIB  # the manifests' limit


def reference_ece(preds: list[dict[str, Any]], labels: list[dict[str, Any]]
                  ) -> dict[str, tuple[int, float]]:
    """Per model: joined samples and the plain numpy ECE of 15 right-closed bins."""
    label_of = {lab["id"]: int(lab["label"]) for lab in labels}
    conf: dict[str, list[float]] = {}
    corr: dict[str, list[int]] = {}
    for p in preds:
        c, k = confidence_and_correct(p, label_of[p["id"]])
        conf.setdefault(p["model"], []).append(c)
        corr.setdefault(p["model"], []).append(k)
    edges = np.linspace(0, 1, 16)
    out = {}
    for model, cs in conf.items():
        x, y = np.array(cs), np.array(corr[model], dtype=float)
        b = np.clip(np.searchsorted(edges, x, side="left") - 1, 0, 14)
        ece = sum(abs(x[b == i].mean() - y[b == i].mean()) * (b == i).sum()
                  for i in range(15) if (b == i).any()) / len(x)
        out[model] = (len(x), ece)
    return out


# a batch that cannot be decoded only reaches a consumer through a broker that stores
# it unchecked; Apache Kafka refuses it at produce (io/test_compressed_batches.py)
@pytest.mark.brokers("tansu")
def test_codecs_join_exactly_and_bad_batches_are_skipped_in_bounded_memory(
        kafka_bootstrap: str, kafka_topics: Callable[..., list[str]], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    preds_t, labels_t, dlq = kafka_topics(count=3, partitions=2)
    # ${VAR} values are strings: this group is "007", not the integer 7
    monkeypatch.setenv("CALMON_TEST_GROUP", "007")
    monkeypatch.setenv("CALMON_TEST_TIMEOUT_MS", "5000")
    cfg = write_config(tmp_path / "calmon.yaml", kafka_bootstrap, preds_t, labels_t,
                       kafka={"dead_letter_topic": dlq, "group_id": "${CALMON_TEST_GROUP}",
                              "client": {"request_timeout_ms": "${CALMON_TEST_TIMEOUT_MS}"}})
    preds, labels = make_dataset(600, seed=2101)
    records = interleave(preds, labels, preds_t, labels_t, seed=2102)
    daemon = CalmonDaemon(cfg)
    with daemon.start():
        sent = []
        third = math.ceil(len(records) / 3)
        for i, codec in enumerate(CODECS):
            with Producer(kafka_bootstrap, compression_type=codec) as producer:
                sent += producer.send(records[i * third:(i + 1) * third])
        # a 580 KB gzip batch that inflates to 600 MB, a gzip batch of garbage, then more
        bomb = gzip_bomb(600 * MIB)
        with gzip_payload(bomb):
            [bomb_at] = send_one_batch(kafka_bootstrap, preds_t, 0, [b"x" * (len(bomb) + 1024)],
                                       compression_type="gzip")
        with gzip_payload(b"garbage, not gzip" * 4):
            bad = send_one_batch(kafka_bootstrap, preds_t, 1, [b"y" * 400] * 3,
                                 compression_type="gzip")
        tail = [(preds_t, b"tail", dumps({"id": "tail", "model": "ctr-prob",
                                          "ts": preds[0]["ts"], "prob": 0.5}), p)
                for p in (0, 1)]
        with Producer(kafka_bootstrap) as producer:
            sent += producer.send(tail)
        daemon.wait_positions(end_positions(sent))
        daemon.wait_checkpoint_of(end_positions(sent), "a checkpoint after the last record")
        assert http_get(daemon.port, "/readyz")[0] == 200
        sc = daemon.scrape()
        st = daemon.status()
        peak = KIB * sum(status(p, "VmHWM") for p in (daemon.pid, *children(daemon.pid)))
        # probes first: 40 idle connections, re-opened as they close, change nothing
        codes = probes_under_idle_connections(daemon.port, connections=40, probes=30)

    # every codec joined exactly: per model, the count and a plain numpy ECE
    want = reference_ece(preds, labels)
    samples = series(sc, "calmon_window_samples", "model", "segment", "window")
    eces = series(sc, "calmon_ece", "model", "segment", "window")
    for model, (n, ece) in want.items():
        assert samples[(model, "__all__", "7d")] == n
        assert math.isclose(eces[(model, "__all__", "7d")], ece, abs_tol=1e-9), model
    assert st["counters"]["joined"] == len(preds)

    # the two bad batches: counted once each, with their reasons, and dead-lettered
    invalid = {k: v for k, v in series(sc, "calmon_invalid_records_total", "topic",
                                       "reason").items() if v}
    assert invalid == {("predictions", "batch_oversize"): 1.0,
                       ("predictions", "bad_batch"): 1.0}
    letters = consume(kafka_bootstrap, dlq, 2, timeout=30)
    got = {dict(r.headers)[SOURCE_HEADER].decode(): (dict(r.headers)[REASON_HEADER].decode(), r)
           for r in letters}
    assert set(got) == {f"{preds_t}/0/{bomb_at}", f"{preds_t}/1/{bad[0]}"}
    assert got[f"{preds_t}/0/{bomb_at}"][0] == "batch_oversize"
    assert bomb in got[f"{preds_t}/0/{bomb_at}"][1].value  # the batch as fetched
    assert got[f"{preds_t}/1/{bad[0]}"][0] == "bad_batch"
    # the daemon and its consumer process together stayed well under the limit
    assert peak < MEMORY_LIMIT // 2, peak
    assert codes == [200] * 60
    # the group id stayed the string "007": offsets were committed under it
    from kafka import KafkaConsumer, TopicPartition

    reader = KafkaConsumer(bootstrap_servers=kafka_bootstrap, group_id="007",
                           enable_auto_commit=False)
    try:
        committed = {p: reader.committed(TopicPartition(preds_t, p)) for p in (0, 1)}
    finally:
        reader.close()
    want_next = end_positions(sent)
    assert committed == {p: want_next[f"{preds_t}/{p}"] for p in (0, 1)}


def probes_under_idle_connections(port: int, connections: int, probes: int) -> list[int]:
    """/healthz and /readyz ``probes`` times each while ``connections`` idle sockets
    are held open, each re-opened as the server closes it."""
    with idle_connections(port, connections):
        return [http_get(port, path, timeout=5)[0]
                for _ in range(probes) for path in ("/healthz", "/readyz")]


# a batch that cannot be decoded only reaches a consumer through a broker that stores
# it unchecked; Apache Kafka refuses it at produce (io/test_compressed_batches.py)
@pytest.mark.brokers("tansu")
def test_a_confluent_message_error_is_counted_not_fatal(
        kafka_bootstrap: str, kafka_topics: Callable[..., list[str]], tmp_path: Path) -> None:
    pytest.importorskip("confluent_kafka")
    preds_t, labels_t = kafka_topics(count=2, partitions=1)
    cfg = write_config(tmp_path / "calmon.yaml", kafka_bootstrap, preds_t, labels_t,
                       kafka={"library": "confluent"})
    preds, labels = make_dataset(60, seed=2111)
    daemon = CalmonDaemon(cfg)
    with daemon.start(), Producer(kafka_bootstrap) as producer:
        first = producer.send([(preds_t, p["id"].encode(), dumps(p)) for p in preds[:30]])
        with gzip_payload(b"garbage, not gzip" * 4):
            bad = send_one_batch(kafka_bootstrap, preds_t, 0, [b"y" * 400] * 4,
                                 compression_type="gzip")
        rest = producer.send([(preds_t, p["id"].encode(), dumps(p)) for p in preds[30:]]
                             + [(labels_t, lab["id"].encode(), dumps(lab)) for lab in labels])
        daemon.wait_positions(end_positions(first + rest))
        wait_until(lambda: daemon.counters()["joined"] == len(preds), 60, "every join")
        assert http_get(daemon.port, "/readyz")[0] == 200
        sc = daemon.scrape()
        child_starts = daemon.log.read_text().count("re-assigning")
    invalid = {k: v for k, v in series(sc, "calmon_invalid_records_total", "topic",
                                       "reason").items() if v}
    assert invalid == {("predictions", "bad_batch"): 1.0}  # once, however many fetches
    assert child_starts == 0  # the consumer process never died
    assert bad == list(range(bad[0], bad[0] + 4))


# ---------------------------------------------------------------- config and state



def run_measured(*args: str, timeout: float = 60.0) -> tuple[int, str, int]:
    """``calmon ARGS`` in a fresh process: exit code, stderr, and its peak RSS in bytes
    (measured by a small parent, so no earlier child of this test process counts)."""
    probe = ("import resource, subprocess, sys; "
             "r = subprocess.run(sys.argv[1:], capture_output=True, text=True); "
             "sys.stderr.write(r.stderr); "
             "print(r.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")
    proc = subprocess.run([sys.executable, "-c", probe, sys.executable, "-m", "calmon", *args],
                          cwd=str(REPO), env=subprocess_env(), capture_output=True, text=True,
                          timeout=timeout)
    rc, rss_kib = proc.stdout.split()
    return int(rc), proc.stderr, int(rss_kib) * 1024


def test_an_alias_bomb_exits_2_at_once(tmp_path: Path) -> None:
    path = tmp_path / "bomb.yaml"
    path.write_text(ALIAS_BOMB, encoding="utf-8")
    assert len(ALIAS_BOMB.encode()) < 500
    for command in ("run", "check-config"):
        rc, err, rss = run_measured(command, "-c", str(path), timeout=60)
        assert rc == 2, err
        assert err.startswith("(file): not valid YAML: the document expands to more than")
        assert rss < 256 * MIB, rss


def _blob(payload: bytes, version: int = FORMAT_VERSION) -> bytes:
    """A checkpoint file with a valid checksum around ``payload``."""
    return _HEADER.pack(MAGIC, version, len(payload), hashlib.sha256(payload).digest()) + payload


def _v1_deflate_bomb(_cfg: Path) -> bytes:
    """Format 1 (a JSON header, then an npz) whose one array member is 1 MB of deflate
    that inflates to 1 GiB."""
    header = json.dumps({"__map__": [["state", {"__nd__": 0}], ["written_at", 1.0],
                                     ["positions", []]]}).encode()
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as z, \
            z.open("arr_0.npy", "w", force_zip64=True) as member:
        npy_header = io.BytesIO()
        np.lib.format.write_array_header_1_0(
            npy_header, {"descr": "<f8", "fortran_order": False, "shape": (GIB // 8,)})
        member.write(npy_header.getvalue())
        zeros = bytes(MIB)
        for _ in range(GIB // MIB):
            member.write(zeros)
    return struct.pack(">Q", len(header)) + header + buf.getvalue()


GIB = 1024 * MIB


def _deep(_cfg: Path) -> bytes:
    # encode() itself would recurse: written by hand
    meta = b'{"arrays":[],"doc":{"__map__":[["state",{"__map__":[["engine",' + \
        b'[' * 10_000 + b'1' + b']' * 10_000 + b']]}],["written_at",1.0],["positions",[]]]}}'
    meta += b" " * (-(8 + len(meta)) % 8)
    return struct.pack(">Q", len(meta)) + meta


def _wrong_shapes(cfg: Path) -> bytes:
    """A real engine snapshot (of the daemon's own config) whose windows name a series
    that does not exist."""
    from calmon.config import load
    from calmon.engine.engine import Engine
    from calmon.engine.records import Kind, Raw

    engine = Engine(load(cfg))
    raws = [Raw(Kind.PREDICTION, dumps({"id": f"i{i}", "model": "m", "ts": 1.7e9 + i,
                                        "prob": 0.3}), None, f"p/0/{i}") for i in range(5)]
    raws += [Raw(Kind.LABEL, dumps({"id": f"i{i}", "label": 1}), None, f"l/0/{i}")
             for i in range(5)]
    engine.feed(raws)
    snap = engine.snapshot()
    for table in snap["windows"]:
        if len(table["keys"]):
            table["keys"][:, 0] = 10**6
    return encode({"state": {"engine": snap}, "written_at": 1.0, "positions": []})


HOSTILE = {
    "v1 deflate bomb (1 MB -> 1 GiB)": (_v1_deflate_bomb, 1),
    "deep nesting": (_deep, FORMAT_VERSION),
    "wrong shapes": (_wrong_shapes, FORMAT_VERSION),
    "an array larger than the file": (lambda _cfg: _raw_v2({"arrays": [["<f8", [GIB], 0]],
                                                           "doc": {"__nd__": 0}}),
                                      FORMAT_VERSION),
}


def _raw_v2(meta: dict[str, Any]) -> bytes:
    raw = json.dumps(meta).encode()
    raw += b" " * (-(8 + len(raw)) % 8)
    return struct.pack(">Q", len(raw)) + raw + bytes(64)


@pytest.mark.parametrize("kind", list(HOSTILE))
def test_a_checksum_valid_hostile_checkpoint_is_refused_cleanly(
        kind: str, kafka_bootstrap: str, kafka_topics: Callable[..., list[str]],
        tmp_path: Path) -> None:
    make, version = HOSTILE[kind]
    preds_t, labels_t = kafka_topics(count=2, partitions=1)
    cfg = write_config(tmp_path / "calmon.yaml", kafka_bootstrap, preds_t, labels_t,
                       state={"on_corrupt": "fail"})
    state_dir = tmp_path / "calmon-state"
    state_dir.mkdir()
    ckpt = state_dir / "ckpt-000000000003.calmon"
    ckpt.write_bytes(_blob(make(cfg), version))
    # on_corrupt: fail -> exit 2 with the reason, at once, no traceback, bounded memory
    rc, err, rss = run_measured("run", "-c", str(cfg), timeout=120)
    assert rc == 2, err
    assert "no usable checkpoint" in err and ckpt.name in err, err
    assert "Traceback" not in err
    assert rss < 512 * MIB, rss
    assert ckpt.exists()  # kept as it was: the operator decides
    # on_corrupt: reset -> set aside, and calmon starts from empty state
    write_config(cfg, kafka_bootstrap, preds_t, labels_t, state={"on_corrupt": "reset"},
                 server={"port": CalmonDaemon(cfg).port})
    with CalmonDaemon(cfg).start() as daemon:
        assert daemon.status()["counters"]["joined"] == 0
        assert http_get(daemon.port, "/healthz")[0] == 200
    assert (state_dir / (ckpt.name + ".corrupt")).exists()
