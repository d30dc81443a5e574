"""1,000 invalid records of many kinds among valid ones: ``calmon run`` stays up,
counts each exactly by topic and reason, counts the valid ones exactly, and
forwards every invalid record unchanged to the dead-letter topic with the
``calmon-reason`` and ``calmon-source`` headers."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from calmon.engine.records import REASONS
from calmon.io.dead_letter import REASON_HEADER, SOURCE_HEADER
from tests.conftest import consume
from tests.daemon_helpers import (
    BASE_TS,
    CalmonDaemon,
    Producer,
    dumps,
    end_positions,
    http_get,
    interleave,
    make_dataset,
    series,
    write_config,
)

pytestmark = pytest.mark.integration

N_VALID = 600
BIG = 2 * 1024 * 1024  # over kafka.max_record_bytes (default 1 MiB)


def invalid_records() -> list[tuple[str, str, bytes | None, bytes | None]]:
    """(topic kind, reason, key, value): 1,000 records breaking the contract in 13 ways.
    Labels out of range get a valid binary prediction each (returned separately)."""
    out: list[tuple[str, str, bytes | None, bytes | None]] = []

    def add(kind: str, reason: str, n: int, make: Callable[[int], bytes | None]) -> None:
        for i in range(n):
            out.append((kind, reason, f"bad-{reason}-{i}".encode(), make(i)))

    ts = BASE_TS + 100.0
    add("p", "not_json", 100, lambda i: b'{"id": "x%d", "model": ' % i)
    add("p", "not_utf8", 100, lambda i: b'{"id": "\xff\xfe%d", "model": "m"}' % i)
    add("p", "not_object", 100, lambda i: b"[%d, 0.5]" % i)
    add("p", "missing_id", 100, lambda i: dumps({"model": "ctr-prob", "ts": ts, "prob": 0.5}))
    add("p", "not_finite", 100,
        lambda i: b'{"id": "nan-%d", "model": "ctr-prob", "ts": %f, "prob": NaN}' % (i, ts))
    add("p", "prob_out_of_range", 100,
        lambda i: dumps({"id": f"big-{i}", "model": "ctr-prob", "ts": ts, "prob": 1.5}))
    add("p", "probs_not_normalized", 100,
        lambda i: dumps({"id": f"norm-{i}", "model": "intent4", "ts": ts,
                         "probs": [0.5, 0.3, 0.3, 0.1]}))
    add("p", "oversize", 3,
        lambda i: dumps({"id": f"huge-{i}", "model": "ctr-prob", "ts": ts, "prob": 0.5,
                         "pad": "x" * BIG}))
    add("p", "missing_model", 40, lambda i: dumps({"id": f"nm-{i}", "ts": ts, "prob": 0.5}))
    add("p", "multiple_scores", 40,
        lambda i: dumps({"id": f"two-{i}", "model": "ctr-prob", "ts": ts, "prob": 0.5,
                         "logit": 0.0}))
    add("p", "empty", 20, lambda i: None)  # a tombstone
    add("l", "bad_label", 97, lambda i: dumps({"id": f"bl-{i}", "label": [1]}))
    # a label 2 for a binary prediction: only wrong once it meets its prediction
    add("l", "label_out_of_range", 100,
        lambda i: dumps({"id": f"oor-{i}", "label": 2, "ts": ts + 5}))
    return out


def test_invalid_records_are_counted_and_dead_lettered(
    kafka_bootstrap: str, kafka_topics: Callable[..., list[str]], tmp_path: Path
) -> None:
    # the topic config lets a real Kafka ($CALMON_TEST_BOOTSTRAP) take 2 MB records
    preds_topic, labels_topic, dlq = kafka_topics(
        count=3, partitions=4, configs={"max.message.bytes": str(16 * 1024 * 1024)})
    cfg = write_config(tmp_path / "calmon.yaml", kafka_bootstrap, preds_topic, labels_topic,
                       kafka={"dead_letter_topic": dlq})
    preds, labels = make_dataset(N_VALID, seed=51)
    valid = interleave(preds, labels, preds_topic, labels_topic, seed=52)
    bad = invalid_records()
    assert len(bad) == 1000
    # the valid binary predictions that the out-of-range labels point at
    oor_preds = [(preds_topic, f"oor-{i}".encode(),
                  dumps({"id": f"oor-{i}", "model": "ctr-prob", "ts": BASE_TS + 100.0 + i,
                         "prob": 0.25})) for i in range(100)]
    topic_of = {"p": preds_topic, "l": labels_topic}
    tagged: list[tuple[str | None, tuple[str, bytes | None, bytes | None]]] = [
        (None, r) for r in valid + oor_preds]
    tagged += [(reason, (topic_of[k], key, value)) for k, reason, key, value in bad]
    order = np.random.default_rng(53).permutation(len(tagged))
    tagged = [tagged[i] for i in order]

    daemon = CalmonDaemon(cfg)
    with daemon.start(), Producer(kafka_bootstrap) as producer:
        sent = []
        for i in range(0, len(tagged), 400):
            sent += producer.send([r for _, r in tagged[i:i + 400]])
        daemon.wait_positions(end_positions(sent))
        # dead letters are flushed before every checkpoint
        daemon.wait_checkpoint_of(end_positions(sent), "a checkpoint after the last record")
        assert daemon.running and http_get(daemon.port, "/readyz")[0] == 200
        st = daemon.status()
        sc = daemon.scrape()

    want_reasons = Counter((k, reason) for k, reason, _, _ in bad)
    # /metrics: every topic x reason series is there; the produced ones exact
    invalid = series(sc, "calmon_invalid_records_total", "topic", "reason")
    assert set(invalid) == {(t, r) for t in ("predictions", "labels") for r in REASONS}
    want = {("predictions" if k == "p" else "labels", r): float(n)
            for (k, r), n in want_reasons.items()}
    assert {k: v for k, v in invalid.items() if v} == want

    # valid counts: 600 + 100 predictions (the 100 whose label is out of range are
    # valid), 600 labels (the 100 out-of-range ones are invalid, not labels)
    c = st["counters"]
    assert c["predictions"] == N_VALID + 100
    assert c["labels"] == N_VALID
    assert c["joined"] == N_VALID
    assert c["invalid"] == 1000
    assert c["duplicates"] == 0 and c["expired"] == 0
    assert st["pending"] == 100  # the predictions whose label was out of range
    assert sum(series(sc, "calmon_joined_total", "model").values()) == N_VALID
    samples = series(sc, "calmon_window_samples", "model", "segment", "window")
    assert sum(v for (_, s, w), v in samples.items() if s == "__all__" and w == "7d") == N_VALID

    # logged, but at most once per topic and reason per minute
    pattern = re.compile(r"invalid (prediction|label) record \(([a-z0-9_]+)\)")
    logged = Counter((m.group(1)[0], m.group(2)) for line in daemon.log.read_text().splitlines()
                     if (m := pattern.search(line)))
    assert logged == Counter({(k, reason): 1 for k, reason in want_reasons})

    # the dead-letter topic holds exactly the 1,000, unchanged, with their headers
    where = {}
    for (reason, (topic, _key, value)), md in zip(tagged, sent):
        if reason is not None:
            where[f"{topic}/{md.partition}/{md.offset}"] = (reason, value)
    assert len(where) == 1000
    letters = consume(kafka_bootstrap, dlq, 1000, timeout=30)
    assert len(letters) == 1000
    got: dict[str, tuple[str, bytes | None]] = {}
    for r in letters:
        headers = dict(r.headers)
        assert set(headers) == {REASON_HEADER, SOURCE_HEADER}
        source = headers[SOURCE_HEADER].decode()
        assert source not in got, f"dead letter {source} twice"
        got[source] = (headers[REASON_HEADER].decode(), r.value)
    assert got.keys() == where.keys()
    for source, (reason, value) in where.items():
        assert got[source] == (reason, value), source
    # and nothing more arrives
    assert len(consume(kafka_bootstrap, dlq, 1001, timeout=2, partial=True)) == 1000
