"""`calmon check-config --probe` against the real broker: a newcomer's mistakes, named."""

from __future__ import annotations

import json
import re
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
    assert "30 x missing_id" in out and "set fields.labels.id" in out
    rc, out = _probe(capsys, _config(tmp_path, kafka_bootstrap, preds, labels,
                                     "fields: {labels: {id: request_id}}"))
    assert rc == 0, out
    assert f"labels topic {labels!r}: 30 of 30 sampled records parse" in out


def test_an_unreachable_broker_fails_fast(capsys, tmp_path: Path) -> None:
    from calmon.demo.broker import free_port

    rc, out = _probe(capsys, _config(tmp_path, f"127.0.0.1:{free_port()}", "p", "l"))
    assert rc == 1 and "# FAIL broker" in out and "cannot connect" in out
    # kafka-python's errors name themselves: the class name once, not twice
    assert not re.search(r"(\w+Error): \1", out), out


def _records(n: int, ts_key: str = "served_at") -> tuple[list[bytes], list[bytes]]:
    preds = [json.dumps({"id": f"r{i}", "model": "m", ts_key: 1.7e9 + i, "prob": 0.2,
                         "segment": {"country": "A"}}).encode() for i in range(n)]
    labels = [json.dumps({"id": f"r{i}", "label": i % 2}).encode() for i in range(n)]
    return preds, labels


def test_a_wrong_fields_ts_is_named_with_its_fallback(capsys, tmp_path: Path,
                                                     kafka_bootstrap: str) -> None:
    """The newcomer's fields.ts names a path the records do not have. On Kafka every
    record still parses (the Kafka timestamp stands in), so "30 of 30 parse" alone hid
    it, and `replay` of the same records rejected them all as missing_ts. The probe names
    the path, states the fallback, and shows a record as the daemon reads it."""
    preds, labels = unique_topic(), unique_topic()
    create_topics(kafka_bootstrap, [preds, labels], partitions=1)
    p, lab = _records(30)
    _produce(kafka_bootstrap, preds, p)
    _produce(kafka_bootstrap, labels, lab)
    rc, out = _probe(capsys, _config(tmp_path, kafka_bootstrap, preds, labels,
                                     "fields: {ts: event_time}"))
    assert rc == 0, out
    assert f"predictions topic {preds!r}: 30 of 30 sampled records parse" in out
    assert ("warning: fields.ts 'event_time' is absent from 30 of 30 parsed records: the "
            "daemon takes their Kafka timestamp") in out
    assert "rejects them as missing_ts" in out
    shown = next(x for x in out.splitlines() if f"as the daemon reads {preds}/0/" in x)
    assert "prediction: id 'r" in shown and "the Kafka timestamp" in shown, shown
    assert "segment country=A" in shown and "prob 0.2" in shown, shown
    # the label side: its fallback is said too, without a warning (a label's ts is optional)
    assert ("fields.ts 'event_time' is absent from 30 of 30 parsed records: their Kafka "
            "timestamp is taken as the label's time") in out
    # replay agrees: the same records, no Kafka timestamp, are missing_ts
    (tmp_path / "p.jsonl").write_bytes(b"\n".join(p) + b"\n")
    (tmp_path / "l.jsonl").write_bytes(b"\n".join(lab) + b"\n")
    cfg = tmp_path / "replay.yaml"
    cfg.write_text("fields: {ts: event_time}\n", encoding="utf-8")
    assert main(["replay", "--predictions", str(tmp_path / "p.jsonl"), "--labels",
                 str(tmp_path / "l.jsonl"), "-c", str(cfg)]) == 1
    assert "30 invalid (missing_ts)" in capsys.readouterr().err
    # the right path: read from the record, no warning
    rc, out = _probe(capsys, _config(tmp_path, kafka_bootstrap, preds, labels,
                                     "fields: {ts: served_at}"))
    assert rc == 0 and "warning: fields.ts" not in out, out
    shown = next(x for x in out.splitlines() if f"as the daemon reads {preds}/0/" in x)
    assert "from fields.ts 'served_at'" in shown and "ts 17000000" in shown, shown


