"""Group mode (contract §8): a member that stopped polling past the session timeout
(paused) has its partitions moved; its next checkpoint is refused and writes nothing,
even once its consumer has left the group: the broker does not check a transactional
offset commit that carries no generation (KIP-447 keeps that for producers of no
group), so the member refuses it itself. It rejoins and the counts stay exact.

The paused member is a ``GroupRun`` driven by hand (its loop is this test: it stops
polling, as a SIGSTOPped daemon does, and checkpoints at a chosen moment); the member
that takes over is a real ``calmon run``."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from kafka import KafkaConsumer

from calmon.config import from_dict
from calmon.group_run import GroupRun
from calmon.io import changelog
from calmon.io.changelog import Changelog, ChangelogError
from calmon.io.totals import ProcessTotals
from tests.daemon_helpers import Producer, dumps, make_dataset, wait_until
from tests.fakes import DeadLetterLog
from tests.integration.cluster.fleet import GROUP_CLIENT
from tests.integration.cluster.group import committed, member, owned, task_write

pytestmark = pytest.mark.integration

N = 400


@pytest.mark.slow
def test_a_member_out_of_the_group_commits_nothing(
        kafka_bootstrap: str, kafka_topics: Callable[..., list[str]], tmp_path: Path) -> None:
    preds_topic, labels_topic = kafka_topics(count=2, partitions=2)
    group = f"calmon-fence-{tmp_path.name[-12:]}"
    other = member(tmp_path, kafka_bootstrap, preds_topic, labels_topic, group, "other")
    cfg = from_dict(yaml.safe_load(other.config.read_text()))
    zombie = GroupRun(cfg, ProcessTotals(), DeadLetterLog())  # type: ignore[arg-type]
    preds, labels = make_dataset(N, seed=40, span_s=3600.0)
    half = N // 2

    def records(rows: list[dict], topic: str) -> list[tuple[str, bytes, bytes]]:
        return [(topic, str(r["id"]).encode(), dumps(r)) for r in rows]

    def poll() -> None:  # one turn of the member's loop, without its timed checkpoint
        zombie.tasks.feed(zombie.source.poll_chunks(250, 5000), time.time() + 3600,
                          force=True)

    def joined() -> int:
        return sum(e.status()["counters"]["joined"] for e in zombie.tasks.engines())

    def polled_until(cond: Callable[[], bool]) -> Callable[[], bool]:
        return lambda: bool(poll() or cond())

    try:
        other.start()
        wait_until(lambda: owned(other) == [0, 1] or None, 90, "the other member running")
        wait_until(lambda: zombie.started or zombie.start() or True, 60, "joining")
        wait_until(polled_until(lambda: len(zombie.tasks.tasks) == 1
                                and zombie.tasks.counts()["running"] == 1
                                and len(owned(other)) == 1), 120,
                   "a partition each", detail=lambda: (zombie.status(), owned(other)))
        [p] = list(zombie.tasks.tasks)
        with Producer(kafka_bootstrap) as producer:
            producer.send(records(preds[:half], preds_topic)
                          + records(labels[:half], labels_topic))
        wait_until(polled_until(
            lambda: joined() + other.status()["counters"]["joined"] == half), 60,
            "the first half joined")
        assert zombie.checkpoint() is not None  # a member of the group commits
        mine = committed(kafka_bootstrap, group, preds_topic)[p]
        with Producer(kafka_bootstrap) as producer:
            producer.send(records(preds[half:], preds_topic))
        # read, not checkpointed: what a paused member holds past its last checkpoint
        wait_until(polled_until(
            lambda: sum(e.join.pending for e in zombie.tasks.engines())
            + other.status()["pending"] == N - half), 60, "the second half pending")
        # paused from here (no poll): the other member takes the partition, restores it
        # from the changelog and reads the second half itself
        wait_until(lambda: owned(other) == [0, 1] or None, 120, "the other owning both")
        wait_until(lambda: other.status()["pending"] == N - half or None, 60,
                   "the second half pending on the other member")
        ends = wait_until(lambda: (e := {t["partition"]: t["positions"].get(preds_topic)
                                         for t in other.status()["group"]["tasks"]})
                          and all(e.values()) and e
                          and committed(kafka_bootstrap, group, preds_topic) == e and e,
                          60, "the other member's checkpoint committed")
        assert ends[p] > mine, (ends, mine)
        # the paused member's consumer leaves the group past max_poll_interval_ms
        wait_until(lambda: zombie.source.preds.group_metadata().generation_id < 0  # type: ignore[union-attr]
                   or None, 60, "the paused member out of the group")
        assert list(zombie.tasks.tasks) == [p]  # the loop has not heard of it yet
        assert zombie.checkpoint() is None  # refused
        assert zombie.status()["checkpoints_refused"] == 1
        assert committed(kafka_bootstrap, group, preds_topic) == ends  # nothing stale
        # it rejoins: its task is dropped, what it gets is restored from the other's
        # checkpoints, and every pair joins once over the two members
        with Producer(kafka_bootstrap) as producer:
            producer.send(records(labels[half:], labels_topic))
        wait_until(polled_until(
            lambda: zombie.tasks.counts()["running"] == 1 and len(owned(other)) == 1
            and joined() + other.status()["counters"]["joined"] == N), 120,
            "the member back in the group, every pair joined once",
            detail=lambda: (zombie.status(), other.status()["group"]))
        assert zombie.tasks.fenced == 1
    finally:
        zombie.close()
        other.stop()


def test_the_broker_refuses_a_checkpoint_of_a_former_member(
        kafka_bootstrap: str, kafka_topics: Callable[..., list[str]], broker) -> None:
    """The broker's side of the fencing (KIP-447): a checkpoint transaction carrying the
    generation of a member the group has dropped is refused, and nothing of it is
    committed."""
    if not broker.fences_stale_members:
        pytest.skip(f"{broker.kind} does not check the group generation of a "
                    "transactional offset commit (TxnOffsetCommit of a dropped member "
                    "answers no error): only calmon's own refusal fences there")
    topic, labels = kafka_topics(count=2, partitions=1)
    group = f"calmon-stale-{uuid.uuid4().hex[:8]}"
    cfg = from_dict({"kafka": {"bootstrap_servers": kafka_bootstrap, "group_id": group,
                               "predictions_topic": topic, "labels_topic": labels,
                               "instance": "group", "client": GROUP_CLIENT},
                     "recalibration": {"enabled": False}}, env={})
    changelog.ensure_topic(cfg.kafka, 1)
    members = []
    log = Changelog(cfg.kafka)
    try:
        for _ in range(2):
            c = KafkaConsumer(bootstrap_servers=kafka_bootstrap, group_id=group,
                              enable_auto_commit=False, **GROUP_CLIENT)
            c.subscribe([topic])
            members.append(c)
        first, second = members
        wait_until(lambda: (first.poll(200) is not None and first.assignment()) or None, 60,
                   "the first member assigned")
        stale = first.group_metadata()
        log.commit({0: task_write(cfg, 1)}, {0: 1}, stale)  # a member's checkpoint: committed
        # the first stops polling: the group drops it and gives the partition to the second
        wait_until(lambda: (second.poll(200) is not None and second.assignment()) or None, 90,
                   "the second member assigned")
        with pytest.raises(ChangelogError):
            log.commit({0: task_write(cfg, 2)}, {0: 2}, stale)
        assert committed(kafka_bootstrap, group, topic) == {0: 1}
    finally:
        log.close()
        for c in members:
            c.close()
