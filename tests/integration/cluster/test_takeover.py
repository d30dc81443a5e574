"""An owner that cannot take its partitions over yet (contract §7: versions come from the
calibrators topic, read back to its own marker) neither reads them nor decides on them:
they stay paused, nothing read from them is lost, and the takeover is retried until the
topic is there. Then every joined sample reaches the owner and the drift is published."""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from calmon.cluster.kafka import JoinedProducer
from calmon.cluster.service import Cluster
from calmon.engine.series import ALL
from tests.conftest import create_topics, unique_topic
from tests.daemon_helpers import wait_until
from tests.integration.cluster.fleet import (
    documents,
    input_backlog,
    joined_batches,
    owner_config,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # each test over ~30 s on 2 cores


def test_partitions_wait_paused_until_the_calibrators_topic_is_there(
        kafka_bootstrap: str, kafka_topics: Callable[..., list[str]], tmp_path: Path) -> None:
    (joined_topic,) = kafka_topics(count=1, partitions=1)
    cal_topic = unique_topic("calmon-test")  # not created yet
    group = f"calmon-test-{uuid.uuid4().hex[:8]}"
    preds = input_backlog(kafka_bootstrap, kafka_topics)
    cfg = owner_config(tmp_path, kafka_bootstrap, group=group, joined_topic=joined_topic,
                       cal_topic=cal_topic, predictions_topic=preds)
    producer = JoinedProducer(cfg.kafka, joined_topic)
    assert producer.send(joined_batches(np.random.default_rng(7), preds))
    producer.close()

    cluster = Cluster(cfg)
    try:
        cluster.start()
        wait_until(lambda: cluster.waiting == {0} or None, 120,
                   "partition 0 assigned, waiting for the calibrators topic")
        # two retries later: still not owned, nothing read, nothing decided
        wait_until(lambda: cluster.takeover_failures >= 3 or None, 120, "three attempts")
        assert cluster.owned == frozenset() and cluster.owner.sample_count("ctr") == 0
        assert cluster.status()["waiting_partitions"] == [0]
        create_topics(kafka_bootstrap, [cal_topic], 1)
        wait_until(lambda: cluster.owned == frozenset({0}) or None, 120,
                   "the takeover once the topic exists")
        assert cluster.waiting == set()
        # every joined sample reached the owner: 2 senders x 3,000 (from the batches)
        wait_until(lambda: cluster.owner.sample_count("ctr") == 6000 or None, 120,
                   "all 6,000 samples at the owner")
        wait_until(lambda: documents(kafka_bootstrap, cal_topic) or None, 120,
                   "the drift published")
        docs = documents(kafka_bootstrap, cal_topic)
        assert Counter((d["model"], d["segment"], d["version"]) for d in docs) == {
            ("ctr", ALL, 1): 1}
    finally:
        cluster.stop()