def _commit(bootstrap: str, group: str, offsets: dict[tuple[str, int], int]) -> None:
    """What an earlier run left behind: the group's committed offsets."""
    from kafka import KafkaConsumer, TopicPartition
    from kafka.structs import OffsetAndMetadata

    c = KafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False,
                      **FAST_CLIENT)
    try:
        c.commit({TopicPartition(t, p): OffsetAndMetadata(o, "", -1)
                  for (t, p), o in offsets.items()})
    finally:
        c.close(autocommit=False)


def _source_positions(cfg_path: Path) -> dict[tuple[str, int], int]:
    """Where the daemon's own source starts, without a checkpoint: the truth to match."""
    from kafka import TopicPartition

    from calmon import config
    from calmon.io.kafka_source import KafkaSource

    src = KafkaSource(config.load(str(cfg_path)).kafka, metadata_timeout_s=10)
    try:
        owned = src.assign()
        consumer = src._consumer
        assert consumer is not None
        return {(t, p): consumer.position(TopicPartition(t, p)) for t, p in owned}
    finally:
        src.close()


def test_the_probe_says_where_a_run_starts(capsys, tmp_path: Path,
                                           kafka_bootstrap: str) -> None:
    """The newcomer's second run: a new state dir on topics an earlier run read starts
    from the group's committed offsets and reads nothing. The probe says so per
    partition, with the way out, and agrees with where the daemon's source starts."""
    preds, labels = unique_topic(), unique_topic()
    create_topics(kafka_bootstrap, [preds, labels], partitions=2)
    p, lab = _records(20)
    sent = [_send_one(kafka_bootstrap, preds, v, i % 2) for i, v in enumerate(p)]
    sent += [_send_one(kafka_bootstrap, labels, v, i % 2) for i, v in enumerate(lab)]
    ends = {}
    for topic, part, offset in sent:
        ends[(topic, part)] = max(ends.get((topic, part), 0), offset + 1)
    group = unique_topic("group")
    _commit(kafka_bootstrap, group, ends)
    state = f"state: {{dir: {json.dumps(str(tmp_path / 'fresh-state'))}}}"
    cfg = _config(tmp_path, kafka_bootstrap, preds, labels, f"  group_id: {group}\n{state}")
    rc, out = _probe(capsys, cfg)
    assert rc == 0, out
    assert "no checkpoint in state.dir" in out
    for part in (0, 1):
        assert (f"{preds}/{part}: offset 10 (committed by group {group!r}), 0 of 10 records "
                "ahead") in out, out
    assert (f"warning: predictions topic {preds!r} holds 20 records and a run would read "
            f"none of them: group {group!r} committed the end") in out
    assert "set a new kafka.group_id" in out
    assert _source_positions(cfg) == {tp: 10 for tp in ends}
    # a new group: from the start, every record ahead, no warning
    cfg = _config(tmp_path, kafka_bootstrap, preds, labels,
                  f"  group_id: {unique_topic('group')}\n{state}")
    rc, out = _probe(capsys, cfg)
    assert rc == 0 and "would read none" not in out, out
    assert f"{labels}/1: offset 0 (kafka.auto_offset_reset: earliest), 10 of 10 records" in out
    assert _source_positions(cfg) == {tp: 0 for tp in ends}


def test_a_checkpoint_is_where_a_run_starts(capsys, tmp_path: Path,
                                            kafka_bootstrap: str) -> None:
    from calmon.io.checkpoint import CheckpointStore

    preds, labels = unique_topic(), unique_topic()
    create_topics(kafka_bootstrap, [preds, labels], partitions=2)
    p, _ = _records(20)
    for i, v in enumerate(p):
        _send_one(kafka_bootstrap, preds, v, i % 2)
    group = unique_topic("group")
    _commit(kafka_bootstrap, group, {(preds, 0): 10, (preds, 1): 10})
    CheckpointStore(tmp_path / "st").save({}, {(preds, 0): 4}, 0.0)
    state = f"state: {{dir: {json.dumps(str(tmp_path / 'st'))}}}"
    rc, out = _probe(capsys, _config(tmp_path, kafka_bootstrap, preds, labels,
                                     f"  group_id: {group}\n{state}"))
    assert rc == 0, out
    assert "holds checkpoint 1" in out
    assert f"{preds}/0: offset 4 (from state.dir's checkpoint), 6 of 10 records ahead" in out
    # a partition the checkpoint does not hold: auto_offset_reset, never the group's
    assert f"{preds}/1: offset 0 (kafka.auto_offset_reset: earliest), 10 of 10" in out


