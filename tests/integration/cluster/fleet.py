"""What the scaled-out integration tests share: the group client settings, the
recalibration config, the daemons of one fleet (and the single instance they are
compared with), the records of a stream, and readers of the calibrators topic and of
the owner's ``/status``."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
from kafka import KafkaConsumer, TopicPartition

from calmon import config as config_mod
from calmon.cluster.batch import JoinedBatch, Series, encode
from calmon.config import Config
from calmon.engine.buffer import SampleSet
from calmon.engine.records import ScoreKind
from calmon.engine.series import ALL
from tests.conftest import FAST_CLIENT
from tests.daemon_helpers import CalmonDaemon, write_config
from tests.recal_helpers import BASE_TS, Stream, dumps

# a group join takes ~3 s on Tansu with max_poll_interval_ms 10000 (~23 s by default)
GROUP_CLIENT = {**FAST_CLIENT, "max_poll_interval_ms": 10000, "session_timeout_ms": 6000,
                "heartbeat_interval_ms": 1000}
RECAL = {"enabled": True, "interval": "1s", "cooldown": "1h", "window": "1h",
         "min_samples": 2000, "method": "temperature"}
WINDOWS = {"windows": ["1h", "24h"]}


class FleetTopics(NamedTuple):
    preds: str
    labels: str
    joined: str
    calibrators: str
    group: str


def fleet_topics(kafka_topics: Callable[..., list[str]], cal_partitions: int = 1
                 ) -> FleetTopics:
    """A fleet's topics (predictions and labels of 4 partitions, the joined topic of 4,
    the calibrators topic) and a group id of its own."""
    preds, labels = kafka_topics(count=2, partitions=4)
    (joined,) = kafka_topics(count=1, partitions=4)
    (cal,) = kafka_topics(count=1, partitions=cal_partitions)
    return FleetTopics(preds, labels, joined, cal, f"calmon-test-{uuid.uuid4().hex[:8]}")


def instances(tmp_path: Path, bootstrap: str, preds_topic: str, labels_topic: str, *,
              group: str, joined_topic: str, cal_topic: str, count: int = 3,
              recalibration: dict[str, Any] | None = None) -> list[CalmonDaemon]:
    """``count`` daemons of one fleet (not started): instance i of count, one state
    dir and ``output_dir`` (``calibrators<i>``) each, config ``instance<i>.yaml``."""
    return [CalmonDaemon(write_config(
        tmp_path / f"instance{i}.yaml", bootstrap, preds_topic, labels_topic,
        kafka={"group_id": group, "instance": {"index": i, "count": count},
               "joined_topic": joined_topic, "calibrators_topic": cal_topic,
               "client": GROUP_CLIENT},
        metrics=WINDOWS,
        recalibration={**(recalibration or RECAL),
                       "output_dir": str(tmp_path / f"calibrators{i}")}),
        log=tmp_path / f"instance{i}.log") for i in range(count)]


def single_instance(tmp_path: Path, bootstrap: str, preds_topic: str, labels_topic: str,
                    cal_topic: str) -> CalmonDaemon:
    """One daemon on the whole stream, the fleet's reference (its own calibrators topic)."""
    return CalmonDaemon(write_config(
        tmp_path / "single.yaml", bootstrap, preds_topic, labels_topic,
        kafka={"calibrators_topic": cal_topic}, metrics=WINDOWS,
        recalibration={**RECAL, "output_dir": str(tmp_path / "single-calibrators")}),
        log=tmp_path / "single.log")


def owner_config(tmp_path: Path, bootstrap: str, *, group: str, joined_topic: str,
                 cal_topic: str, index: int = 0, suffix: str = "",
                 client: dict[str, Any] | None = None,
                 calibrators: dict[str, Any] | None = None, **kafka: Any) -> Config:
    """The config of instance ``index`` of a two-instance fleet, for an in-process
    owner (``calmon.cluster.service.Cluster``): its calibrators and state under
    ``tmp_path`` (named with ``suffix``); ``kafka``: more of that section."""
    return config_mod.from_dict({
        **({} if calibrators is None else {"calibrators": calibrators}),
        "kafka": {"bootstrap_servers": bootstrap, "group_id": group,
                  "instance": {"index": index, "count": 2}, "joined_topic": joined_topic,
                  "calibrators_topic": cal_topic, "client": client or GROUP_CLIENT,
                  **kafka},
        "metrics": WINDOWS,
        "recalibration": {**RECAL, "output_dir": str(tmp_path / f"calibrators{suffix}")},
        "state": {"dir": str(tmp_path / f"state{suffix}")}})


