"""Group mode's local cache (contract §8: ``state.dir`` "a cache for fast restarts,
never the source of truth", issue 37), with real daemons on a real broker: a static
member stopped and started again restores its tasks from its cache and counts
exactly; a cache made stale by another member's newer checkpoints is not taken as the
state; a corrupt cache falls back to the changelog. Counts are checked against the
records (``expected_counts``), never against the code under test."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from kafka import KafkaConsumer, TopicPartition

from calmon.io.changelog import CKPT_HEADER
from calmon.io.taskcache import DIRNAME, MANIFEST
from tests.daemon_helpers import (
    BASE_TS,
    CalmonDaemon,
    Producer,
    dumps,
    make_dataset,
    wait_until,
    write_config,
)
from tests.integration.cluster.fleet import GROUP_CLIENT
from tests.integration.cluster.group import (
    WINDOWS,
    dump,
    expected_counts,
    member,
    owned,
    summed_samples,
)

pytestmark = pytest.mark.integration

PARTITIONS = 4
N = 800


def static_member(tmp_path: Path, bootstrap: str, preds: str, labels: str, group: str,
                  name: str) -> CalmonDaemon:
    """A member with ``group_instance_id`` ``name`` and its own ``state.dir``
    (``<name>-state``), kept over restarts."""
    return CalmonDaemon(write_config(
        tmp_path / f"{name}.yaml", bootstrap, preds, labels,
        kafka={"group_id": group, "instance": "group",
               "client": {**GROUP_CLIENT, "group_instance_id": name}},
        metrics=WINDOWS, state={"checkpoint_interval": "1s"}),
        log=tmp_path / f"{name}.log")


def owning_all(d: CalmonDaemon, what: str) -> None:
    """``d`` started, and owning every partition."""
    d.start()
    wait_until(lambda: owned(d) == list(range(PARTITIONS)) or None, 120, what,
               detail=lambda: dump([d]))


def fed(d: CalmonDaemon, bootstrap: str, topics: tuple[str, str],
        pairs: tuple[list[dict[str, Any]], list[dict[str, Any]]], what: str) -> None:
    """``d`` started, owning every partition, these predictions and labels sent and
    counted on it."""
    owning_all(d, "owning every partition")
    with Producer(bootstrap) as producer:
        producer.send(records(topics[0], pairs[0]) + records(topics[1], pairs[1]))
    wait_until(counted([d], pairs[0]), 120, what, detail=lambda: dump([d]))


def records(topic: str, rows: list[dict[str, Any]]) -> list[tuple[str, bytes, bytes]]:
    return [(topic, str(r["id"]).encode(), dumps(r)) for r in rows]


def tasks(d: CalmonDaemon) -> dict[int, dict[str, Any]]:
    return {t["partition"]: t for t in d.status()["group"]["tasks"]}


def cache_dir(tmp_path: Path, name: str, partition: int) -> Path:
    return tmp_path / f"{name}-state" / DIRNAME / str(partition)


def manifest(tmp_path: Path, name: str, partition: int) -> dict[str, Any] | None:
    try:
        return json.loads((cache_dir(tmp_path, name, partition) / MANIFEST).read_text())
    except (OSError, ValueError):
        return None


def cached_through(d: CalmonDaemon, tmp_path: Path, name: str, preds: str) -> bool:
    """Every task's cache is of a checkpoint at its current predictions position."""
    ts = tasks(d)
    return len(ts) == PARTITIONS and all(
        (m := manifest(tmp_path, name, p)) is not None and m["pos"] == t["positions"].get(preds)
        for p, t in ts.items())


def counted(daemons: list[CalmonDaemon], rows: list[dict[str, Any]]
            ) -> Callable[[], bool | None]:
    want = expected_counts(rows)
    return lambda: (summed_samples(daemons) == want
                    and sum(d.status()["counters"]["joined"] for d in daemons) == len(rows)
                    ) or None


