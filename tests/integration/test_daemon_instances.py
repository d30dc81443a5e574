"""Two instances (``kafka.instance: {index: 0|1, count: 2}``) share 4-partition
topics: summed, their cumulative bin counters and ``__all__`` window samples
equal those of one instance reading everything. And what scaling out assumes is
checked: co-partitioned topics, keys that are ids, the shape a state was written
by, one process per state directory."""

from __future__ import annotations

import importlib.util
import math
import struct
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from calmon.io.checkpoint import CheckpointStore
from tests.daemon_helpers import (
    BASE_TS,
    START_TIMEOUT_S,
    CalmonDaemon,
    Producer,
    dumps,
    end_positions,
    expected_bins,
    interleave,
    load_config,
    make_dataset,
    series,
    wait_until,
    write_config,
)

pytestmark = pytest.mark.integration

N = 1500


def test_two_instances_sum_to_one(
    kafka_bootstrap: str, kafka_topics: Callable[..., list[str]], tmp_path: Path
) -> None:
    preds_topic, labels_topic = kafka_topics(count=2, partitions=4)
    preds, labels = make_dataset(N, seed=71)
    # keyed by id: a prediction and its label land on the same partition number
    records = interleave(preds, labels, preds_topic, labels_topic, seed=72)
    with Producer(kafka_bootstrap) as producer:
        sent = producer.send(records)
    ends = end_positions(sent)
    assert len(ends) == 8

    configs = [
        write_config(tmp_path / f"instance{i}.yaml", kafka_bootstrap, preds_topic, labels_topic,
                     kafka={"instance": {"index": i, "count": 2}})
        for i in range(2)
    ]
    configs.append(write_config(tmp_path / "single.yaml", kafka_bootstrap, preds_topic,
                                labels_topic))
    daemons = [CalmonDaemon(c) for c in configs]
    scrapes, statuses = [], []
    try:
        for d in daemons:
            d.start(wait_ready=False)
        for i, d in enumerate(daemons):
            d.wait_ready()
            mine = ends if i == 2 else {k: v for k, v in ends.items()
                                        if int(k.rsplit("/", 1)[1]) % 2 == i}
            statuses.append(d.wait_positions(mine))
            scrapes.append(d.scrape())
    finally:
        for d in daemons:
            d.stop()

    # each instance did part of the work, and every prediction found its label
    joined = [st["counters"]["joined"] for st in statuses]
    assert joined[0] > 0 and joined[1] > 0
    assert joined[0] + joined[1] == joined[2] == N
    assert all(st["pending"] == 0 and st["pending_labels"] == 0 for st in statuses)

    def summed(name: str, *labels: str) -> list[Counter[tuple[str, ...]]]:
        return [Counter(series(sc, name, *labels)) for sc in scrapes]

    for name in ("calmon_bin_samples_total", "calmon_bin_correct_total"):
        a, b, single = summed(name, "model", "segment", "bin")
        assert a + b == single, name
    a, b, single = summed("calmon_bin_confidence_total", "model", "segment", "bin")
    assert a.keys() | b.keys() == single.keys()
    for k, v in single.items():
        assert math.isclose(a.get(k, 0) + b.get(k, 0), v, rel_tol=1e-12, abs_tol=1e-9), k

    a, b, single = summed("calmon_window_samples", "model", "segment", "window")
    alls = [Counter({k: v for k, v in c.items() if k[1] == "__all__"}) for c in (a, b, single)]
    assert alls[0] + alls[1] == alls[2]
    assert sum(v for (_, _, w), v in alls[2].items() if w == "7d") == N

    # and the single instance's bins are the ones computed from the records
    want_n, _ = expected_bins(preds, labels)
    assert +single_bins(scrapes[2]) == Counter({k: float(v) for k, v in want_n.items()})


def single_bins(sc: dict) -> Counter[tuple[str, ...]]:
    return Counter(series(sc, "calmon_bin_samples_total", "model", "segment", "bin"))


# ---------------------------------------------------------------- what scaling out assumes

CONFLUENT = pytest.param("confluent", marks=pytest.mark.skipif(
    importlib.util.find_spec("confluent_kafka") is None, reason="calmon[fast] missing"))
LIBRARIES = pytest.mark.parametrize("library", ["kafka-python", CONFLUENT])


def exits(daemon: CalmonDaemon, timeout: float = START_TIMEOUT_S) -> int:
    """Start ``daemon`` and wait for it to exit by itself; returns the exit code."""
    daemon.start(wait_ready=False)
    assert daemon.proc is not None
    try:
        return daemon.proc.wait(timeout)
    finally:
        daemon.stop()


