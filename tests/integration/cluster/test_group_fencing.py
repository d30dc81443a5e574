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
from typing import Any

import pytest
import yaml
from kafka import KafkaConsumer

from calmon.config import from_dict
from calmon.group_run import GroupRun
from calmon.io import changelog
from calmon.io.changelog import ChangelogError
from calmon.io.confluent_settings import librdkafka_settings
from calmon.io.consumer_process import group_classes
from calmon.io.totals import ProcessTotals
from tests.daemon_helpers import Producer, dumps, make_dataset, wait_until
from tests.fakes import DeadLetterLog
from tests.integration.cluster.fleet import GROUP_CLIENT
from tests.integration.cluster.group import committed, member, owned, task_write

pytestmark = pytest.mark.integration

N = 400


@pytest.mark.slow
@pytest.mark.parametrize("library", ["kafka-python", "confluent"])
def test_a_member_out_of_the_group_commits_nothing(
        kafka_bootstrap: str, kafka_topics: Callable[..., list[str]], tmp_path: Path,
        broker, library: str) -> None:
    if library == "confluent" and broker.fences_stale_members:
        # the broker's own refusal of librdkafka's stale metadata is the next test; this
        # one runs where calmon's refusal is the only fence (and saves a minute)
        pytest.skip(f"librdkafka's paused member runs where the broker does not fence "
                    f"({broker.kind} does)")
    preds_topic, labels_topic = kafka_topics(count=2, partitions=2)
    group = f"calmon-fence-{tmp_path.name[-12:]}"
    other = member(tmp_path, kafka_bootstrap, preds_topic, labels_topic, group, "other",
                   library=library)
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
        wait_until(lambda: not zombie.source.in_group() or None, 60,
                   "the paused member out of the group")
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


@pytest.mark.parametrize("library", ["kafka-python", "confluent"])
def test_the_broker_refuses_a_checkpoint_of_a_former_member(
        kafka_bootstrap: str, kafka_topics: Callable[..., list[str]], broker,
        library: str) -> None:
    """The broker's side of the fencing (KIP-447): a checkpoint transaction carrying the
    generation of a member the group has dropped is refused, and nothing of it is
    committed (the consumers and the transaction of ``library``)."""
    if not broker.fences_stale_members:
        pytest.skip(f"{broker.kind} does not check the group generation of a "
                    "transactional offset commit (TxnOffsetCommit of a dropped member "
                    "answers no error): only calmon's own refusal fences there")
    topic, labels = kafka_topics(count=2, partitions=1)
    group = f"calmon-stale-{uuid.uuid4().hex[:8]}"
    cfg = from_dict({"kafka": {"bootstrap_servers": kafka_bootstrap, "group_id": group,
                               "predictions_topic": topic, "labels_topic": labels,
                               "instance": "group", "client": GROUP_CLIENT,
                               "library": library},
                     "recalibration": {"enabled": False}}, env={})
    changelog.ensure_topic(cfg.kafka, 1)
    members = [Member(library, kafka_bootstrap, group, topic)]
    log = group_classes(cfg.kafka)[1](cfg.kafka)
    try:
        [first] = members
        wait_until(first.assigned, 60, "the first member assigned")
        stale = first.group_metadata()
        log.commit({0: task_write(cfg, 1)}, {0: 1}, stale)  # a member's checkpoint: committed
        # the second joins only now (subscribed earlier, an assignment of a generation it
        # was dropped from while the first polled alone could come late), and the first
        # stops polling: the group drops it and gives the partition to the second
        second = Member(library, kafka_bootstrap, group, topic)
        members.append(second)
        wait_until(second.assigned, 90, "the second member assigned")
        with pytest.raises(ChangelogError):
            log.commit({0: task_write(cfg, 2)}, {0: 2}, stale)
        assert committed(kafka_bootstrap, group, topic) == {0: 1}
    finally:
        log.close()
        for c in members:
            c.close()


class Member:
    """A plain consumer of the group, of either library (what a member's predictions
    consumer does, without calmon around it)."""

    def __init__(self, library: str, bootstrap: str, group: str, topic: str) -> None:
        self.library = library
        if library == "confluent":
            from confluent_kafka import Consumer

            self.c: Any = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                                    "enable.auto.commit": False,
                                    **librdkafka_settings(GROUP_CLIENT, role="consumer")})
        else:
            self.c = KafkaConsumer(bootstrap_servers=bootstrap, group_id=group,
                                   enable_auto_commit=False, **GROUP_CLIENT)
        self.c.subscribe([topic])

    def assigned(self) -> bool:
        """One poll; whether the group has given it a partition."""
        if self.library == "confluent":
            self.c.consume(1, 0.2)
        else:
            self.c.poll(200)
        return bool(self.c.assignment())

    def group_metadata(self) -> Any:
        return (self.c.consumer_group_metadata() if self.library == "confluent"
                else self.c.group_metadata())

    def close(self) -> None:
        self.c.close()