def records_of(preds_topic: str, labels_topic: str,
               s: Stream) -> list[tuple[str, bytes, bytes]]:
    """A stream's predictions and labels as (topic, key, value), keyed by id."""
    return ([(preds_topic, str(p["id"]).encode(), dumps(p)) for p in s.preds]
            + [(labels_topic, str(x["id"]).encode(), dumps(x)) for x in s.labels])


def documents(bootstrap: str, topic: str, timeout: float = 60.0) -> list[dict[str, Any]]:
    """Every committed record of the calibrators topic that is a document (read up to
    the end offsets; fails after ``timeout`` seconds short of them)."""
    c = KafkaConsumer(bootstrap_servers=bootstrap, isolation_level="read_committed",
                      enable_auto_commit=False, **FAST_CLIENT)
    try:
        tps = [TopicPartition(topic, p) for p in sorted(c.partitions_for_topic(topic) or ())]
        c.assign(tps)
        c.seek_to_beginning(*tps)
        ends = c.end_offsets(tps)
        out: list[dict[str, Any]] = []
        deadline = time.monotonic() + timeout
        while any(c.position(tp) < ends[tp] for tp in tps):
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"timed out after {timeout}s reading {topic} to its end offsets {ends}: "
                    f"at {[c.position(tp) for tp in tps]}, {len(out)} documents")
            for recs in c.poll(timeout_ms=300).values():
                for r in recs:
                    doc = json.loads(r.value)
                    if "model" in doc:
                        out.append(doc)
        return out
    finally:
        c.close()


def owner_view(daemons: list[CalmonDaemon]) -> tuple[int, dict[str, Any]] | None:
    """(index, the owner's status section) of the one instance owning ``ctr``."""
    found = []
    for i, d in enumerate(daemons):
        if not d.running:
            continue
        try:
            o = d.status().get("recalibration_owner") or {}
        except OSError:
            return None
        if "ctr" in o.get("models", {}):
            found.append((i, o))
    return found[0] if len(found) == 1 else None


def owner_alarmed(daemons: list[CalmonDaemon]) -> tuple[int] | None:
    """(index,) of ``ctr``'s owner once an owner logged its drift (a tuple: instance 0
    is an owner too, and 0 alone would read as "not yet")."""
    view = owner_view(daemons)
    if view is None:
        return None
    # (an early rebalance may have moved the model after its first alarm: then the
    # current owner's detector alarms on the same samples too)
    logged = any("recalibration drift of ctr/__all__" in d.log_tail(100_000) for d in daemons)
    return (view[0],) if logged else None


def input_backlog(bootstrap: str, kafka_topics: Callable[..., list[str]]) -> str:
    """A predictions topic of 2 partitions holding 3,000 records each: what the senders
    of ``joined_batches`` read (an owner refuses source offsets past a partition's end)."""
    from tests.daemon_helpers import Producer

    (topic,) = kafka_topics(count=1, partitions=2)
    with Producer(bootstrap) as p:
        p.send([(topic, None, b"{}", part) for part in (0, 1) for _ in range(3000)])
    return topic


def joined_batches(rng: np.random.Generator, predictions: str = "predictions"
                   ) -> list[tuple[bytes, bytes]]:
    """Two senders' joined batches of ``ctr``: 40 calibrated minutes, then (after a
    gap longer than the 1h window) 40 minutes of logits sharpened 2.5x; 3,000 each
    (from partition ``sender`` of ``predictions``, see ``input_backlog``)."""
    out = []
    for sender in (0, 1):
        for half, (t0, scale) in enumerate(((BASE_TS, 1.0), (BASE_TS + 7200.0, 2.5))):
            n = 1500
            ts = np.sort(t0 + rng.uniform(0.0, 2400.0, n))
            z = rng.normal(0.0, 1.5, n)
            y = (rng.random(n) < 1.0 / (1.0 + np.exp(-z))).astype(np.int32)
            x = SampleSet(ts, y, np.full(n, int(ScoreKind.LOGIT), np.int8), scale * z, 0)
            source = {(predictions, sender): (half * n, (half + 1) * n)}
            b = JoinedBatch("ctr", float(ts.max()), sender, source, [Series(ALL, 0, n, x)])
            out.append((b"ctr", encode(b)))
    return out
