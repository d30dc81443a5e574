"""Partition counts that change under a running source (the test broker cannot add
partitions): both libraries' sources, with their client replaced by a stand-in that
answers metadata as a broker would and records what the source asked of it.

With several instances the topics must keep the same partition count: a difference
is reported (the assignment stays as it was), and partitions added to both topics
are taken, read from their beginning. One instance takes new partitions of either."""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest

from calmon.config import Instance, KafkaConfig
from calmon.io.kafka_source import KafkaSource
from calmon.io.source import CoPartitionError, SourceBase
from calmon.io.topics import copartition_problem

P, L = "preds", "labels"


class FakeKafkaPython:
    """What KafkaSource uses of a kafka-python KafkaConsumer."""

    def __init__(self, parts: dict[str, int]) -> None:
        self.parts = parts
        self.assigned: list[tuple[str, int]] = []
        self.from_beginning: list[tuple[str, int]] = []

    def partitions_for_topic(self, topic: str) -> set[int]:
        return set(range(self.parts[topic]))

    def assign(self, tps: list[Any]) -> None:
        self.assigned = sorted((tp.topic, tp.partition) for tp in tps)

    def seek(self, tp: Any, offset: int) -> None:
        pass

    def seek_to_beginning(self, *tps: Any) -> None:
        self.from_beginning += [(tp.topic, tp.partition) for tp in tps]


def kafka_python_source(parts: dict[str, int], instance: Instance | None
                        ) -> tuple[SourceBase, Callable[[], list[tuple[str, int]]],
                                   Callable[[], list[tuple[str, int]]], dict[str, int]]:
    source = KafkaSource(KafkaConfig(predictions_topic=P, labels_topic=L, instance=instance))
    fake = FakeKafkaPython(parts)
    source._consumer = fake  # type: ignore[assignment]
    return source, lambda: fake.assigned, lambda: sorted(fake.from_beginning), fake.parts


class FakeConfluent:
    """What ConfluentSource uses of a confluent-kafka Consumer."""

    def __init__(self, parts: dict[str, int]) -> None:
        self.parts = parts
        self.assigned: list[tuple[str, int]] = []
        self.from_beginning: list[tuple[str, int]] = []

    def list_topics(self, topic: str, timeout: float) -> Any:
        meta = SimpleNamespace(error=None, partitions={p: None for p in range(self.parts[topic])})
        return SimpleNamespace(topics={topic: meta})

    def assign(self, tps: list[Any]) -> None:
        self.assigned = sorted((tp.topic, tp.partition) for tp in tps)

    def incremental_assign(self, tps: list[Any]) -> None:
        from confluent_kafka import OFFSET_BEGINNING

        assert all(tp.offset == OFFSET_BEGINNING for tp in tps)
        self.from_beginning += [(tp.topic, tp.partition) for tp in tps]
        self.assigned = sorted({*self.assigned, *((tp.topic, tp.partition) for tp in tps)})


def confluent_source(parts: dict[str, int], instance: Instance | None
                     ) -> tuple[SourceBase, Callable[[], list[tuple[str, int]]],
                                Callable[[], list[tuple[str, int]]], dict[str, int]]:
    pytest.importorskip("confluent_kafka")
    from calmon.io.confluent_source import ConfluentSource

    source = ConfluentSource(KafkaConfig(predictions_topic=P, labels_topic=L,
                                         instance=instance, library="confluent"))
    fake = FakeConfluent(parts)
    source._consumer = fake  # type: ignore[assignment]
    return source, lambda: fake.assigned, lambda: sorted(fake.from_beginning), fake.parts


LIBRARIES = pytest.mark.parametrize("make", [kafka_python_source, confluent_source],
                                    ids=["kafka-python", "confluent"])


def owned(n: int, index: int, count: int) -> list[tuple[str, int]]:
    """What instance ``index`` of ``count`` reads of two n-partition topics."""
    return sorted((t, p) for t in (P, L) for p in range(n) if p % count == index)


@LIBRARIES
def test_partitions_added_under_a_running_source(make: Any) -> None:
    source, assigned, from_beginning, parts = make({P: 4, L: 4}, Instance(index=1, count=2))
    assert source.assign() == owned(4, 1, 2) == assigned()
    assert source.refresh() is None  # nothing changed

    parts[P] = 6  # the predictions topic first: the topics no longer co-partition
    problem = source.refresh()
    assert problem is not None
    assert "6 partitions" in problem and "has 4" in problem and "--partitions 6" in problem
    assert source.owned == owned(4, 1, 2) == assigned()  # reading on as before
    assert from_beginning() == []

    parts[L] = 6  # and the labels topic: both topics' new partition 5 is this instance's
    assert source.refresh() is None
    assert source.owned == owned(6, 1, 2) == assigned()
    assert from_beginning() == [(L, 5), (P, 5)]  # new partitions from their first record
    assert source.refresh() is None
    assert from_beginning() == [(L, 5), (P, 5)]  # taken once


@LIBRARIES
def test_one_instance_takes_new_partitions_of_either_topic(make: Any) -> None:
    source, assigned, from_beginning, parts = make({P: 2, L: 3}, None)
    assert source.assign() == [(L, 0), (L, 1), (L, 2), (P, 0), (P, 1)] == assigned()
    parts[P] = 3
    assert source.refresh() is None
    assert from_beginning() == [(P, 2)]
    assert source.owned == owned(3, 0, 1) == assigned()


@LIBRARIES
def test_several_instances_refuse_topics_that_differ_at_assignment(make: Any) -> None:
    source, assigned, _, _ = make({P: 4, L: 6}, Instance(index=0, count=3))
    with pytest.raises(CoPartitionError, match=r"4 partitions .* has 6"):
        source.assign()
    assert assigned() == []


def test_the_problem_says_what_to_do() -> None:
    three = Instance(index=0, count=3)
    text = copartition_problem(("p", 6), ("l", 4), three)
    assert text is not None and text.startswith("kafka.instance.count: 3 instances")
    assert "kafka-topics.sh --alter --topic l --partitions 6" in text
    assert "kafka.instance: null" in text
    assert copartition_problem(("p", 4), ("l", 4), three) is None
    assert copartition_problem(("p", 4), ("l", 6), Instance(index=0, count=1)) is None
    assert copartition_problem(("p", 4), ("l", 6), None) is None
