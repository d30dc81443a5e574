"""Hostile records on the internal topics of a scaled-out fleet (issue 35, items 4 and 6),
on a real broker: a record on ``calibrators_topic`` that is no valid, signed document
writes nothing into ``output_dir`` and stops no takeover; a catch-up larger than one
Kafka record still reaches the owner."""

from __future__ import annotations

import json
import time
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from calmon.calibrators.signing import Signer, keygen
from calmon.cluster.service import Cluster
from tests.daemon_helpers import (
    CalmonDaemon,
    Producer,
    produce_all,
    series,
    wait_until,
    write_config,
)
from tests.integration.cluster.fleet import GROUP_CLIENT, RECAL, owner_config, records_of
from tests.recal_helpers import BASE_TS, binary_logit_stream

pytestmark = pytest.mark.integration


def doc(version: int, temperature: float = 1.25, model: str = "ctr") -> dict[str, Any]:
    return {"model": model, "segment": "__all__", "version": version,
            "method": "temperature", "input": "logit",
            "params": {"temperature": temperature}}


def test_unsigned_and_out_of_range_documents_write_nothing_and_stop_no_takeover(
        kafka_bootstrap: str, kafka_topics: Callable[..., list[str]], tmp_path: Path) -> None:
    (joined_topic,) = kafka_topics(count=1, partitions=2)
    (cal_topic,) = kafka_topics(count=1, partitions=1)
    private, public = keygen()
    signer = Signer(private, "k1")
    good = json.dumps(signer.sign(doc(1)), indent=2).encode()
    hostile = [  # (key, value, the reason it is refused under)
        # 301 digits: the file name that stopped every takeover
        (b"ctr/__all__", json.dumps(doc(10**300)).encode(), "bad_document"),
        (b"ctr/__all__", json.dumps(doc(2)).encode(), "bad_signature"),  # unsigned
        (b"ctr/__all__", json.dumps(signer.sign(doc(3, temperature=1e6))).encode(),
         "bad_document"),  # signed, but out of range
        (b"other/__all__", good, "bad_key"),  # a valid document under another key
        (b"ctr/__all__", b"{\"model\": \"ctr\", \"model\": \"x\"}", "not_json"),  # twice
    ]
    with Producer(kafka_bootstrap) as p:
        p.send([(cal_topic, k, v) for k, v, _ in hostile] + [(cal_topic, b"ctr/__all__", good)])
    out = tmp_path / "calibrators"
    cfg = owner_config(tmp_path, kafka_bootstrap, group=f"calmon-test-{uuid.uuid4().hex[:8]}",
                       joined_topic=joined_topic, cal_topic=cal_topic, calibrators={
                           "signing_key": private, "key_id": "k1",
                           "verify_keys": [{"id": "k1", "public_key": public}]})
    dead: list[tuple[bytes | None, str, str]] = []
    cluster = Cluster(cfg, None, lambda v, r, s: dead.append((v, r, s)))
    try:
        cluster.start()
        # the only instance takes both joined-topic partitions over
        wait_until(lambda: cluster.owned == frozenset({0, 1}) or None, 45,
                   "the takeover of both joined-topic partitions")
        want = Counter(r for _, _, r in hostile)
        wait_until(lambda: len(dead) == len(hostile) or None, 60,
                   "every hostile record refused by the follower")
        got = {r: n for (t, r), n in cluster.invalid().items() if t == cal_topic and n}
        assert got == want
        assert sorted((v, r) for v, r, _ in dead) == sorted((v, r) for _, v, r in hostile)
        assert all(s.startswith(f"{cal_topic}/0/") for _, _, s in dead)
        # output_dir holds the valid document, and nothing of the others
        files = {str(f.relative_to(out)): f.read_bytes() for f in out.rglob("*")
                 if f.is_file()}
        assert len(files) == 2 and set(files.values()) == {good}, sorted(files)
        assert {Path(f).name for f in files} == {"v1.json", "latest.json"}
    finally:
        cluster.stop()


N_BIG, N_SMALL = 120_000, 50


