"""A former owner paused past a rebalance cannot publish (contract §7): the broker
fences it, not a check of ours.

Two real owner services (``calmon.cluster.service.Cluster``, the daemon's own) in this
process, on the broker: instance A owns the model, alarms and decides to publish, and
is held right there, between its decision and its transaction (a stalled thread: a GC
pause, a slow disk). Past ``max_poll_interval_ms`` its client leaves the group, B takes
the partition over (initialising the partition's transactional id), reads the topic
back and publishes v1 itself. A then resumes and sends its publish: the broker refuses
it, nothing of it is ever read back, and A drops what it held of the partition."""

from __future__ import annotations

import json
import threading
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from calmon import config as config_mod
from calmon.cluster.kafka import JoinedProducer
from calmon.cluster.service import Cluster
from calmon.engine.series import ALL
from calmon.errors import NotOwnerError
from tests.daemon_helpers import wait_until
from tests.integration.cluster.fleet import (
    GROUP_CLIENT,
    documents,
    input_backlog,
    joined_batches,
    owner_config,
)

pytestmark = pytest.mark.integration


def test_a_paused_former_owner_is_fenced_by_the_broker(
        kafka_bootstrap: str, kafka_topics: Callable[..., list[str]], tmp_path: Path) -> None:
    (joined_topic,) = kafka_topics(count=1, partitions=1)
    (cal_topic,) = kafka_topics(count=1, partitions=1)
    group = f"calmon-test-{uuid.uuid4().hex[:8]}"
    preds = input_backlog(kafka_bootstrap, kafka_topics)

    def cfg(i: int) -> config_mod.Config:
        # client ids order the members (the range assignor gives partition 0 to the
        # first member id): A ("a-...") owns it while both are in the group
        client = {**GROUP_CLIENT, "client_id": f"{'ab'[i]}-{group}"}
        return owner_config(tmp_path, kafka_bootstrap, group=group, index=i, suffix=str(i),
                            joined_topic=joined_topic, cal_topic=cal_topic, client=client,
                            predictions_topic=preds)

    a, b = Cluster(cfg(0)), Cluster(cfg(1))
    decided, resume = threading.Event(), threading.Event()
    refused: list[BaseException] = []
    send = a.registry.publish_to_topic
    assert send is not None

    def held(model: str, segment: str, doc: dict[str, Any], data: bytes) -> Any:
        """A's publish, held between the policy's decision and the transaction."""
        decided.set()
        resume.wait(120)
        try:
            return send(model, segment, doc, data)
        except BaseException as e:
            refused.append(e)
            raise

    a.registry.publish_to_topic = held
    try:
        # B joins first, so it leads the group (Tansu hands no new leader over when
        # the leader leaves); A joins and takes partition 0 over
        b.start()
        wait_until(lambda: b.owned == frozenset({0}) or None, 120, "B owning partition 0")
        a.start()
        wait_until(lambda: (a.owned == frozenset({0}) and not b.owned) or None, 120,
                   "A owning partition 0")
        producer = JoinedProducer(cfg(0).kafka, joined_topic)
        assert producer.send(joined_batches(np.random.default_rng(26), preds))
        producer.close()
        wait_until(decided.is_set, 120, "A's decision to publish ctr")
        assert a.owned == frozenset({0}) and b.owned == frozenset()
        # the id the README's ACLs name: one per joined-topic partition
        assert a.publisher.transactional_id(0) == f"{group}-recal-0"
        # A's client leaves the group once its poll is overdue; B takes the partition
        # (its transactional id initialised: A fenced), reads back and publishes v1
        wait_until(lambda: b.owned == frozenset({0}) or None, 120, "B owning partition 0")
        wait_until(lambda: documents(kafka_bootstrap, cal_topic) or None, 120,
                   "B's publish")
        resume.set()
        wait_until(lambda: refused or None, 60, "A's publish refused")
        wait_until(lambda: a.outcomes.get(("ctr", ALL, "temperature", "failed")) or None,
                   60, "A's refused publish counted failed")
        # the broker's fencing error (not one of ours), said as a lost ownership
        assert isinstance(refused[0], NotOwnerError), repr(refused[0])
        cause = refused[0].__cause__
        assert type(cause).__module__.startswith("kafka"), repr(cause)
        assert 0 not in a.owned and a.owner.models() == []  # A forgot the partition
        docs = documents(kafka_bootstrap, cal_topic)
        # A's output_dir holds the topic's documents only (B's, copied): no phantom
        for path in (tmp_path / "calibrators0").rglob("v*.json"):
            assert json.loads(path.read_bytes()) in docs, path
        assert Counter((d["model"], d["segment"], d["version"]) for d in docs) == {
            ("ctr", ALL, 1): 1}
        assert b.outcomes.get(("ctr", ALL, "temperature", "published")) == 1
        # B fitted on both senders' post-change samples: more than either sent (1,500),
        # at most the 3,000 there are
        fit = docs[0]["fit"]
        assert 1500 < fit["samples"] + fit["holdout_samples"] <= 3000, fit
    finally:
        resume.set()
        b.stop()
        a.stop()