def newest_heads(bootstrap: str, topic: str) -> dict[int, str]:
    """Partition -> the checkpoint of the newest committed head record in the changelog
    (read by the test, not by calmon)."""
    c = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                      isolation_level="read_committed", group_id=None)
    try:
        tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        c.assign(tps)
        c.seek_to_beginning(*tps)
        ends = c.end_offsets(tps)
        out: dict[int, str] = {}
        while any(c.position(tp) < ends[tp] for tp in tps):
            for tp, recs in c.poll(timeout_ms=500).items():
                for r in recs:
                    if r.key == f"{tp.partition}/h/0".encode():
                        out[tp.partition] = dict(r.headers)[CKPT_HEADER].decode()
        return out
    finally:
        c.close()


def test_a_restarted_member_restores_from_its_cache(
        kafka_bootstrap: str, kafka_topics: Callable[..., list[str]], tmp_path: Path,
        broker) -> None:
    """A static member where the broker honours it (a restart within the session
    timeout), a dynamic one elsewhere (it leaves and joins again): either way the
    committed state is its cache's."""
    preds_topic, labels_topic = kafka_topics(count=2, partitions=PARTITIONS)
    group = f"calmon-cache-{tmp_path.name[-12:]}"
    preds, labels = make_dataset(N, seed=41, span_s=3600.0)
    a = (static_member if broker.honours_static_membership else member)(
        tmp_path, kafka_bootstrap, preds_topic, labels_topic, group, "a")
    try:
        fed(a, kafka_bootstrap, (preds_topic, labels_topic),
            (preds[:N // 2], labels[:N // 2]), "the first half counted")
        assert a.terminate() == 0  # its last checkpoint, and its cache, written
        for p in range(PARTITIONS):
            assert manifest(tmp_path, "a", p) is not None, p
        with Producer(kafka_bootstrap) as producer:  # while it is down
            producer.send(records(preds_topic, preds[N // 2:])
                          + records(labels_topic, labels[N // 2:]))
        owning_all(a, "the member back on every partition")
        got = tasks(a)
        # every task from the cache alone: nothing read from the changelog
        assert {t["restored_source"] for t in got.values()} == {"cache"}, dump([a])
        assert all(t["restored_bytes"] == 0 and t["restored_cache_bytes"] > 0
                   for t in got.values()), dump([a])
        assert a.status()["group"]["task_cache"]["cache"] == PARTITIONS
        wait_until(counted([a], preds), 120, "every sample counted once",
                   detail=lambda: (dump([a]), expected_counts(preds) - summed_samples([a])))
    finally:
        a.stop()


def test_a_stale_cache_is_not_the_state(
        kafka_bootstrap: str, kafka_topics: Callable[..., list[str]], tmp_path: Path) -> None:
    preds_topic, labels_topic = kafka_topics(count=2, partitions=PARTITIONS)
    group = f"calmon-stale-{tmp_path.name[-12:]}"
    preds, labels = make_dataset(N, seed=42, span_s=3600.0)
    # dynamic members: one that stops leaves the group at once (Tansu keeps a static
    # member's partitions from the others past its session timeout)
    a = member(tmp_path, kafka_bootstrap, preds_topic, labels_topic, group, "a")
    b = member(tmp_path, kafka_bootstrap, preds_topic, labels_topic, group, "b")
    try:
        fed(a, kafka_bootstrap, (preds_topic, labels_topic),
            (preds[:N // 2], labels[:N // 2]), "the first half on a")
        assert a.terminate() == 0
        stale = {p: manifest(tmp_path, "a", p) for p in range(PARTITIONS)}
        assert all(stale.values()), stale
        # while a is down, b takes every partition and checkpoints newer state
        b.start()
        wait_until(lambda: owned(b) == list(range(PARTITIONS)) or None, 120,
                   "b owning every partition", detail=lambda: dump([b]))
        with Producer(kafka_bootstrap) as producer:
            producer.send(records(preds_topic, preds[N // 2:])
                          + records(labels_topic, labels[N // 2:]))
        wait_until(counted([b], preds), 120, "everything on b")
        assert b.terminate() == 0
        heads = newest_heads(kafka_bootstrap, f"{group}-state-changelog")
        assert all(heads[p] != stale[p]["name"] for p in range(PARTITIONS)), (heads, stale)  # type: ignore[index]
        owning_all(a, "a back on every partition")
        got = tasks(a)
        # restored as b committed it, never as a's cache had it: the changelog read (in
        # full, or what follows the cache where the committed chain goes through it)
        assert {p: t["restored_from"] for p, t in got.items()} == heads, dump([a])
        assert all(t["restored_source"] in ("changelog", "cache+changelog")
                   and t["restored_bytes"] > 0 for t in got.values()), dump([a])
        assert a.status()["group"]["task_cache"]["cache"] == 0
        wait_until(counted([a], preds), 120, "every sample counted once on a",
                   detail=lambda: (dump([a]), expected_counts(preds) - summed_samples([a])))
    finally:
        a.stop()
        b.stop()


def wide(start: int, n: int, countries: int) -> tuple[list[dict[str, Any]],
                                                    list[dict[str, Any]]]:
    """``n`` predictions of one model over ``countries`` countries (0: no segment), and
    their labels."""
    rng = np.random.default_rng(start)
    preds = [{"id": f"w{i}", "model": "m", "ts": BASE_TS + i,
              "segment": {"country": f"c{i % countries}"} if countries else {},
              "prob": float(rng.uniform())} for i in range(start, start + n)]
    labels = [{"id": p["id"], "label": int(rng.random() < p["prob"]), "ts": p["ts"] + 1.0}
              for p in preds]
    return preds, labels


def changelog_bytes(bootstrap: str, topic: str) -> dict[int, int]:
    """Partition -> the bytes of the committed record values the changelog holds."""
    c = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                      isolation_level="read_committed", group_id=None)
    try:
        tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        c.assign(tps)
        c.seek_to_beginning(*tps)
        ends = c.end_offsets(tps)
        out = dict.fromkeys(range(PARTITIONS), 0)
        while any(c.position(tp) < ends[tp] for tp in tps):
            for tp, recs in c.poll(timeout_ms=500).items():
                out[tp.partition] += sum(len(r.value or b"") for r in recs)
        return out
    finally:
        c.close()


@pytest.mark.parametrize("library", ["kafka-python", "confluent"])
def test_a_member_back_after_another_reads_what_followed_its_cache(
        kafka_bootstrap: str, kafka_topics: Callable[..., list[str]], tmp_path: Path,
        library: str, broker) -> None:
    """With either library: the cache's starting point is the offset after the last
    record its member's committed transaction wrote (librdkafka's from its delivery
    reports)."""
    if library == "confluent" and not broker.fences_stale_members:
        # where the offsets come from is the library's alone: librdkafka's once, on the
        # broker its failover test runs on
        pytest.skip(f"librdkafka's cache offsets are checked on Apache Kafka, not {broker.kind}")
    preds_topic, labels_topic = kafka_topics(count=2, partitions=PARTITIONS)
    group = f"calmon-tail-{tmp_path.name[-12:]}"
    # 45 countries (under segments.max_values): each task holds more than one group of
    # 32 series; the second half has no segment, so it touches the model's __all__
    # alone, the other groups stay as the first member wrote them, and its checkpoint
    # stays on the chain
    first, first_labels = wide(0, 600, 45)
    second, second_labels = wide(600, 200, 0)
    a = member(tmp_path, kafka_bootstrap, preds_topic, labels_topic, group, "a",
               library=library)
    b = member(tmp_path, kafka_bootstrap, preds_topic, labels_topic, group, "b",
               library=library)
    try:
        fed(a, kafka_bootstrap, (preds_topic, labels_topic), (first, first_labels),
            "the first half on a")
        assert a.terminate() == 0
        b.start()
        wait_until(lambda: owned(b) == list(range(PARTITIONS)) or None, 120,
                   "b owning every partition", detail=lambda: dump([b]))
        with Producer(kafka_bootstrap) as producer:
            producer.send(records(preds_topic, second) + records(labels_topic, second_labels))
        wait_until(counted([b], first + second), 120, "everything on b")
        assert b.terminate() == 0
        changelog = f"{group}-state-changelog"
        heads, total = newest_heads(kafka_bootstrap, changelog), changelog_bytes(
            kafka_bootstrap, changelog)
        owning_all(a, "a back on every partition")
        got = tasks(a)
        # b's checkpoints, from a's cache and only the changelog records after it
        assert {p: t["restored_from"] for p, t in got.items()} == heads, dump([a])
        assert {t["restored_source"] for t in got.values()} == {"cache+changelog"}, dump([a])
        assert all(0 < t["restored_bytes"] < total[p] for p, t in got.items()), (
            dump([a]), total)
        wait_until(counted([a], first + second), 120, "every sample counted once on a",
                   detail=lambda: (dump([a]), expected_counts(first + second)
                                   - summed_samples([a])))
    finally:
        a.stop()
        b.stop()


def test_a_corrupt_cache_falls_back_to_the_changelog(
        kafka_bootstrap: str, kafka_topics: Callable[..., list[str]], tmp_path: Path) -> None:
    preds_topic, labels_topic = kafka_topics(count=2, partitions=PARTITIONS)
    group = f"calmon-corrupt-{tmp_path.name[-12:]}"
    preds, labels = make_dataset(N, seed=43, span_s=3600.0)
    a = member(tmp_path, kafka_bootstrap, preds_topic, labels_topic, group, "a")
    try:
        fed(a, kafka_bootstrap, (preds_topic, labels_topic),
            (preds[:N // 2], labels[:N // 2]), "the first half counted")
        wait_until(lambda: cached_through(a, tmp_path, "a", preds_topic) or None, 60,
                   "the first half in the cache")
        older = tmp_path / "older"
        shutil.copytree(cache_dir(tmp_path, "a", 0), older)
        with Producer(kafka_bootstrap) as producer:
            producer.send(records(preds_topic, preds[N // 2:])
                          + records(labels_topic, labels[N // 2:]))
        wait_until(counted([a], preds), 120, "the second half counted")
        assert a.terminate() == 0
        # task 0: the first series' group holds what it held before the second half (a
        # file that decodes, consistent with nothing: only its digest tells); task 1:
        # a manifest that does not parse
        now = cache_dir(tmp_path, "a", 0)
        new_g0 = next(now.glob("g0-*"))
        old_g0 = next(older.glob("g0-*"))
        assert new_g0.read_bytes() != old_g0.read_bytes()
        new_g0.write_bytes(old_g0.read_bytes())
        (cache_dir(tmp_path, "a", 1) / MANIFEST).write_bytes(b'{"format": 1, "sect')
        owning_all(a, "a back on every partition")
        got = tasks(a)
        assert {p: t["restored_source"] for p, t in got.items()} == {
            0: "changelog", 1: "changelog", 2: "cache", 3: "cache"}, dump([a])
        assert got[0]["restored_bytes"] > 0 and got[1]["restored_bytes"] > 0
        assert a.status()["group"]["task_cache"]["corrupt"] == 2
        wait_until(counted([a], preds), 120, "every sample counted once",
                   detail=lambda: (dump([a]), expected_counts(preds) - summed_samples([a]),
                                   summed_samples([a]) - expected_counts(preds)))
        # the fallback wrote the tasks' caches anew: a later restart uses them
        assert all(manifest(tmp_path, "a", p) is not None for p in (0, 1))
    finally:
        a.stop()