@pytest.mark.slow
def test_a_catch_up_larger_than_a_record_reaches_the_owner(
        kafka_bootstrap: str, kafka_topics: Callable[..., list[str]], tmp_path: Path) -> None:
    """120,000 samples of one model joined within one checkpoint: the sender's batch
    (the newest 50,000 of its ring, 21 bytes each) is over the producer's 1 MiB, and
    before it was cut in parts no batch of the instance ever reached the owner."""
    preds, labels = kafka_topics(count=2, partitions=1)
    (joined_topic,) = kafka_topics(count=1, partitions=2)
    (cal_topic,) = kafka_topics(count=1, partitions=1)
    rng = np.random.default_rng(35)
    big = binary_logit_stream(rng, "big", N_BIG, BASE_TS, 3600.0)
    small = binary_logit_stream(rng, "small", N_SMALL, BASE_TS, 3600.0)
    produce_all(kafka_bootstrap, records_of(preds, labels, big) + records_of(preds, labels, small))
    d = CalmonDaemon(write_config(
        tmp_path / "instance0.yaml", kafka_bootstrap, preds, labels,
        kafka={"instance": {"index": 0, "count": 2}, "joined_topic": joined_topic,
               "calibrators_topic": cal_topic, "client": GROUP_CLIENT},
        metrics={"windows": ["1h", "24h"]},
        recalibration={**RECAL, "min_samples": 1_000_000,
                       "output_dir": str(tmp_path / "calibrators")},
        # the whole backlog joins before the first checkpoint sends it
        state={"checkpoint_interval": "30s"}), log=tmp_path / "instance0.log")

    def owner_holds() -> dict[str, Any] | None:
        models = d.status().get("recalibration_owner", {}).get("models", {})
        counts = {m: models.get(m, {}).get("samples") for m in ("big", "small")}
        return counts if counts == {"big": N_BIG, "small": N_SMALL} else None

    with d:
        wait_until(lambda: d.counters()["joined"] == N_BIG + N_SMALL or None, 300,
                   "the backlog joined")
        wait_until(owner_holds, 60, "both models' samples at the owner")
        owner = d.status()["recalibration_owner"]
        assert owner["bad_batches"] == 0 and owner["pending_batches"] == 0
        # the internal topics' refusals are exported under their names, from 0
        invalid = series(d.scrape(), "calmon_invalid_records_total", "topic", "reason")
        for reason in ("bad_batch", "not_utf8", "bad_source", "bad_key", "bad_signature"):
            assert invalid[(joined_topic, reason)] == 0
        for reason in ("not_json", "bad_document", "bad_signature", "bad_key"):
            assert invalid[(cal_topic, reason)] == 0


def test_the_input_end_bounds_a_claimed_source_offset(
        kafka_bootstrap: str, kafka_topics: Callable[..., list[str]]) -> None:
    """What an owner takes as the end of an input partition: every offset a sender
    read (the true end, though some brokers answer less), never an offset of 2**62."""
    from calmon.cluster.reach import InputEnds
    from tests.conftest import FAST_CLIENT
    from tests.hostile_batches import send_one_batch

    (topic,) = kafka_topics(count=1, partitions=2)
    offsets = send_one_batch(kafka_bootstrap, topic, 0, [b"a"] * 30)
    offsets += send_one_batch(kafka_bootstrap, topic, 0, [b"b"] * 20)
    true_end = max(offsets) + 1  # 50: what a consumer's position reaches
    ends = InputEnds({"bootstrap_servers": kafka_bootstrap, **FAST_CLIENT})
    try:
        ends.round = time.monotonic()  # a poll of the joined topic begins
        # a small claim is bounded by the broker's answer (Tansu's falls short of the
        # true end); a larger one in the same poll is still bounded by the true end
        assert ends.end(topic, 0, 10) in (true_end, max(offsets[:30]) + 2)
        assert ends.end(topic, 0, true_end) == true_end
        assert ends.end(topic, 0, 2**62) == true_end  # asked in this poll already
        ends.round = time.monotonic()  # a new poll: the end is asked again
        assert ends.end(topic, 0, 2**62) == true_end
        assert ends.end(topic, 1, 5) == 0  # nothing was ever written there
        assert ends.end(topic, 7, 5) == 0  # no such partition
    finally:
        ends.close()
