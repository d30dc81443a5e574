"""The owner lost between its alarm and its publish (contract §7), killed (-9) or
paused (SIGSTOP) past a rebalance: the drift is published exactly once, by whichever
instance owns the model then, which rebuilds the model's buffer from the joined topic
(or from its own checkpoint when the group hands the model back)."""

from __future__ import annotations

import os
import signal
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from calmon.recal.registry import Registry
from tests.daemon_helpers import CalmonDaemon, Producer, wait_until
from tests.integration.cluster.fleet import (
    documents,
    fleet_topics,
    instances,
    owner_alarmed,
    owner_view,
    records_of,
)
from tests.recal_helpers import BASE_TS, Stream, binary_logit_stream

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # each test over ~30 s on 2 cores


@dataclass
class Alarmed:
    """Three instances whose owner of ``ctr`` alarmed on 900 drifted samples (under
    min_samples: nothing published yet); ``late`` holds the rest of the drift."""

    bootstrap: str
    cal_topic: str
    daemons: list[CalmonDaemon]
    owner: int
    late: list[tuple[str, bytes, bytes]]
    total: int  # every sample of the stream

    def one_owner_with_everything(self) -> tuple[int, dict[str, Any]]:
        view: tuple[int, dict[str, Any]] = wait_until(
            lambda: (lambda v: v if v and v[1]["models"]["ctr"]["samples"] == self.total
                     else None)(owner_view(self.daemons)), 180, "one owner, all in")
        return view

    def published_once(self) -> dict[str, Any]:
        """The one document (v1) on the topic, once published; the temperature undoes
        the 2.5x sharpening (1/2.5 from the data's construction)."""
        wait_until(lambda: documents(self.bootstrap, self.cal_topic) or None, 180,
                   "the drift published")
        docs = documents(self.bootstrap, self.cal_topic)
        assert Counter((d["model"], d["segment"], d["version"]) for d in docs) == {
            ("ctr", "__all__", 1): 1}
        assert 1.8 < float(docs[0]["params"]["temperature"]) < 3.4
        return docs[0]


@contextmanager
def alarmed(bootstrap: str, kafka_topics: Callable[..., list[str]], tmp_path: Path,
            seed: int) -> Iterator[Alarmed]:
    preds_topic, labels_topic, joined_topic, cal_topic, group = fleet_topics(
        kafka_topics, cal_partitions=1)
    rng = np.random.default_rng(seed)
    first = binary_logit_stream(rng, "ctr", 3000, BASE_TS, 2400.0, prefix="a")
    t2 = BASE_TS + 2400.0 + 3600.0 + 1200.0
    drifted = binary_logit_stream(rng, "ctr", 3000, t2, 2400.0, scale=2.5, prefix="b")
    early = Stream(drifted.preds[:900], drifted.labels[:900])  # alarms, < min_samples
    late = Stream(drifted.preds[900:], drifted.labels[900:])
    daemons = instances(tmp_path, bootstrap, preds_topic, labels_topic, group=group,
                        joined_topic=joined_topic, cal_topic=cal_topic)
    try:
        with Producer(bootstrap) as producer:
            producer.send(records_of(preds_topic, labels_topic, first)
                          + records_of(preds_topic, labels_topic, early))
        for d in daemons:
            d.start(wait_ready=False)
        for d in daemons:
            d.wait_ready()
        (owner,) = wait_until(lambda: owner_alarmed(daemons), 120, "the owner's alarm")
        assert documents(bootstrap, cal_topic) == []  # not yet: < min_samples
        yield Alarmed(bootstrap, cal_topic, daemons, owner,
                      records_of(preds_topic, labels_topic, late),
                      len(first) + len(drifted))
    finally:
        for d in daemons:
            d.stop()


def test_the_owner_killed_after_its_alarm_leaves_one_publish(
        kafka_bootstrap: str, kafka_topics: Callable[..., list[str]], tmp_path: Path) -> None:
    with alarmed(kafka_bootstrap, kafka_topics, tmp_path, seed=31) as fleet:
        fleet.daemons[fleet.owner].kill()
        with Producer(kafka_bootstrap) as producer:
            producer.send(fleet.late)
        fleet.daemons[fleet.owner].start()
        fleet.one_owner_with_everything()
        fleet.published_once()
        # a few more checks by every instance: still one document
        for d in fleet.daemons:
            d.wait_checkpoint()
        fleet.published_once()


def test_an_owner_paused_past_a_rebalance_leaves_one_publish(
        kafka_bootstrap: str, kafka_topics: Callable[..., list[str]], tmp_path: Path) -> None:
    """SIGSTOP of the owner after its alarm (a stalled process: GC, swap, a frozen VM):
    its session expires, another instance takes the model over (fencing it), and when
    it resumes it finds itself out of the group, rejoins, and never adds a document:
    the drift is published once, every output_dir holds that one document."""
    with alarmed(kafka_bootstrap, kafka_topics, tmp_path, seed=33) as fleet:
        paused = fleet.daemons[fleet.owner]
        others = [d for i, d in enumerate(fleet.daemons) if i != fleet.owner]
        os.kill(paused.pid, signal.SIGSTOP)
        try:
            with Producer(kafka_bootstrap) as producer:
                producer.send(fleet.late)
            # past the session timeout the group moves ctr to another instance
            wait_until(lambda: owner_view(others), 120, "another owner of ctr")
        finally:
            os.kill(paused.pid, signal.SIGCONT)
        fleet.one_owner_with_everything()
        fleet.published_once()
        # the resumed instance checks on (its counter moves) and every output_dir is the
        # topic's copy: v1, once
        c0 = paused.status()["recalibration_owner"]["checks"]
        wait_until(lambda: paused.status()["recalibration_owner"]["checks"] >= c0 + 3
                   or None, 60, "three more checks of the resumed instance")
        doc = fleet.published_once()

        def copied() -> bool:
            for i in range(3):
                live = Registry(tmp_path / f"calibrators{i}").live("ctr", "__all__")
                if live is None or live.doc != doc:
                    return False
            return True

        wait_until(copied, 60, "v1 in every instance's output_dir")
        assert "Traceback" not in paused.log_tail(100_000)
