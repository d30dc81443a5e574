"""`calmon check-config --probe` against the real broker: a newcomer's mistakes, named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from calmon.cli import main
from tests.conftest import FAST_CLIENT, create_topics, unique_topic

pytestmark = pytest.mark.integration


def _config(tmp_path: Path, bootstrap: str, preds: str, labels: str, extra: str = "") -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(f"""
kafka:
  bootstrap_servers: {bootstrap}
  predictions_topic: {preds}
  labels_topic: {labels}
  client: {json.dumps(FAST_CLIENT)}
{extra}
""", encoding="utf-8")
    return path


def _probe(capsys: pytest.CaptureFixture[str], cfg: Path) -> tuple[int, str]:
    rc = main(["check-config", "-c", str(cfg), "--probe", "--probe-timeout", "10"])
    out, _ = capsys.readouterr()
    return rc, out


def _produce(bootstrap: str, topic: str, values: list[bytes]) -> None:
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap)
    try:
        for i, v in enumerate(values):
            producer.send(topic, key=str(i).encode(), value=v)
        producer.flush(timeout=15)
    finally:
        producer.close()


def test_a_missing_topic_fails_the_probe(capsys, tmp_path: Path, kafka_bootstrap: str) -> None:
    preds = unique_topic()
    create_topics(kafka_bootstrap, [preds], partitions=2)
    rc, out = _probe(capsys, _config(tmp_path, kafka_bootstrap, preds, unique_topic("absent")))
    assert rc == 1
    assert "# FAIL labels topic" in out and "kafka.labels_topic" in out


def test_unequal_partitions_fail_when_scaled_out(capsys, tmp_path: Path,
                                                kafka_bootstrap: str) -> None:
    preds, labels = unique_topic(), unique_topic()
    create_topics(kafka_bootstrap, [preds], partitions=4)
    create_topics(kafka_bootstrap, [labels], partitions=6)
    rc, out = _probe(capsys, _config(tmp_path, kafka_bootstrap, preds, labels))
    assert rc == 0 and "warning: input topics have 4 and 6 partitions" in out
    rc, out = _probe(capsys, _config(tmp_path, kafka_bootstrap, preds, labels,
                                     "  instance: {index: 0, count: 2}\n"
                                     "recalibration: {enabled: false}"))
    assert rc == 1 and "# FAIL input topics have 4 and 6 partitions" in out


def test_unparsable_records_are_reported_per_topic(capsys, tmp_path: Path,
                                                  kafka_bootstrap: str) -> None:
    preds, labels = unique_topic(), unique_topic()
    create_topics(kafka_bootstrap, [preds, labels], partitions=2)
    _produce(kafka_bootstrap, preds, [json.dumps({"id": f"r{i}", "model": "m", "ts": 1.7e9,
                                                  "prob": 0.2}).encode() for i in range(30)])
    # the labels topic keeps its id at another path than the predictions
    _produce(kafka_bootstrap, labels, [json.dumps({"request_id": f"r{i}", "label": 1}).encode()
                                       for i in range(30)])
    rc, out = _probe(capsys, _config(tmp_path, kafka_bootstrap, preds, labels))
    assert rc == 1
    assert f"# ok   predictions topic {preds!r}: 30 of 30 sampled records parse" in out
    assert f"# FAIL labels topic {labels!r}: 0 of 30 sampled records parse" in out
    assert "30 x missing_id" in out and "check fields.id" in out
    rc, out = _probe(capsys, _config(tmp_path, kafka_bootstrap, preds, labels,
                                     "fields: {labels: {id: request_id}}"))
    assert rc == 0, out
    assert f"labels topic {labels!r}: 30 of 30 sampled records parse" in out


def test_an_unreachable_broker_fails_fast(capsys, tmp_path: Path) -> None:
    from calmon.demo.broker import free_port

    rc, out = _probe(capsys, _config(tmp_path, f"127.0.0.1:{free_port()}", "p", "l"))
    assert rc == 1 and "# FAIL broker" in out and "cannot connect" in out