@LIBRARIES
def test_topics_that_cannot_co_partition_are_refused(
    kafka_bootstrap: str, kafka_topics: Callable[..., list[str]], tmp_path: Path, library: str
) -> None:
    (preds_topic,) = kafka_topics(partitions=4)
    (labels_topic,) = kafka_topics(partitions=6)
    cfg = write_config(tmp_path / "three.yaml", kafka_bootstrap, preds_topic, labels_topic,
                       kafka={"instance": {"index": 0, "count": 3}, "library": library})
    daemon = CalmonDaemon(cfg)
    assert exits(daemon) == 2
    log = daemon.log.read_text()
    assert (f"kafka.predictions_topic {preds_topic!r} has 4 partitions and "
            f"kafka.labels_topic {labels_topic!r} has 6") in log
    assert f"kafka-topics.sh --alter --topic {preds_topic} --partitions 6" in log
    # one instance reads every partition: nothing to refuse
    one = write_config(tmp_path / "one.yaml", kafka_bootstrap, preds_topic, labels_topic,
                       kafka={"library": library})
    with CalmonDaemon(one):
        pass


def test_a_second_daemon_on_one_state_dir_exits(
    kafka_bootstrap: str, kafka_topics: Callable[..., list[str]], tmp_path: Path
) -> None:
    preds_topic, labels_topic = kafka_topics(count=2, partitions=2)
    first = write_config(tmp_path / "first.yaml", kafka_bootstrap, preds_topic, labels_topic)
    state = load_config(first)["state"]["dir"]
    second = write_config(tmp_path / "second.yaml", kafka_bootstrap, preds_topic,
                          labels_topic, state={"dir": state})
    with CalmonDaemon(first) as holder:
        other = CalmonDaemon(second)
        assert exits(other, timeout=30.0) == 2
        assert f"is in use by calmon pid {holder.pid}" in other.log.read_text()
        assert holder.running and holder.status()["ready"]


@LIBRARIES
def test_keys_that_are_not_ids_are_counted(
    kafka_bootstrap: str, kafka_topics: Callable[..., list[str]], tmp_path: Path, library: str
) -> None:
    """Labels sent without a key are all mismatches; predictions keyed by their id's
    bytes, and integer ids keyed as Java's LongSerializer writes them (on both
    topics), are not. One instance: every label still joins."""
    preds_topic, labels_topic = kafka_topics(count=2, partitions=3)
    n, ints = 300, 40
    preds, labels = make_dataset(n, seed=75)
    records = [(preds_topic, str(p["id"]).encode(), dumps(p)) for p in preds]
    records += [(labels_topic, None, dumps(lab)) for lab in labels]
    for i in range(ints):  # integer ids, both topics keyed by the 8-byte form
        pid = 10**12 + i
        key = struct.pack(">q", pid)
        records.append((preds_topic, key, dumps({"id": pid, "model": "ctr-prob",
                                                 "ts": BASE_TS + i, "prob": 0.5})))
        records.append((labels_topic, key, dumps({"id": pid, "label": i % 2})))
    with Producer(kafka_bootstrap) as producer:
        ends = end_positions(producer.send(records))
    cfg = write_config(tmp_path / "keys.yaml", kafka_bootstrap, preds_topic, labels_topic,
                       kafka={"library": library})
    with CalmonDaemon(cfg) as daemon:
        st = daemon.wait_positions(ends)
        sc = daemon.scrape()
    assert st["counters"]["joined"] == n + ints
    assert series(sc, "calmon_key_mismatch_total", "topic") == {
        ("predictions",): 0.0, ("labels",): float(n)}