def _send_one(bootstrap: str, topic: str, value: bytes, partition: int) -> tuple[str, int, int]:
    """One record in a batch of its own (end offsets count records exactly on every
    broker), to a chosen partition."""
    from tests.conftest import produce

    md = produce(bootstrap, topic, [value], partition=partition)[0]
    return md.topic, md.partition, md.offset


def test_the_daemons_sources_say_where_they_start(caplog, tmp_path: Path,
                                                  kafka_bootstrap: str) -> None:
    """The same second run, from the daemon's side: its source (in process and in the
    consumer process the daemon runs) says per partition where it starts, and warns
    that the topics hold records it will not read, with the way out."""
    import logging

    from calmon import config
    from calmon.io.consumer_process import ProcessSource
    from calmon.io.kafka_source import KafkaSource
    from calmon.io.start import GROUP, RESET, Start

    preds, labels = unique_topic(), unique_topic()
    create_topics(kafka_bootstrap, [preds, labels], partitions=2)
    p, lab = _records(20)
    for i, v in enumerate(p):
        _send_one(kafka_bootstrap, preds, v, i % 2)
    for i, v in enumerate(lab):
        _send_one(kafka_bootstrap, labels, v, i % 2)
    group = unique_topic("group")
    _commit(kafka_bootstrap, group, {(preds, 0): 10, (preds, 1): 10, (labels, 0): 4})
    kafka = config.load(str(_config(tmp_path, kafka_bootstrap, preds, labels,
                                    f"  group_id: {group}\n"))).kafka
    want = {(preds, 0): Start(10, GROUP, 0, 10), (preds, 1): Start(10, GROUP, 0, 10),
            (labels, 0): Start(4, GROUP, 6, 10), (labels, 1): Start(0, RESET, 10, 10)}
    with caplog.at_level(logging.INFO, logger="calmon.io"):
        # in process (its log captured here), then in the daemon's consumer process
        for source in (KafkaSource, ProcessSource):
            src = source(kafka, metadata_timeout_s=10)
            try:
                src.assign()
                assert src.starts == want, source
            finally:
                src.close()
    said = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("start of the predictions topic: ") and
               f"{preds}/0: offset 10 (committed by group {group!r}), 0 of 10 records ahead"
               in m for m in said), said
    assert any(f"the predictions topic {preds!r} holds 20 records and this run reads none"
               in m and "a new kafka.group_id" in m for m in said), said
    assert not any(f"the labels topic {labels!r} holds" in m for m in said), said


# a batch that cannot be decoded only reaches a consumer through a broker that stores
# it unchecked; Apache Kafka refuses it at produce (io/test_compressed_batches.py)
@pytest.mark.brokers("tansu")
def test_a_corrupt_batch_is_reported_as_such_and_the_labels_topic_still_probed(
        capsys, tmp_path: Path, kafka_bootstrap: str) -> None:
    """A record batch that cannot be read among the newest records (issue 35): the probe
    reads past it as the daemon does, names it, and goes on to the labels topic; before,
    it reported a broker failure and never sampled the labels."""
    from tests.hostile_batches import gzip_payload, send_one_batch

    preds, labels = unique_topic(), unique_topic()
    create_topics(kafka_bootstrap, [preds, labels], partitions=1)
    _produce(kafka_bootstrap, preds, [json.dumps({"id": f"r{i}", "model": "m", "ts": 1.7e9,
                                                  "prob": 0.2}).encode() for i in range(20)])
    with gzip_payload(b"garbage, not gzip" * 4):
        send_one_batch(kafka_bootstrap, preds, 0, [b"y" * 400] * 3, compression_type="gzip")
    _produce(kafka_bootstrap, labels, [json.dumps({"id": f"r{i}", "label": 1}).encode()
                                       for i in range(20)])
    rc, out = _probe(capsys, _config(tmp_path, kafka_bootstrap, preds, labels))
    assert "FAIL broker" not in out, out
    assert f"# ok   predictions topic {preds!r}: 20 of 21 sampled records parse" in out, out
    assert "1 x bad_batch" in out and f"cannot be read, at {preds}/0/20" in out
    assert f"# ok   labels topic {labels!r}: 20 of 20 sampled records parse" in out, out
    assert rc == 0, out
