"""One writer per calibrator, fenced by the broker (contract §7): a former owner whose
transactional id a new owner initialised cannot publish, and what it tried to write is
never read back with read_committed."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from calmon import config as config_mod
from calmon.cluster.kafka import Publisher, materialise, read_back
from calmon.recal.registry import Registry
from tests.conftest import FAST_CLIENT


def doc(version: int, temperature: float) -> bytes:
    return (json.dumps({"model": "ctr", "segment": "__all__", "version": version,
                        "method": "temperature", "input": "logit",
                        "params": {"temperature": temperature}}, indent=2) + "\n").encode()


def test_a_fenced_former_owner_cannot_publish(
        kafka_bootstrap: str, kafka_topics: Callable[..., list[str]], tmp_path: Path) -> None:
    (topic,) = kafka_topics(count=1, partitions=2)
    kafka = config_mod.from_dict({"kafka": {"bootstrap_servers": kafka_bootstrap,
                                            "client": dict(FAST_CLIENT)}}).kafka
    group = f"calmon-test-{uuid.uuid4().hex[:8]}"
    old, new = Publisher(kafka, topic, group), Publisher(kafka, topic, group)
    try:
        old.take(3)
        assert old.send(3, "ctr/__all__", doc(1, 2.0))  # the owner publishes v1
        # a rebalance moves joined-topic partition 3 to another instance, which
        # initialises the same transactional id while the former owner is paused
        new.take(3)
        with pytest.raises(Exception):  # noqa: B017 - the broker's fencing error
            old.send(3, "ctr/__all__", doc(2, 9.9))
        assert 3 in old.fenced and 3 not in old.producers
        # the new owner reads back to its own marker: v1 only, the fenced v2 never
        docs = read_back(new, 3)
        assert [(d["version"], d["params"]["temperature"]) for d, _ in docs] == [(1, 2.0)]
        # the local view: v1 as latest, a stale v2 file (a phantom of the fenced publish)
        # removed, so the next version the registry hands out is 2
        reg = Registry(tmp_path / "calibrators")
        stale = reg.dir_of("ctr", "__all__")
        stale.mkdir(parents=True)
        (stale / "v2.json").write_bytes(doc(2, 9.9))
        assert materialise(reg, docs) == 1
        assert reg.versions("ctr", "__all__") == [1]
        live = reg.live("ctr", "__all__")
        assert live is not None and live.version == 1
        assert new.send(3, "ctr/__all__", doc(2, 1.5))
        again = read_back(new, 3)
        assert [d["version"] for d, _ in again] == [1, 2]
    finally:
        old.close()
        new.close()
