"""Scaled out through real daemons (contract §7): three instances on one 4-partition
drifting stream, one owner per model. The drift's post-change samples clear
``min_samples`` only when every instance's share is counted; it is published once, by
the owner, fitted on more than any one instance's samples; the calibrators topic holds
exactly one document per (model, segment, version)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest
from scipy.special import expit

from calmon.calibrators import CalibratorWatcher
from calmon.recal.registry import Registry
from tests import oracle
from tests.conftest import FAST_CLIENT
from tests.daemon_helpers import (
    Producer,
    run_calmon,
    series,
    wait_until,
)
from tests.integration.cluster.fleet import (
    RECAL,
    documents,
    fleet_topics,
    instances,
    records_of,
    single_instance,
)
from tests.recal_helpers import (
    BASE_TS,
    Stream,
    arrays,
    binary_logit_stream,
    dumps,
    window_mask,
)

pytestmark = pytest.mark.integration

def test_three_instances_publish_one_drift_once_fitted_across_them(
        kafka_bootstrap: str, kafka_topics: Callable[..., list[str]], tmp_path: Path) -> None:
    preds_topic, labels_topic, joined_topic, cal_topic, group = fleet_topics(
        kafka_topics, cal_partitions=2)
    rng = np.random.default_rng(26)
    stream = Stream()
    stream.extend(binary_logit_stream(rng, "ctr", 3000, BASE_TS, 2400.0, prefix="a"))
    t2 = BASE_TS + 2400.0 + 3600.0 + 1200.0  # the calibrated half is out of the 1h window
    drifted = binary_logit_stream(rng, "ctr", 3000, t2, 2400.0, scale=2.5, prefix="b")
    stream.extend(drifted)
    records = records_of(preds_topic, labels_topic, stream)
    with Producer(kafka_bootstrap) as producer:
        sent = producer.send(records)
    # independently of calmon: each instance's share of the drifted samples (p % 3)
    drifted_ids = {p["id"] for p in drifted.preds}
    share = Counter(md.partition % 3 for md, (_t, key, _v) in zip(sent, records, strict=True)
                    if md.topic == preds_topic and key.decode() in drifted_ids)
    assert sum(share.values()) == 3000 and max(share.values()) < RECAL["min_samples"]

    # the same stream through one instance, for comparison (its own calibrators topic)
    (single_cal,) = kafka_topics(count=1, partitions=1)
    single = single_instance(tmp_path, kafka_bootstrap, preds_topic, labels_topic, single_cal)
    daemons = instances(tmp_path, kafka_bootstrap, preds_topic, labels_topic, group=group,
                        joined_topic=joined_topic, cal_topic=cal_topic)
    try:
        single.start(wait_ready=False)
        for d in daemons:
            d.start(wait_ready=False)
        for d in daemons:
            d.wait_ready()
        joined = wait_until(
            lambda: (lambda n: n if n == 6000 else None)(
                sum(d.counters()["joined"] for d in daemons)), 120, "every sample joined")
        assert joined == 6000

        wait_until(lambda: documents(kafka_bootstrap, cal_topic) or None, 180,
                   "a published calibrator on the topic")
        # one owner: the others never published; the owner once (cooldown 1h)
        docs = documents(kafka_bootstrap, cal_topic)
        keys = Counter((d["model"], d["segment"], d["version"]) for d in docs)
        assert keys == {("ctr", "__all__", 1): 1}, keys
        doc = docs[0]
        # fitted (and held out) on more post-change samples than any instance joined
        fitted = int(doc["fit"]["samples"]) + int(doc["fit"]["holdout_samples"])
        assert fitted >= RECAL["min_samples"] and fitted > max(share.values()), fitted
        owned = [d.scrape().get("calmon_recalibration_owned_models", {}) for d in daemons]
        assert sorted(sum(v.values()) for v in owned) == [0, 0, 1], owned
        # the temperature undoes the 2.5x sharpening (1/2.5 from the data's construction)
        assert 1.8 < float(doc["params"]["temperature"]) < 3.4, doc["params"]

        # what one instance decides on the whole stream: the same drift, a fit as large
        # and a temperature alike
        wait_until(lambda: documents(kafka_bootstrap, single_cal) or None, 180,
                   "the single instance's publish")
        (one,) = documents(kafka_bootstrap, single_cal)
        assert one["version"] == 1 and one["trigger"] == doc["trigger"]
        # both date the change in the gap between the calibrated half and the drifted
        # one, all the data can tell (no sample lies in it: any point there explains them
        # alike), to the grid's resolution; where in the gap depends on each one's grid
        # of candidate times, thinned by the age its checks saw, so not alike
        for change_ts in (float(one["change_ts"]), float(doc["change_ts"])):
            assert BASE_TS + 2400.0 - 600.0 <= change_ts <= t2 + 600.0, change_ts
        one_fit = int(one["fit"]["samples"]) + int(one["fit"]["holdout_samples"])
        assert one_fit >= RECAL["min_samples"]
        assert abs(float(one["params"]["temperature"]) - float(doc["params"]["temperature"])
                   ) < 0.25 * float(one["params"]["temperature"])

        # the owner's calibrated ECE (§6, §7): only samples predicted after fitted_at,
        # from every instance; the others export none for the model
        fitted_at = datetime.strptime(doc["fitted_at"], "%Y-%m-%dT%H:%M:%SZ").replace(
            tzinfo=UTC).timestamp()
        after = binary_logit_stream(rng, "ctr", 600, fitted_at + 1.0, 600.0, scale=2.5,
                                    prefix="c")
        with Producer(kafka_bootstrap) as producer:
            producer.send([(preds_topic, str(q["id"]).encode(), dumps(q)) for q in after.preds]
                          + [(labels_topic, str(q["id"]).encode(), dumps(q))
                             for q in after.labels])
        ts, z, y, _ = arrays(after, "ctr")
        now = float(ts.max())  # the latest prediction of ctr anywhere
        fresh = window_mask(ts, now, 3600.0) & (ts > fitted_at)
        probs = np.clip(expit(z[fresh] / float(doc["params"]["temperature"])
                              + float(doc["params"]["bias"])), 1e-7, 1 - 1e-7)
        owner = daemons[next(i for i, v in enumerate(owned) if sum(v.values()))]

        def calibrated() -> tuple[float] | None:  # a tuple: an ECE of 0 is an answer too
            sc = owner.scrape()
            n = series(sc, "calmon_calibrated_samples", "model", "segment", "window").get(
                ("ctr", "__all__", "1h"))
            if n != fresh.sum():
                return None
            return (series(sc, "calmon_calibrated_ece", "model", "segment", "window")[
                ("ctr", "__all__", "1h")],)

        (value,) = wait_until(calibrated, 60, "the owner's calibrated ECE of the new samples")
        assert value == pytest.approx(oracle.ece(probs, y[fresh].astype(float), 15), abs=1e-9)
        for d in daemons:
            if d is not owner:
                assert ("ctr", "1h") not in series(d.scrape(), "calmon_calibrated_samples",
                                                   "model", "window")

        # list and rollback act on the topic's history, from an instance that is not
        # the owner: the owner republishes, once
        other = next(i for i, v in enumerate(owned) if not sum(v.values()))
        cfg = str(tmp_path / f"instance{other}.yaml")
        listed = run_calmon("calibrators", "list", "--json", "-c", cfg)
        assert listed.returncode == 0, listed.stderr
        rows = {(e["model"], e["segment"]): e for e in json.loads(listed.stdout)}
        assert rows[("ctr", "__all__")]["live"] == 1
        assert rows[("ctr", "__all__")]["versions"] == [1]
        rolled = run_calmon("calibrators", "rollback", "--model", "ctr", "--to", "1",
                            "-c", cfg)
        assert rolled.returncode == 0, rolled.stderr
        assert "republished as v2" in rolled.stdout
        docs = documents(kafka_bootstrap, cal_topic)
        assert [(d["version"], d.get("rollback_of")) for d in docs] == [(1, None), (2, 1)]
        assert docs[1]["params"] == doc["params"]
        # every instance's output_dir is a local view of the whole topic
        def viewed() -> bool:
            for i in range(3):
                live = Registry(tmp_path / f"calibrators{i}").live("ctr", "__all__")
                if live is None or live.version != 2:
                    return False
            return True

        wait_until(viewed, 60, "v2 in every instance's output_dir")
        # serving code's watcher (read_committed) serves the latest, markers ignored
        watcher = CalibratorWatcher(topic=cal_topic, bootstrap_servers=kafka_bootstrap,
                                    min_interval=0.0, consumer_settings=dict(FAST_CLIENT))
        try:
            def served() -> bool:
                watcher.refresh(force=True)
                return watcher.version("ctr") == 2

            wait_until(served, 60, "the watcher serving v2")
        finally:
            watcher.close()
    finally:
        for d in [*daemons, single]:
            d.stop()
    for d in daemons:
        assert "Traceback" not in d.log_tail(100_000)