def test_a_restart_with_another_count_exits_and_the_documented_rescale_counts_once(
    kafka_bootstrap: str, kafka_topics: Callable[..., list[str]], tmp_path: Path
) -> None:
    """2 -> 3 instances. A restart under another count is refused with the reason. The
    documented rescale (stop every instance, start the new shape with ``--rescale``,
    which moves each old state aside: committed offsets, empty windows) reads what came
    after, and nothing twice:
    the new instances' summed windows and bins are those of the records sent since."""
    preds_topic, labels_topic = kafka_topics(count=2, partitions=4)
    group = f"calmon-rescale-{tmp_path.name[-8:]}"
    before = make_dataset(600, seed=76)
    after = make_dataset(600, seed=77)  # other ids (the seed is in them)

    def config(name: str, index: int, count: int) -> Path:
        return write_config(tmp_path / f"{name}.yaml", kafka_bootstrap, preds_topic,
                            labels_topic, kafka={"group_id": group,
                                                 "instance": {"index": index, "count": count}})

    def owned_ends(ends: dict[str, int], index: int, count: int) -> dict[str, int]:
        return {k: v for k, v in ends.items() if int(k.rsplit("/", 1)[1]) % count == index}

    with Producer(kafka_bootstrap) as producer:
        ends = end_positions(producer.send(interleave(*before, preds_topic, labels_topic,
                                                      seed=78)))
        old = [CalmonDaemon(config(f"two-{i}", i, 2)) for i in range(2)]
        try:
            for i, d in enumerate(old):
                d.start()
                d.wait_checkpoint_of(owned_ends(ends, i, 2))
        finally:
            for d in old:
                d.stop()

        # the same state under another count: refused, with the way to rescale
        moved = CalmonDaemon(config("two-0", 0, 3))  # instance 0's config and state dir
        assert exits(moved) == 2
        log = moved.log.read_text()
        assert "written by instance {index: 0, count: 2}" in log
        assert "this config is {index: 0, count: 3}" in log and "--rescale" in log

        # the documented rescale: every old instance stopped (above), the new shape
        # started with --rescale, which moves the old states aside
        new = [CalmonDaemon(config(f"two-{i}" if i < 2 else f"three-{i}", i, 3),
                            args=["--rescale"]) for i in range(3)]
        statuses, scrapes = [], []
        try:
            for d in new:
                d.start()
            more = end_positions(producer.send(interleave(*after, preds_topic, labels_topic,
                                                          seed=79)))
            for i, d in enumerate(new):
                statuses.append(d.wait_positions(owned_ends(more, i, 3)))
                scrapes.append(d.scrape())
        finally:
            for d in new:
                d.stop()
    for i in range(2):  # the old states kept aside, never read
        state = Path(load_config(config(f"two-{i}", i, 2))["state"]["dir"])
        [aside] = state.glob("rescaled-*")
        assert aside.name.startswith(f"rescaled-{i}of2-") and any(aside.iterdir())
        assert "moved to" in new[i].log.read_text()
    assert sum(st["counters"]["predictions"] for st in statuses) == len(after[0])
    assert sum(st["counters"]["joined"] for st in statuses) == len(after[0])
    window = Counter[tuple[str, ...]]()
    bins = Counter[tuple[str, ...]]()
    for sc in scrapes:
        window.update({k: v for k, v in series(sc, "calmon_window_samples", "model", "segment",
                                               "window").items() if k[1] == "__all__"})
        bins.update(series(sc, "calmon_bin_samples_total", "model", "segment", "bin"))
    assert sum(v for (_, _, w), v in window.items() if w == "7d") == len(after[0])
    want_n, _ = expected_bins(*after)
    assert +bins == Counter({k: float(v) for k, v in want_n.items()})


def test_a_checkpoint_without_the_shape_restores_as_one_instance(
    kafka_bootstrap: str, kafka_topics: Callable[..., list[str]], tmp_path: Path
) -> None:
    preds_topic, labels_topic = kafka_topics(count=2, partitions=2)
    preds, labels = make_dataset(200, seed=80)
    with Producer(kafka_bootstrap) as producer:
        ends = end_positions(producer.send(interleave(preds, labels, preds_topic,
                                                      labels_topic, seed=81)))
    cfg = write_config(tmp_path / "one.yaml", kafka_bootstrap, preds_topic, labels_topic)
    with CalmonDaemon(cfg) as daemon:
        before = daemon.wait_checkpoint_of(ends)["counters"]
    # the checkpoint as the previous format wrote it: no "instance" in the payload
    store = CheckpointStore(load_config(cfg)["state"]["dir"])
    ckpt = store.load()
    assert ckpt is not None and ckpt.state["instance"] == {"index": 0, "count": 1}
    old_state = {k: v for k, v in ckpt.state.items() if k != "instance"}
    store.save(old_state, ckpt.positions, ckpt.written_at)
    assert "instance" not in (store.load() or ckpt).state

    two = write_config(tmp_path / "two.yaml", kafka_bootstrap, preds_topic, labels_topic,
                       kafka={"instance": {"index": 0, "count": 2}},
                       state={"dir": load_config(cfg)["state"]["dir"]})
    refused = CalmonDaemon(two)
    assert exits(refused) == 2
    assert "written by instance {index: 0, count: 1}" in refused.log.read_text()
    with CalmonDaemon(cfg) as daemon:  # one instance: restored, counters and all
        assert daemon.status()["counters"] == before


@LIBRARIES
def test_topic_settings_that_need_describe_configs_only_warn(
    kafka_bootstrap: str, kafka_topics: Callable[..., list[str]], tmp_path: Path, library: str
) -> None:
    (preds_topic,) = kafka_topics(partitions=2)
    (labels_topic,) = kafka_topics(partitions=2, configs={"cleanup.policy": "compact",
                                                          "retention.ms": "3600000"})
    cfg = write_config(tmp_path / "warned.yaml", kafka_bootstrap, preds_topic, labels_topic,
                       kafka={"library": library, "instance": {"index": 0, "count": 2}})
    with CalmonDaemon(cfg) as daemon:  # ready: warnings never refuse
        wait_until(lambda: "retention.ms" in daemon.log.read_text(), START_TIMEOUT_S,
                   "the retention warning", detail=daemon.log_tail)
        log = daemon.log.read_text()
        assert daemon.status()["ready"]
    assert (f"kafka.labels_topic: topic {labels_topic!r} has cleanup.policy compact" in log)
    assert (f"kafka.labels_topic: topic {labels_topic!r} keeps records for 1 h "
            "(retention.ms), less than the largest window (168 h)") in log
    assert f"kafka.predictions_topic: topic {preds_topic!r}" not in log
