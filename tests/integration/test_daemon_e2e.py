"""``calmon run`` end to end: Kafka in, /metrics out, equal to ``calmon replay``.

Predictions of a binary ``prob`` model, a binary ``logit`` model and a 4-class
model (``probs`` or ``logits``) with segment keys country and device, and their
labels with random delays, go to 4-partition topics in a random order (many
labels before their prediction), keyed by id. Every window gauge scraped from
/metrics must equal what ``calmon replay --json`` computes over the same records
written to JSONL files, and the bin counters must equal bins computed here from
the records (right-closed, as scikit-learn's calibration_curve).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import create_topics, unique_topic
from tests.daemon_helpers import (
    COUNTER_KEYS,
    CalmonDaemon,
    Producer,
    assert_gauges_match_replay,
    end_positions,
    expected_bins,
    http_get,
    interleave,
    make_dataset,
    replay_json,
    series,
    wait_until,
    write_config,
    write_jsonl,
)

pytestmark = pytest.mark.integration

N = 2400


def test_metrics_equal_replay_of_the_same_records(
    kafka_bootstrap: str, kafka_topics: Callable[..., list[str]], tmp_path: Path
) -> None:
    preds_topic, labels_topic = kafka_topics(count=2, partitions=4)
    cfg = write_config(tmp_path / "calmon.yaml", kafka_bootstrap, preds_topic, labels_topic)
    preds, labels = make_dataset(N, seed=11)
    records = interleave(preds, labels, preds_topic, labels_topic, seed=12)
    first_seen: dict[bytes, str] = {}
    for topic, key, _ in records:
        first_seen.setdefault(key, topic)
    early = sum(t == labels_topic for t in first_seen.values())
    assert N // 4 < early < 3 * N // 4  # many labels are sent before their prediction

    with CalmonDaemon(cfg) as daemon, Producer(kafka_bootstrap) as producer:
        sent = []
        for i in range(0, len(records), 800):  # several chunks, consumed as they come
            sent += producer.send(records[i:i + 800])
        st = daemon.wait_counters({"joined": N})
        # nothing more is coming: calmon has read every record we produced
        st = daemon.wait_positions(end_positions(sent))
        assert {p.split("/")[0] for p in st["positions"]} == {preds_topic, labels_topic}
        sc = daemon.scrape()
        status = daemon.status()

    replay = replay_json(cfg, write_jsonl(tmp_path / "p.jsonl", preds),
                         write_jsonl(tmp_path / "l.jsonl", labels))
    expected_counters = {"predictions": N, "labels": N, "joined": N, "invalid": 0,
                         "expired": 0, "duplicates": 0}
    assert replay["counters"] == expected_counters
    assert {k: status["counters"][k] for k in COUNTER_KEYS} == expected_counters
    assert status["pending"] == 0

    # every (model, segment, window) row: 3 models x (1 + 5 countries + 3 devices) x 3 windows
    assert len(replay["rows"]) == 3 * 9 * 3
    compared = assert_gauges_match_replay(sc, replay, tol=1e-12)
    assert compared > 8 * len(replay["rows"])
    samples = series(sc, "calmon_window_samples", "model", "segment", "window")
    assert sum(v for (m, s, w), v in samples.items() if s == "__all__" and w == "7d") == N
    # the 1h window really is a smaller slice of the data than 24h
    assert all(samples[(m, "__all__", "1h")] < samples[(m, "__all__", "24h")]
               for m in ("ctr-prob", "ctr-logit", "intent4"))
    # observed rate and observed/expected are binary-only
    ooe = series(sc, "calmon_observed_over_expected", "model", "segment", "window")
    assert {m for m, _, _ in ooe} == {"ctr-prob", "ctr-logit"}

    # bin counters per model/segment/bin: computed here from the records
    want_n, want_correct = expected_bins(preds, labels, bins=15)
    got_n = series(sc, "calmon_bin_samples_total", "model", "segment", "bin")
    got_correct = series(sc, "calmon_bin_correct_total", "model", "segment", "bin")
    nonzero = {k: v for k, v in got_n.items() if v}
    assert nonzero == {k: float(v) for k, v in want_n.items()}
    assert all(got_n[k] == 0 for k in set(got_n) - set(want_n))
    assert {k: got_correct[k] for k in want_n} == {k: float(want_correct[k]) for k in want_n}
    # the data holds probabilities exactly on bin edges (0.2 = 3/15 closes bin 2)
    assert any(p.get("prob") == 0.2 for p in preds)
    assert want_n[("ctr-prob", "__all__", "2")] > 0

    # per-model flow counters (this process counted everything once)
    by_model = Counter(p["model"] for p in preds)
    for name in ("calmon_predictions_total", "calmon_joined_total"):
        got = series(sc, name, "model")
        assert got == {(m,): float(c) for m, c in by_model.items()}, name
    assert sum(series(sc, "calmon_labels_total", "model").values()) == N
    assert series(sc, "calmon_join_pending")[()] == 0


def test_probes_and_status_schema(
    kafka_bootstrap: str, kafka_topics: Callable[..., list[str]], tmp_path: Path
) -> None:
    """/healthz is 200 while the process lives; /readyz is 503 until the partitions
    are assigned (here: until the labels topic exists) and 200 after; /status has
    the contract's keys throughout."""
    (preds_topic,) = kafka_topics(count=1, partitions=4)
    labels_topic = unique_topic("calmon-late")  # does not exist yet
    cfg = write_config(tmp_path / "calmon.yaml", kafka_bootstrap, preds_topic, labels_topic)
    daemon = CalmonDaemon(cfg)
    with daemon.start(wait_ready=False):
        wait_until(lambda: http_get(daemon.port, "/healthz")[0] == 200, 30, "/healthz 200",
                   detail=daemon.log_tail)
        assert http_get(daemon.port, "/healthz")[1] == b"ok\n"
        assert http_get(daemon.port, "/readyz")[0] == 503
        st = daemon.status()
        check_status_schema(st)
        assert st["ready"] is False
        assert http_get(daemon.port, "/metrics")[0] == 200
        assert http_get(daemon.port, "/no-such-page")[0] == 404

        create_topics(kafka_bootstrap, [labels_topic], partitions=4)
        daemon.wait_ready()
        st = daemon.status()
        check_status_schema(st)
        assert st["ready"] is True
        assert {k: st["counters"][k] for k in COUNTER_KEYS} == dict.fromkeys(COUNTER_KEYS, 0)
        assert st["pending"] == 0
        daemon.wait_checkpoint(None, "a first checkpoint")
        sc = daemon.scrape()
        assert "calmon_last_checkpoint_timestamp_seconds" in sc
        invalid = series(sc, "calmon_invalid_records_total", "topic", "reason")
        assert invalid and set(invalid.values()) == {0.0}


def check_status_schema(st: dict[str, object]) -> None:
    for key in ("ready", "pending", "last_checkpoint", "counters"):
        assert key in st, key
    assert isinstance(st["ready"], bool)
    assert isinstance(st["pending"], int)
    assert st["last_checkpoint"] is None or isinstance(st["last_checkpoint"], str)
    counters = st["counters"]
    assert isinstance(counters, dict)
    for key in COUNTER_KEYS:
        assert isinstance(counters.get(key), int), key
