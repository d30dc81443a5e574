"""kill -9 in the scaled-out mode (contract §7): an ingesting instance killed after its
joined batches were produced but before a checkpoint recorded them as sent restarts
from that checkpoint and sends them again; the owner drops the copies by source offset,
so its sample count equals the joined count. Then the owner itself is killed: the next
owner (it, restarted, or another instance rebuilding from the joined topic) counts
the same."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.daemon_helpers import Producer, wait_until
from tests.integration.cluster.fleet import RECAL, fleet_topics, instances, owner_view, records_of
from tests.recal_helpers import BASE_TS, binary_logit_stream

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # each test over ~30 s on 2 cores

N = 4000


def test_killed_instances_neither_lose_nor_double_samples(
        kafka_bootstrap: str, kafka_topics: Callable[..., list[str]], tmp_path: Path) -> None:
    preds_topic, labels_topic, joined_topic, cal_topic, group = fleet_topics(
        kafka_topics, cal_partitions=1)
    rng = np.random.default_rng(9)
    s = binary_logit_stream(rng, "ctr", N, BASE_TS, 2400.0)
    records = records_of(preds_topic, labels_topic, s)
    with Producer(kafka_bootstrap) as producer:
        producer.send(records)
    daemons = instances(tmp_path, kafka_bootstrap, preds_topic, labels_topic, group=group,
                        joined_topic=joined_topic, cal_topic=cal_topic,
                        recalibration={**RECAL, "min_samples": 100000})

    def owner_counts(expected: int) -> tuple[int, dict[str, Any]] | None:
        view = owner_view(daemons)
        if view is None or view[1]["models"]["ctr"]["samples"] != expected:
            return None
        # every instance has sent what it joined: nothing pending anywhere
        if any(d.status()["recalibration_owner"]["pending_batches"] for d in daemons):
            return None
        return view

    try:
        for d in daemons:
            d.start(wait_ready=False)
        for d in daemons:
            d.wait_ready()
        wait_until(lambda: sum(d.counters()["joined"] for d in daemons) == N or None, 120,
                   "every sample joined")
        owner, _ = wait_until(lambda: owner_counts(N), 120, "the owner holding every sample")

        # an ingesting instance that is not the owner, killed once its batches were
        # produced; its newest checkpoint may still list them as pending
        victim = next(i for i in range(3) if i != owner
                      and daemons[i].counters()["joined"] > 0)
        daemons[victim].kill()
        daemons[victim].start()
        assert sum(d.counters()["joined"] for d in daemons) == N  # restored, not re-counted
        _, view = wait_until(lambda: owner_counts(N), 120, "the owner after the restart")
        assert view["models"]["ctr"]["samples"] == N
        assert view["bad_batches"] == 0

        # now the owner: whoever owns ctr next holds exactly the joined samples
        daemons[owner].kill()
        daemons[owner].start()
        _, view = wait_until(lambda: owner_counts(N), 180, "the next owner")
        assert view["models"]["ctr"]["samples"] == N
    finally:
        for d in daemons:
            d.stop()
