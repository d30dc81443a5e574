"""Group mode (contract §8) reads past a record batch that cannot be decoded as the
static mode does (hostile/test_hostile_io.py): with either library the batch is
skipped by offset, counted once as ``bad_batch``, dead-lettered, and its partition
reads on; the checkpoint's offsets move past it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from calmon.io.dead_letter import REASON_HEADER, SOURCE_HEADER
from tests.conftest import consume
from tests.daemon_helpers import (
    CalmonDaemon,
    Producer,
    dumps,
    end_positions,
    http_get,
    make_dataset,
    series,
    wait_until,
    write_config,
)
from tests.hostile_batches import gzip_payload, send_one_batch
from tests.integration.cluster.fleet import GROUP_CLIENT
from tests.integration.cluster.group import WINDOWS, committed, dump, owned

pytestmark = pytest.mark.integration

N = 80


# a batch that cannot be decoded only reaches a consumer through a broker that stores
# it unchecked; Apache Kafka refuses it at produce (io/test_compressed_batches.py)
@pytest.mark.brokers("tansu")
@pytest.mark.parametrize("library", ["kafka-python", "confluent"])
def test_a_bad_batch_is_skipped_counted_and_dead_lettered_in_group_mode(
        kafka_bootstrap: str, kafka_topics: Callable[..., list[str]], tmp_path: Path,
        library: str) -> None:
    if library == "confluent":
        pytest.importorskip("confluent_kafka")
    preds_t, labels_t, dlq = kafka_topics(count=3, partitions=2)
    group = f"calmon-badbatch-{tmp_path.name[-12:]}"
    daemon = CalmonDaemon(write_config(
        tmp_path / "m.yaml", kafka_bootstrap, preds_t, labels_t,
        kafka={"group_id": group, "instance": "group", "client": GROUP_CLIENT,
               "library": library, "dead_letter_topic": dlq},
        metrics=WINDOWS, state={"checkpoint_interval": "1s"}), log=tmp_path / "m.log")
    preds, labels = make_dataset(N, seed=3701)
    half = N // 2

    def rows(items: list[dict], topic: str) -> list[tuple[str, bytes, bytes]]:
        return [(topic, str(r["id"]).encode(), dumps(r)) for r in items]

    with daemon.start():
        wait_until(lambda: owned(daemon) == [0, 1] or None, 90, "both tasks running",
                   detail=lambda: dump([daemon]))
        with Producer(kafka_bootstrap) as producer:
            sent = producer.send(rows(preds[:half], preds_t))
            with gzip_payload(b"garbage, not gzip" * 4):
                bad = send_one_batch(kafka_bootstrap, preds_t, 1, [b"y" * 400] * 3,
                                     compression_type="gzip")
            sent += producer.send(rows(preds[half:], preds_t) + rows(labels, labels_t))
        ends = end_positions(sent)
        wait_until(lambda: daemon.status()["counters"].get("joined") == N or None, 90,
                   "every pair joined, partition 1 read past the bad batch",
                   detail=lambda: dump([daemon]))
        want = {p: ends[f"{preds_t}/{p}"] for p in (0, 1)}
        wait_until(lambda: committed(kafka_bootstrap, group, preds_t) == want or None, 60,
                   "a checkpoint past the bad batch", detail=lambda: dump([daemon]))
        assert http_get(daemon.port, "/readyz")[0] == 200
        sc = daemon.scrape()
    assert bad == list(range(bad[0], bad[0] + 3)) and bad[-1] < want[1]
    invalid = {k: v for k, v in series(sc, "calmon_invalid_records_total", "topic",
                                       "reason").items() if v}
    assert invalid == {("predictions", "bad_batch"): 1.0}  # once, however many fetches
    [letter] = consume(kafka_bootstrap, dlq, 1, timeout=30)
    headers = dict(letter.headers)
    assert headers[SOURCE_HEADER].decode() == f"{preds_t}/1/{bad[0]}"
    assert headers[REASON_HEADER].decode() == "bad_batch"
