"""Kafka helpers shared by the source and the producer: partition ownership and
the translation of ``kafka.client`` into kafka-python keyword arguments."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any, Literal

from calmon.config import Instance

log = logging.getLogger(__name__)

MIB = 1024 * 1024


def owned_partitions(partitions: Iterable[int], instance: Instance | None) -> list[int]:
    """The partitions this instance reads: p with p % count == index, or all.

    The same rule for every topic keeps predictions and labels with the same key
    (hence the same partition number) on the same instance, so joins stay local.
    """
    ps = sorted(partitions)
    if instance is None:
        return ps
    return [p for p in ps if p % instance.count == instance.index]


def copartition_problem(predictions: tuple[str, int], labels: tuple[str, int],
                        instance: Instance | Literal["group"] | None) -> str | None:
    """Why the two input topics cannot be split over ``instance.count`` instances
    (``(topic, partition count)`` each), with what to do; None when they can.

    A prediction and its label meet only on one instance, so they must land on the
    same partition number: the same key, the same partitioner and the same partition
    count (Kafka Streams refuses topics that are not co-partitioned the same way).
    One instance reads every partition and needs none of this."""
    if instance is None or predictions[1] == labels[1]:
        return None
    if instance != "group" and instance.count <= 1:
        return None
    (small, _), (_, n_big) = sorted((predictions, labels), key=lambda x: x[1])
    who = ("kafka.instance: group members need" if instance == "group" else
           f"kafka.instance.count: {instance.count} instances need")
    return (f"{who} both input topics "
            f"co-partitioned, but kafka.predictions_topic {predictions[0]!r} has "
            f"{predictions[1]} partitions and kafka.labels_topic {labels[0]!r} has "
            f"{labels[1]}: a prediction and its label would meet only when their ids "
            f"happen to hash to the same partition of both. Give both topics the same "
            f"partition count (e.g. kafka-topics.sh --alter --topic {small} --partitions "
            f"{n_big}; partitions cannot be removed), or run one instance "
            f"(kafka.instance: null)")


def fetch_bytes(max_record_bytes: int) -> int:
    """A per-partition fetch size that holds the largest valid record with room to
    spare (at least 4 MiB, so 2 MB records always fit).

    Oversize records are still delivered: since KIP-74 a broker returns the first
    batch of a partition even when it exceeds the limit.
    """
    return max(4 * MIB, 2 * max_record_bytes)


def client_settings(
    client: Mapping[str, Any], accepted: Mapping[str, Any], *, role: str
) -> dict[str, Any]:
    """The subset of ``kafka.client`` that a kafka-python class accepts.

    ``kafka.client`` is shared by the consumer and the producer, and kafka-python
    rejects unknown keys, so each side keeps its own keys (``accepted`` is the
    class's ``DEFAULT_CONFIG``). Keys neither side knows are logged, not fatal.
    """
    from kafka import KafkaConsumer, KafkaProducer  # local: keeps import cheap for config checks

    from calmon.io import kafka_fixes

    kafka_fixes.install()  # every kafka-python client calmon builds reads a rejected login

    known = set(KafkaConsumer.DEFAULT_CONFIG) | set(KafkaProducer.DEFAULT_CONFIG)
    for key in client:
        if key not in known:
            log.warning("kafka.client.%s: not a kafka-python setting; ignored by the %s", key, role)
    return {k: _as_default(v, accepted[k]) for k, v in client.items() if k in accepted}


def _as_default(value: Any, default: Any) -> Any:
    """A string where kafka-python's default is a number or boolean, read as one:
    ``${VAR}`` always expands to a string (``request_timeout_ms: ${TIMEOUT}``)."""
    if not isinstance(value, str):
        return value
    text = value.strip()
    try:
        if isinstance(default, bool):
            return {"true": True, "false": False}.get(text.lower(), value)
        if isinstance(default, int):
            return int(text)
        if isinstance(default, float):
            return float(text)
    except ValueError:
        pass  # kafka-python says what is wrong with it
    return value
