"""Group mode (contract §8): a member that stopped polling past the session timeout
(paused) has its partitions moved; its next checkpoint is refused and writes nothing,
even once its consumer has left the group: the broker does not check a transactional
offset commit that carries no generation (KIP-447 keeps that for producers of no
group), so the member refuses it itself. It rejoins and the counts stay exact.

The paused member is a ``GroupRun`` driven by hand (its loop is this test: it stops
polling, as a SIGSTOPped daemon does, and checkpoints at a chosen moment); the member
that takes over is a real ``calmon run``."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
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
from tests.daemon_helpers import (
    REPO,
    Producer,
    dumps,
    make_dataset,
    subprocess_env,
    wait_until,
)
from tests.fakes import DeadLetterLog
from tests.integration.cluster.fleet import GROUP_CLIENT
from tests.integration.cluster.group import committed, member, owned, task_write

pytestmark = pytest.mark.integration

N = 400


class _Pair:
    """A hand-driven member (``zombie``: a ``GroupRun`` whose loop is the test) and a
    ``calmon run`` member (``other``) of one group on a 2-partition stream of ``N``
    pairs, each holding a partition, the first half joined and checkpointed by both
    and the second half's predictions read, not checkpointed, by the zombie: what a
    member holds when it is paused."""

    def __init__(self, bootstrap: str, topics: Callable[..., list[str]], tmp_path: Path,
                 name: str, library: str = "kafka-python") -> None:
        self.bootstrap = bootstrap
        self.preds_topic, self.labels_topic = topics(count=2, partitions=2)
        self.group = f"calmon-{name}-{tmp_path.name[-12:]}"
        self.other = member(tmp_path, bootstrap, self.preds_topic, self.labels_topic,
                            self.group, "other", library=library)
        cfg = from_dict(yaml.safe_load(self.other.config.read_text()))
        self.zombie = GroupRun(cfg, ProcessTotals(), DeadLetterLog())  # type: ignore[arg-type]
        self.preds, self.labels = make_dataset(N, seed=40, span_s=3600.0)

    def records(self, rows: list[dict], topic: str) -> list[tuple[str, bytes, bytes]]:
        return [(topic, str(r["id"]).encode(), dumps(r)) for r in rows]

    def poll(self) -> None:  # one turn of the member's loop, without its timed checkpoint
        self.zombie.tasks.feed(self.zombie.source.poll_chunks(250, 5000),
                               time.time() + 3600, force=True)

    def joined(self) -> int:
        return sum(e.status()["counters"]["joined"] for e in self.zombie.tasks.engines())

    def polled_until(self, cond: Callable[[], bool]) -> Callable[[], bool]:
        return lambda: bool(self.poll() or cond())

    def committed(self) -> dict[int, int]:
        return committed(self.bootstrap, self.group, self.preds_topic)

    def start(self) -> tuple[int, int]:
        """Both members running, a partition each, the first half joined and
        checkpointed, the second half's predictions read by both; the zombie's partition
        and its committed offset."""
        zombie, other, half = self.zombie, self.other, N // 2
        other.start()
        wait_until(lambda: owned(other) == [0, 1] or None, 90, "the other member running")
        wait_until(lambda: zombie.started or zombie.start() or True, 60, "joining")
        wait_until(self.polled_until(lambda: len(zombie.tasks.tasks) == 1
                                     and zombie.tasks.counts()["running"] == 1
                                     and len(owned(other)) == 1), 120,
                   "a partition each", detail=lambda: (zombie.status(), owned(other)))
        [p] = list(zombie.tasks.tasks)
        with Producer(self.bootstrap) as producer:
            producer.send(self.records(self.preds[:half], self.preds_topic)
                          + self.records(self.labels[:half], self.labels_topic))
        wait_until(self.polled_until(
            lambda: self.joined() + other.status()["counters"]["joined"] == half), 60,
            "the first half joined")
        assert zombie.checkpoint() is not None  # a member of the group commits
        mine = self.committed()[p]
        with Producer(self.bootstrap) as producer:
            producer.send(self.records(self.preds[half:], self.preds_topic))
        # read, not checkpointed: what a paused member holds past its last checkpoint
        wait_until(self.polled_until(
            lambda: sum(e.join.pending for e in zombie.tasks.engines())
            + other.status()["pending"] == N - half), 60, "the second half pending")
        return p, mine

    def taken_over(self) -> dict[int, int]:
        """Once the zombie stopped polling: the other member owns both partitions, has
        restored the zombie's from the changelog and read the second half itself, and
        its checkpoint is committed; its committed offsets."""
        other = self.other
        wait_until(lambda: owned(other) == [0, 1] or None, 120, "the other owning both")
        wait_until(lambda: other.status()["pending"] == N - N // 2 or None, 60,
                   "the second half pending on the other member")
        return wait_until(lambda: (e := {t["partition"]: t["positions"].get(self.preds_topic)
                                         for t in other.status()["group"]["tasks"]})
                          and all(e.values()) and e and self.committed() == e and e,
                          60, "the other member's checkpoint committed")

    def rejoined(self) -> None:
        """The zombie back in the group: its task dropped, what it gets restored from
        the other's checkpoints, and every pair joined once over the two members."""
        zombie, other = self.zombie, self.other
        with Producer(self.bootstrap) as producer:
            producer.send(self.records(self.labels[N // 2:], self.labels_topic))
        wait_until(self.polled_until(
            lambda: zombie.tasks.counts()["running"] == 1 and len(owned(other)) == 1
            and self.joined() + other.status()["counters"]["joined"] == N), 120,
            "the member back in the group, every pair joined once",
            detail=lambda: (zombie.status(), other.status()["group"]))

    def close(self) -> None:
        self.zombie.close()
        self.other.stop()


@pytest.mark.slow
@pytest.mark.parametrize("library", ["kafka-python", "confluent"])
def test_a_member_out_of_the_group_commits_nothing(
        kafka_bootstrap: str, kafka_topics: Callable[..., list[str]], tmp_path: Path,
        broker, library: str) -> None:
    if library == "confluent" and broker.fences_stale_members:
        # the broker's own refusal of librdkafka's stale metadata is the test below; this
        # one runs where calmon's refusal is the only fence (and saves a minute)
        pytest.skip(f"librdkafka's paused member runs where the broker does not fence "
                    f"({broker.kind} does)")
    pair = _Pair(kafka_bootstrap, kafka_topics, tmp_path, "fence", library)
    zombie = pair.zombie
    try:
        p, mine = pair.start()
        # paused from here (no poll): the other member takes the partition
        ends = pair.taken_over()
        assert ends[p] > mine, (ends, mine)
        # the paused member's consumer leaves the group past max_poll_interval_ms
        wait_until(lambda: not zombie.source.in_group() or None, 60,
                   "the paused member out of the group")
        assert list(zombie.tasks.tasks) == [p]  # the loop has not heard of it yet
        assert zombie.checkpoint() is None  # refused
        assert zombie.status()["checkpoints_refused"] == 1
        assert pair.committed() == ends  # nothing stale
        pair.rejoined()
        assert zombie.tasks.fenced == 1
    finally:
        pair.close()


@pytest.mark.slow
def test_a_resumed_member_that_still_holds_its_generation_commits_nothing(
        kafka_bootstrap: str, kafka_topics: Callable[..., list[str]], tmp_path: Path,
        broker) -> None:
    """A member paused past the session timeout (SIGSTOP: its heartbeat thread stops
    too) and resumed still holds its old generation until its consumer hears it was
    dropped; a checkpoint in that moment is refused on every broker (calmon: no
    heartbeat answered within the session timeout; Apache Kafka also checks the
    generation, Tansu does not) and commits nothing over the new owner's. Nor as its
    heartbeats start again: kafka-python restarts its session clock on finding the
    coordinator, before any answer, and counts REBALANCE_IN_PROGRESS (Tansu's answer to
    the stale generation of a member it still lists) as a heartbeat, so calmon's clock
    counts only heartbeats answered without error and assignments."""
    if broker.fences_stale_members:
        # there the broker refuses it too (test_the_broker_refuses_...), so calmon's own
        # refusal is what this test isolates: where it is the only fence
        pytest.skip(f"{broker.kind} refuses a stale generation itself: calmon's heartbeat "
                    "check is tested where it is the only fence")
    pair = _Pair(kafka_bootstrap, kafka_topics, tmp_path, "resumed")
    zombie = pair.zombie
    try:
        p, _ = pair.start()
        coordinator = zombie.source.preds._coordinator  # type: ignore[union-attr]
        coordinator._disable_heartbeat()  # paused: no heartbeat, no poll, no leave
        ends = pair.taken_over()
        generation = zombie.source.preds.group_metadata().generation_id  # type: ignore[union-attr]
        assert generation >= 0  # resumed, and unaware it was dropped
        assert list(zombie.tasks.tasks) == [p]
        assert zombie.checkpoint() is None  # refused
        assert zombie.status()["checkpoints_refused"] == 1
        assert pair.committed() == ends  # nothing stale
        # resumed: the heartbeat thread finds the coordinator again, which restarts
        # kafka-python's session clock before anything is answered
        coordinator.heartbeat.reset_timeouts()
        assert zombie.checkpoint() is None  # refused
        assert pair.committed() == ends
        # then its heartbeat is answered; the loop has not polled yet
        enabled = time.monotonic()
        coordinator._enable_heartbeat()
        wait_until(lambda: coordinator.heartbeat.last_receive > enabled
                   or zombie.source.preds.group_metadata().generation_id < 0,  # type: ignore[union-attr]
                   30, "the resumed member's heartbeat answered")
        assert zombie.checkpoint() is None  # still refused
        assert zombie.status()["checkpoints_refused"] == 3
        assert pair.committed() == ends
        pair.rejoined()
    finally:
        pair.close()


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


class _Child:
    """The zombie of a ``_Pair`` in a process of its own (``paused_member``): SIGSTOP
    stops every thread of it, librdkafka's heartbeats and session check included."""

    def __init__(self, pair: _Pair, tmp_path: Path) -> None:
        self.log = tmp_path / "zombie.log"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.integration.cluster.paused_member",
             str(pair.other.config)], cwd=str(REPO), env=subprocess_env(),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log.open("wb"),
            text=True, bufsize=1)
        self.last: dict[str, Any] = {}

    def ask(self, command: str = "poll") -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        assert line, f"the paused member exited: {self.log.read_text()[-3000:]}"
        self.last = json.loads(line)
        return self.last

    def close(self) -> None:
        self.proc.send_signal(signal.SIGCONT)
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


@pytest.mark.slow
def test_a_sigstopped_librdkafka_member_resumed_into_a_checkpoint_commits_nothing(
        kafka_bootstrap: str, kafka_topics: Callable[..., list[str]], tmp_path: Path,
        broker) -> None:
    """``kafka.library: confluent``: a member SIGSTOPped past the session timeout and
    given a checkpoint as its very first step once resumed commits nothing, on Tansu,
    where calmon's own refusal is the only fence. kafka-python needs calmon's heartbeat
    age check for this (the resumed consumer keeps its generation until a heartbeat
    answers); librdkafka does not: its main thread waits at most a second for work,
    then checks the session (``rd_kafka_cgrp_serve``: no successful coordinator answer
    for ``session.timeout.ms``, SESSTMOUT), clears the member id and revokes the
    assignment as lost, so ``group_metadata`` finds no member id and refuses."""
    if broker.fences_stale_members:
        pytest.skip(f"{broker.kind} refuses a stale generation itself: calmon's heartbeat "
                    "check is tested where it is the only fence")
    pair = _Pair(kafka_bootstrap, kafka_topics, tmp_path, "sigstop", "confluent")
    other, half = pair.other, N // 2
    child: _Child | None = None
    try:
        other.start()
        wait_until(lambda: owned(other) == [0, 1] or None, 90, "the other member running")
        child = _Child(pair, tmp_path)
        wait_until(lambda: child.ask()["running"] == 1 and len(owned(other)) == 1, 120,
                   "a partition each", detail=lambda: (child.last, owned(other)))
        [p] = child.last["tasks"]
        with Producer(pair.bootstrap) as producer:
            producer.send(pair.records(pair.preds[:half], pair.preds_topic)
                          + pair.records(pair.labels[:half], pair.labels_topic))
        wait_until(lambda: child.ask()["joined"] + other.status()["counters"].get(
            "joined", 0) == half, 60, "the first half joined")
        assert child.ask("checkpoint")["written"]  # a member of the group commits
        mine = pair.committed()[p]
        with Producer(pair.bootstrap) as producer:
            producer.send(pair.records(pair.preds[half:], pair.preds_topic))
        wait_until(lambda: child.ask()["pending"] + other.status()["pending"] == N - half,
                   60, "the second half pending")
        child.proc.send_signal(signal.SIGSTOP)  # every thread of it, heartbeats too
        ends = pair.taken_over()
        assert ends[p] > mine, (ends, mine)
        assert child.proc.stdin is not None
        child.proc.stdin.write("checkpoint\n")  # its first step once resumed
        child.proc.stdin.flush()
        child.proc.send_signal(signal.SIGCONT)
        assert child.proc.stdout is not None
        got = json.loads(child.proc.stdout.readline())
        assert got["written"] is False and got["refused"] == 1, got
        assert pair.committed() == ends  # nothing stale
        assert "this member is not in the group" in child.log.read_text()
        # librdkafka's log lines come out of its queue at the member's next polls
        wait_until(lambda: (child.ask() and "SESSTMOUT" in child.log.read_text()) or None,
                   60, "librdkafka's own session check in the member's log")
    finally:
        if child is not None:
            child.close()
        pair.close()
