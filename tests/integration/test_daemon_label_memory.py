"""500,000 labels waiting for predictions that never come, with 256-byte ids (issue 35
item 13): the daemon and its consumer process, sampled from /proc while the labels go in
and across a checkpoint write of them, never exceed the worst case check-config prints
for that config, and the figure is no more than 20% above the measured peak."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import pytest

from calmon.capacity import worst_case
from calmon.config import from_dict
from tests.daemon_helpers import BASE_TS, CalmonDaemon, load_config, wait_until, write_config
from tests.procfs import KIB, children, status

pytestmark = [pytest.mark.integration, pytest.mark.slow]

N = 500_000
ID_BYTES = 256


def _rss(pid: int) -> int:
    """VmRSS of ``pid`` and its children (the consumer process), in bytes."""
    total = 0
    for p in [pid, *children(pid)]:
        try:
            total += KIB * status(p, "VmRSS")
        except (OSError, AssertionError):  # a process gone meanwhile
            continue
    return total


@contextmanager
def sampled(pid: int) -> Iterator[list[int]]:
    """The RSS of ``pid`` and its children every 20 ms while the block runs."""
    samples: list[int] = []
    stop = threading.Event()

    def run() -> None:
        while not stop.is_set():
            with suppress(OSError):
                samples.append(_rss(pid))
            stop.wait(0.02)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    try:
        yield samples
    finally:
        stop.set()
        t.join(5)


def _produce(bootstrap: str, topic: str, n: int) -> None:
    """``n`` labels 0/1 with ids of ID_BYTES, through librdkafka (fast, batched)."""
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 50,
                  "batch.size": 1_000_000, "queue.buffering.max.messages": 200_000,
                  "compression.type": "none"})
    errors: list[str] = []

    def delivered(err: object, _msg: object) -> None:
        if err is not None:
            errors.append(str(err))

    for i in range(n):
        lid = (f"label-{i:012d}-" + "x" * ID_BYTES)[:ID_BYTES]
        value = json.dumps({"id": lid, "label": i % 2, "ts": BASE_TS + i * 0.01}).encode()
        while True:
            try:
                p.produce(topic, value=value, key=lid.encode(), on_delivery=delivered)
                break
            except BufferError:  # the local queue is full: let it drain
                p.poll(0.05)
        if i % 10_000 == 0:
            p.poll(0)
    assert p.flush(120) == 0 and not errors, errors[:3]


def test_waiting_labels_stay_within_the_printed_worst_case(
        kafka_bootstrap: str, kafka_topics: Callable[..., list[str]], tmp_path: Path) -> None:
    pytest.importorskip("confluent_kafka")
    preds_t, labels_t = kafka_topics(count=2, partitions=1)
    cfg = write_config(tmp_path / "calmon.yaml", kafka_bootstrap, preds_t, labels_t,
                       join={"max_pending": N},
                       limits={"max_id_bytes": ID_BYTES, "max_classes": 2, "max_models": 1,
                               "max_series": 10},
                       segments={"slices": []},
                       state={"checkpoint_interval": "5s"})
    worst = worst_case(from_dict(load_config(cfg)))
    # what this test fills is the waiting labels: the worst case less the other two maps
    # (no prediction ever comes, so none pends and no id is joined)
    figure = worst.memory - worst.parts["pending"] - worst.parts["joined ids"]
    daemon = CalmonDaemon(cfg)
    with daemon.start(), sampled(daemon.pid) as samples:
        _produce(kafka_bootstrap, labels_t, N)
        wait_until(lambda: daemon.status()["pending_labels"] == N, 240,
                   "every label waiting")
        # a checkpoint written with all of them (it holds its snapshot while it writes):
        # its positions are the ones at which every label waits (one may have been
        # written before the wait above saw them all; none comes after it, since a
        # checkpoint is skipped when nothing changed)
        full = f"{labels_t}/0"
        at = daemon.status()["positions"][full]
        wait_until(lambda: daemon.status()["checkpoint_positions"].get(full) == at,
                   120, "a checkpoint of the full map")
        taken = len(samples)  # and the sampler's reads after it
        wait_until(lambda: len(samples) > taken + 10, 30, "samples after the write")
        status_now = daemon.status()
    assert status_now["pending_labels"] == N and status_now["counters"]["invalid"] == 0
    peak = max(samples)
    assert len(samples) > 100
    assert peak <= figure <= worst.memory, (peak / 2**20, figure / 2**20)
    assert figure <= 1.2 * peak, (peak / 2**20, figure / 2**20)
