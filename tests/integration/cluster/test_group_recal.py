"""Recalibration scaled out in group mode (contract §8 with §7): three members of one
consumer group on a 6-partition stream whose model drifts. Each task's joined samples go
to the joined topic in its checkpoint transaction; one member owns the model's
recalibration and publishes the drift's calibrator once, and the samples it took equal
the stream's labelled samples exactly, also after a member is killed with kill -9
mid-stream (its partitions, with the predictions still waiting for their labels, move to
the others)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from kafka import KafkaConsumer, TopicPartition

from calmon import config as config_mod
from calmon.io import changelog
from calmon.io.changelog import Changelog, ChangelogError
from tests.conftest import FAST_CLIENT
from tests.daemon_helpers import (
    CalmonDaemon,
    Producer,
    dumps,
    run_calmon,
    wait_until,
    write_config,
)
from tests.integration.cluster.fleet import GROUP_CLIENT, RECAL, WINDOWS, documents, owner_view
from tests.integration.cluster.group import dump, owned, task_write
from tests.recal_helpers import BASE_TS, Stream, binary_logit_stream

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PARTITIONS = 6
N = 3000  # calibrated, then as many drifted


def _members(tmp_path: Path, bootstrap: str, preds: str, labels: str, joined: str,
             cal: str, group: str) -> list[CalmonDaemon]:
    return [CalmonDaemon(write_config(
        tmp_path / f"m{i}.yaml", bootstrap, preds, labels,
        kafka={"group_id": group, "instance": "group", "joined_topic": joined,
               "calibrators_topic": cal, "client": GROUP_CLIENT},
        metrics=WINDOWS, state={"checkpoint_interval": "1s"},
        recalibration={**RECAL, "output_dir": str(tmp_path / f"calibrators{i}")}),
        log=tmp_path / f"m{i}.log") for i in range(3)]


def _records(topic: str, rows: list[dict]) -> list[tuple[str, bytes, bytes]]:
    return [(topic, str(r["id"]).encode(), dumps(r)) for r in rows]


def test_group_members_recalibrate_once_on_every_sample_through_a_kill(
        kafka_bootstrap: str, kafka_topics: Callable[..., list[str]], tmp_path: Path) -> None:
    preds_topic, labels_topic = kafka_topics(count=2, partitions=PARTITIONS)
    (joined_topic,) = kafka_topics(count=1, partitions=3)
    (cal_topic,) = kafka_topics(count=1, partitions=1)
    group = f"calmon-grecal-{tmp_path.name[-12:]}"
    rng = np.random.default_rng(37)
    stream = Stream()
    stream.extend(binary_logit_stream(rng, "ctr", N, BASE_TS, 2400.0, prefix="a"))
    t2 = BASE_TS + 2400.0 + 3600.0 + 1200.0  # the calibrated half is out of the 1h window
    stream.extend(binary_logit_stream(rng, "ctr", N, t2, 2400.0, scale=2.5, prefix="b"))
    labelled = len(stream.labels)  # every prediction has its label
    assert labelled == 2 * N
    # before the kill: the calibrated predictions and half their labels; the rest of
    # those labels (joining predictions that wait on whichever member holds their
    # partition) and the drifted half after it
    before = (_records(preds_topic, stream.preds[:N])
              + _records(labels_topic, stream.labels[:N // 2]))
    after = (_records(labels_topic, stream.labels[N // 2:N])
             + _records(preds_topic, stream.preds[N:]) + _records(labels_topic,
                                                                  stream.labels[N:]))
    daemons = _members(tmp_path, kafka_bootstrap, preds_topic, labels_topic, joined_topic,
                       cal_topic, group)
    live = list(daemons)

    def owner_samples() -> int | None:
        view = owner_view(live)
        return None if view is None else int(view[1]["models"]["ctr"]["samples"])

    try:
        for d in live:
            d.start(wait_ready=False)
        for d in live:
            d.wait_ready(timeout=90)
        # every member holds a share (one member alone holding all 6 is not the split:
        # it would read the whole stream and the others would have nothing to send)
        wait_until(lambda: (sorted(p for d in live for p in owned(d)) == list(range(PARTITIONS))
                            and all(owned(d) for d in live)) or None, 120,
                   "the 6 partitions split over 3 members")
        with Producer(kafka_bootstrap) as producer:
            producer.send(before)
        # the model has an owner once some member's checkpoint carried its samples
        wait_until(lambda: owner_samples() or None, 120, "an owner of ctr",
                   detail=lambda: dump(live))
        # a member that is not the owner, holding tasks with state: killed while the
        # stream goes on
        wait_until(lambda: (sorted(p for d in live for p in owned(d)) == list(range(PARTITIONS))
                            and all(owned(d) for d in live)) or None, 120, "the group settled")
        view = wait_until(lambda: owner_view(live), 60, "one owner of ctr")

        def committed_samples(d: CalmonDaemon) -> int:
            return int(d.status()["group"]["joined_sent"]["samples"])

        # its checkpoints committed joined samples: the takers go on from them
        victim = wait_until(lambda: next((d for i, d in enumerate(live) if i != view[0]
                                          and owned(d) and committed_samples(d)), None),
                            60, "a checkpoint of a member that is not the owner",
                            detail=lambda: dump(live))
        taken = owned(victim)
        victim.kill()
        live = [d for d in live if d is not victim]
        with Producer(kafka_bootstrap) as producer:
            producer.send(after)
        wait_until(lambda: sorted(p for d in live for p in owned(d)) == list(range(PARTITIONS))
                   or None, 180, f"the others taking {taken}", detail=lambda: dump(live))
        # the takers went on from the victim's checkpoints, not from nothing
        moved = [t for d in live for t in d.status()["group"]["tasks"]
                 if t["partition"] in taken]
        assert moved and all(t["restored_from"] for t in moved), dump(live)

        # every labelled sample reaches the owner once: the count climbs to the stream's
        # and not past it
        got = wait_until(lambda: (lambda n: n if n is not None and n >= labelled else None)(
            owner_samples()), 180, "the owner holding every labelled sample",
            detail=lambda: (owner_samples(), dump(live)))
        assert got == labelled
        # and the members' joined counters (task state, restored with it) add up to it
        # once no task is in flight: a member read in a rebalance (loaded machine: a
        # poll past max_poll_interval_ms) holds none of its tasks for that moment
        wait_until(lambda: sum(d.status()["counters"]["joined"] for d in live) == labelled
                   or None, 120, "the members' joined counters adding up to the stream",
                   detail=lambda: ([d.status()["counters"] for d in live], dump(live)))

        # the drift is published once, by the one owner
        wait_until(lambda: documents(kafka_bootstrap, cal_topic) or None, 180,
                   "a published calibrator on the topic")
        docs = documents(kafka_bootstrap, cal_topic)
        assert Counter((d["model"], d["segment"], d["version"]) for d in docs) == {
            ("ctr", "__all__", 1): 1}, docs
        fitted = int(docs[0]["fit"]["samples"]) + int(docs[0]["fit"]["holdout_samples"])
        assert fitted >= RECAL["min_samples"]
        # the temperature undoes the 2.5x sharpening (1/2.5 from the data's construction)
        assert 1.8 < float(docs[0]["params"]["temperature"]) < 3.4, docs[0]["params"]

        def settled() -> tuple[dict, list[float]] | None:
            """(the owner's view, each member's owned models) once one member owns ctr
            (none while the recalibration group rebalances) and holds every sample (a
            new owner rebuilds from the joined topic)"""
            view = owner_view(live)
            if view is None or view[1]["models"]["ctr"]["samples"] < labelled:
                return None
            return view[1], [sum(d.scrape().get("calmon_recalibration_owned_models",
                                                {}).values()) for d in live]

        # still exact once the publish came (checks and checkpoints went on meanwhile)
        view, owners = wait_until(settled, 120, "one owner holding every sample",
                                  detail=lambda: dump(live))
        assert view["models"]["ctr"]["samples"] == labelled
        assert view["bad_batches"] == 0 and view["duplicates"] == 0, view
        assert sorted(owners) == [0, 1], owners
        # what the survivors' checkpoints committed, with the victim's, is what the owner
        # took: at least the survivors' share went through them
        assert all(committed_samples(d) > 0 for d in live)

        # list and rollback act on the topic's history from a member that is not the
        # owner: the owner republishes, once
        other = next(d for d, n in zip(live, owners, strict=True) if not n)
        listed = run_calmon("calibrators", "list", "--json", "-c", str(other.config))
        assert listed.returncode == 0, listed.stderr
        rows = {(e["model"], e["segment"]): e for e in json.loads(listed.stdout)}
        assert rows[("ctr", "__all__")]["versions"] == [1]
        rolled = run_calmon("calibrators", "rollback", "--model", "ctr", "--to", "1",
                            "-c", str(other.config))
        assert rolled.returncode == 0, rolled.stderr
        assert "republished as v2 by its owner" in rolled.stdout
        docs = documents(kafka_bootstrap, cal_topic)
        assert [(d["version"], d.get("rollback_of")) for d in docs] == [(1, None), (2, 1)]
        assert docs[1].get("request_id"), docs[1]  # the owner's, asked through the topic
    finally:
        for d in daemons:
            d.stop()
    for d in live:
        assert "Traceback" not in d.log_tail(100_000)


@pytest.mark.brokers("kafka")  # Tansu takes a stale generation's offsets and serves aborts
def test_a_member_the_group_moved_on_from_writes_no_joined_batch(
        kafka_bootstrap: str, kafka_topics: Callable[..., list[str]], tmp_path: Path) -> None:
    """The joined batches ride in the checkpoint's transaction: a member whose generation
    is gone (a zombie) has the whole transaction refused, batches included."""
    preds_topic, joined_topic = kafka_topics(count=2, partitions=2)
    group = f"calmon-grecal-{tmp_path.name[-12:]}"
    cfg = config_mod.from_dict({
        "kafka": {"bootstrap_servers": kafka_bootstrap, "group_id": group,
                  "instance": "group", "predictions_topic": preds_topic,
                  "labels_topic": f"{preds_topic}-labels", "joined_topic": joined_topic,
                  "calibrators_topic": f"{joined_topic}-cal", "client": GROUP_CLIENT}},
        env={})
    changelog.ensure_topic(cfg.kafka, 2)
    settings = dict(group_id=group, bootstrap_servers=kafka_bootstrap,
                    enable_auto_commit=False, auto_offset_reset="earliest", **GROUP_CLIENT)
    first = KafkaConsumer(preds_topic, **settings)
    second: KafkaConsumer | None = None
    log = Changelog(cfg.kafka)
    try:
        wait_until(lambda: (first.poll(200) is not None and first.assignment()) or None, 60,
                   "the first member assigned")
        stale = first.group_metadata()
        extra = [(joined_topic, b"ctr", b"batch of the zombie", [])]
        second = KafkaConsumer(preds_topic, **settings)  # a rebalance: a new generation

        def moved_on() -> bool:
            assert second is not None
            second.poll(200)
            first.poll(200)
            return bool(second.assignment()) and (
                first.group_metadata().generation_id != stale.generation_id)

        wait_until(moved_on, 60, "the group's next generation")
        with pytest.raises(ChangelogError):
            log.commit({0: task_write(cfg, 0)}, {0: 0}, stale, extra=extra)
        fresh = first.group_metadata()
        part = next(tp.partition for tp in first.assignment())
        log.commit({part: task_write(cfg, 0)}, {part: 0}, fresh,
                   extra=[(joined_topic, b"ctr", b"batch of the member", [])])
        reader = KafkaConsumer(bootstrap_servers=kafka_bootstrap, enable_auto_commit=False,
                               isolation_level="read_committed", **FAST_CLIENT)
        try:
            tps = [TopicPartition(joined_topic, p) for p in (0, 1)]
            reader.assign(tps)
            reader.seek_to_beginning(*tps)
            seen: list[bytes] = []
            ends = reader.end_offsets(tps)  # both transactions are over: aborted, committed

            def read_to_end() -> bool:
                seen.extend(r.value for rs in reader.poll(300).values() for r in rs)
                return all(reader.position(tp) >= ends[tp] for tp in tps)

            wait_until(read_to_end, 60, "the joined topic read to its end")
            assert seen == [b"batch of the member"]
        finally:
            reader.close()
    finally:
        log.close()
        first.close()
        if second is not None:
            second.close()
