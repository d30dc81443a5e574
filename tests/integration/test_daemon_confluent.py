"""``kafka.library: confluent`` end to end: the daemon reading (and dead-lettering)
through librdkafka ends in the same state as the same daemon on kafka-python and as
``calmon replay`` over the same records, exactly once across a restart from its
checkpoint (also when that restart is on kafka-python), with every invalid record
forwarded unchanged under its own source."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from calmon.io.dead_letter import REASON_HEADER, SOURCE_HEADER
from tests.conftest import consume
from tests.daemon_helpers import (
    COUNTER_KEYS,
    CalmonDaemon,
    Producer,
    assert_gauges_match_replay,
    end_positions,
    interleave,
    load_config,
    make_dataset,
    replay_json,
    window_gauges,
    write_config,
    write_jsonl,
)

pytest.importorskip("confluent_kafka", reason="calmon[fast] (confluent-kafka) missing")
pytestmark = pytest.mark.integration

N = 900
BAD = 30


def test_confluent_daemon_matches_kafka_python_and_replay(
    kafka_bootstrap: str, kafka_topics: Callable[..., list[str]], tmp_path: Path
) -> None:
    preds_topic, labels_topic, dlq = kafka_topics(count=3, partitions=4)
    preds, labels = make_dataset(N, seed=91)
    records = interleave(preds, labels, preds_topic, labels_topic, seed=92)
    # invalid records on both topics, at random places in the stream
    rng = np.random.default_rng(93)
    for i in range(BAD):
        bad = (labels_topic if i % 3 == 0 else preds_topic, b"bad-%d" % i,
               b"not json %d" % i if i % 2 else b'{"id": "cut-%d", "prob": 0.' % i)
        records.insert(int(rng.integers(len(records) + 1)), bad)
    half = len(records) // 2
    is_bad = [r[1].startswith(b"bad-") for r in records]

    confluent = write_config(tmp_path / "confluent.yaml", kafka_bootstrap, preds_topic,
                             labels_topic, kafka={"library": "confluent", "dead_letter_topic": dlq})
    reference = write_config(tmp_path / "kafka-python.yaml", kafka_bootstrap, preds_topic,
                             labels_topic, kafka={"library": "kafka-python"})
    daemon = CalmonDaemon(confluent)
    with Producer(kafka_bootstrap) as producer:
        with daemon.start():
            first = producer.send(records[:half])
            daemon.wait_positions(end_positions(first))
        # SIGTERM wrote the last checkpoint; the second run starts from it
        with daemon.start():
            rest = producer.send(records[half:])
            sent = first + rest
            daemon.wait_positions(end_positions(sent))
            daemon.wait_ready()
            st, sc = daemon.status(), daemon.scrape()
    with CalmonDaemon(reference) as other:
        other.wait_positions(end_positions(sent))
        st_ref, sc_ref = other.status(), other.scrape()
    # the confluent run's checkpoint restores under kafka-python. Same group: had the
    # state not been restored, the committed offsets (at the end) would leave it empty
    group = load_config(confluent)["kafka"]["group_id"]
    switched = write_config(tmp_path / "switched.yaml", kafka_bootstrap, preds_topic,
                            labels_topic, kafka={"library": "kafka-python", "group_id": group},
                            state={"dir": str(tmp_path / "confluent-state")})
    with CalmonDaemon(switched) as again:
        st_again = again.wait_positions(end_positions(sent))

    want = {"predictions": N, "labels": N, "joined": N, "invalid": BAD, "expired": 0,
            "duplicates": 0}
    assert {k: st["counters"][k] for k in COUNTER_KEYS} == want
    assert {k: st_ref["counters"][k] for k in COUNTER_KEYS} == want
    assert {k: st_again["counters"][k] for k in COUNTER_KEYS} == want
    assert st["positions"] == st_ref["positions"]
    assert window_gauges(sc) == window_gauges(sc_ref)
    replay = replay_json(confluent, write_jsonl(tmp_path / "p.jsonl", preds),
                         write_jsonl(tmp_path / "l.jsonl", labels))
    assert assert_gauges_match_replay(sc, replay, tol=0.0) > 0

    # the librdkafka producer's dead letters: original bytes, source = topic/partition/offset
    expected = {f"{md.topic}/{md.partition}/{md.offset}": r[2]
                for r, md, bad in zip(records, sent, is_bad) if bad}
    letters = consume(kafka_bootstrap, dlq, BAD, timeout=30)
    got = {}
    for r in letters:
        headers = dict(r.headers)
        assert set(headers) == {REASON_HEADER, SOURCE_HEADER}
        assert headers[REASON_HEADER]
        got[headers[SOURCE_HEADER].decode()] = r.value
    assert got == expected
    assert len(consume(kafka_bootstrap, dlq, BAD + 1, timeout=2, partial=True)) == BAD  # none twice
