"""kill -9 of the owner between its alarm and its publish (contract §7): the drift is
published exactly once, by the next owner, which rebuilds the model's buffer from the
joined topic (or from its own checkpoint when the group hands the model back)."""

from __future__ import annotations

import os
import signal
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from calmon.recal.registry import Registry
from tests.daemon_helpers import Producer, wait_until
from tests.integration.cluster.fleet import (
    documents,
    instances,
    owner_alarmed,
    owner_view,
    records_of,
)
from tests.recal_helpers import BASE_TS, Stream, binary_logit_stream

pytestmark = pytest.mark.integration


def test_the_owner_killed_after_its_alarm_leaves_one_publish(
        kafka_bootstrap: str, kafka_topics: Callable[..., list[str]], tmp_path: Path) -> None:
    preds_topic, labels_topic = kafka_topics(count=2, partitions=4)
    (joined_topic,) = kafka_topics(count=1, partitions=4)
    (cal_topic,) = kafka_topics(count=1, partitions=1)
    group = f"calmon-test-{uuid.uuid4().hex[:8]}"
    rng = np.random.default_rng(31)
    first = binary_logit_stream(rng, "ctr", 3000, BASE_TS, 2400.0, prefix="a")
    t2 = BASE_TS + 2400.0 + 3600.0 + 1200.0
    drifted = binary_logit_stream(rng, "ctr", 3000, t2, 2400.0, scale=2.5, prefix="b")
    early = Stream(drifted.preds[:900], drifted.labels[:900])  # alarms, < min_samples
    late = Stream(drifted.preds[900:], drifted.labels[900:])

    def records(s: Stream) -> list[tuple[str, bytes, bytes]]:
        return records_of(preds_topic, labels_topic, s)

    daemons = instances(tmp_path, kafka_bootstrap, preds_topic, labels_topic, group=group,
                        joined_topic=joined_topic, cal_topic=cal_topic)
    try:
        with Producer(kafka_bootstrap) as producer:
            producer.send(records(first) + records(early))
            for d in daemons:
                d.start(wait_ready=False)
            for d in daemons:
                d.wait_ready()

            (owner,) = wait_until(lambda: owner_alarmed(daemons), 120, "the owner's alarm")
            assert documents(kafka_bootstrap, cal_topic) == []  # not yet: < min_samples
            daemons[owner].kill()
            producer.send(records(late))
            daemons[owner].start()
        n = len(first) + len(drifted)
        wait_until(lambda: (lambda v: v if v and v[1]["models"]["ctr"]["samples"] == n
                            else None)(owner_view(daemons)), 180, "the next owner, all in")
        wait_until(lambda: documents(kafka_bootstrap, cal_topic) or None, 180,
                   "the publish of the next owner")
        # a few more checks by every instance: still one document
        for d in daemons:
            d.wait_checkpoint()
        docs = documents(kafka_bootstrap, cal_topic)
        assert Counter((d["model"], d["segment"], d["version"]) for d in docs) == {
            ("ctr", "__all__", 1): 1}
        assert 1.8 < float(docs[0]["params"]["temperature"]) < 3.4
    finally:
        for d in daemons:
            d.stop()


def test_an_owner_paused_past_a_rebalance_leaves_one_publish(
        kafka_bootstrap: str, kafka_topics: Callable[..., list[str]], tmp_path: Path) -> None:
    """SIGSTOP of the owner after its alarm (a stalled process: GC, swap, a frozen VM):
    its session expires, another instance takes the model over (fencing it), and when
    it resumes it finds itself out of the group, rejoins, and never adds a document:
    the drift is published once, every output_dir holds that one document."""
    preds_topic, labels_topic = kafka_topics(count=2, partitions=4)
    (joined_topic,) = kafka_topics(count=1, partitions=4)
    (cal_topic,) = kafka_topics(count=1, partitions=1)
    group = f"calmon-test-{uuid.uuid4().hex[:8]}"
    rng = np.random.default_rng(33)
    first = binary_logit_stream(rng, "ctr", 3000, BASE_TS, 2400.0, prefix="a")
    t2 = BASE_TS + 2400.0 + 3600.0 + 1200.0
    drifted = binary_logit_stream(rng, "ctr", 3000, t2, 2400.0, scale=2.5, prefix="b")
    early = Stream(drifted.preds[:900], drifted.labels[:900])  # alarms, < min_samples
    late = Stream(drifted.preds[900:], drifted.labels[900:])
    daemons = instances(tmp_path, kafka_bootstrap, preds_topic, labels_topic, group=group,
                        joined_topic=joined_topic, cal_topic=cal_topic)
    try:
        with Producer(kafka_bootstrap) as producer:
            producer.send(records_of(preds_topic, labels_topic, first)
                          + records_of(preds_topic, labels_topic, early))
            for d in daemons:
                d.start(wait_ready=False)
            for d in daemons:
                d.wait_ready()
            (owner,) = wait_until(lambda: owner_alarmed(daemons), 120, "the owner's alarm")
            paused = daemons[owner]
            others = [d for i, d in enumerate(daemons) if i != owner]
            os.kill(paused.pid, signal.SIGSTOP)
            try:
                producer.send(records_of(preds_topic, labels_topic, late))
                # past the session timeout the group moves ctr to another instance
                wait_until(lambda: owner_view(others), 120, "another owner of ctr")
            finally:
                os.kill(paused.pid, signal.SIGCONT)
        n = len(first) + len(drifted)
        wait_until(lambda: (lambda v: v if v and v[1]["models"]["ctr"]["samples"] == n
                            else None)(owner_view(daemons)), 180, "one owner, all in")
        wait_until(lambda: documents(kafka_bootstrap, cal_topic) or None, 180,
                   "the drift published")
        # the resumed instance checks on (its counter moves) and every output_dir is the
        # topic's copy: v1, once
        c0 = paused.status()["recalibration_owner"]["checks"]
        wait_until(lambda: paused.status()["recalibration_owner"]["checks"] >= c0 + 3
                   or None, 60, "three more checks of the resumed instance")
        docs = documents(kafka_bootstrap, cal_topic)
        assert Counter((d["model"], d["segment"], d["version"]) for d in docs) == {
            ("ctr", "__all__", 1): 1}
        assert 1.8 < float(docs[0]["params"]["temperature"]) < 3.4

        def copied() -> bool:
            for i in range(3):
                live = Registry(tmp_path / f"calibrators{i}").live("ctr", "__all__")
                if live is None or live.doc != docs[0]:
                    return False
            return True

        wait_until(copied, 60, "v1 in every instance's output_dir")
        assert "Traceback" not in paused.log_tail(100_000)
    finally:
        for d in daemons:
            d.stop()
