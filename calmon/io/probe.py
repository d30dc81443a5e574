"""``calmon check-config --probe``: what the broker and the input topics say about a config.

Connects with the config's own client settings (no consumer group: nothing is
committed), checks that every configured topic exists and that the two input
topics co-partition, then reads a sample of recent records from each input
topic and parses them exactly as the daemon would, reporting per topic how
many parse and, for the others, each reason with the ``fields.*`` key to fix.
A probe fails (exit 1) when the broker cannot be reached, a topic is missing,
the input topics' partition counts differ where they must not, or most of a
topic's sample does not parse.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from calmon import hints
from calmon.config import Config
from calmon.engine.records import Kind, Parser, Raw, Reject

SAMPLE = 100  # records read per input topic
MAJORITY = 0.5  # a topic fails when fewer than this share of its sample parses


@dataclass
class TopicReport:
    topic: str
    role: str  # predictions, labels, dead letters, calibrators, joined
    partitions: int | None = None  # None: missing
    sampled: int = 0
    parsed: int = 0
    reasons: Counter[str] = field(default_factory=Counter)


@dataclass
class ProbeReport:
    lines: list[str] = field(default_factory=list)
    failed: bool = False

    def fail(self, line: str) -> None:
        self.failed = True
        self.lines.append(f"FAIL {line}")

    def ok(self, line: str) -> None:
        self.lines.append(f"ok   {line}")

    def note(self, line: str) -> None:
        self.lines.append(f"     {line}")


def probe(cfg: Config, *, sample: int = SAMPLE, timeout_s: float = 15.0,
          consumer_factory: Callable[..., Any] | None = None) -> ProbeReport:
    """Run every check; never raises for what the broker says (it is all in the report)."""
    from kafka import KafkaConsumer, TopicPartition
    from kafka.errors import KafkaError

    from calmon.io.kafka_source import KafkaSource

    rep = ProbeReport()
    k = cfg.kafka
    servers = ",".join(k.bootstrap_servers)
    settings = KafkaSource(k, metadata_timeout_s=timeout_s)._settings()
    settings.update(group_id=None, consumer_timeout_ms=int(timeout_s * 1000))
    try:
        consumer = (consumer_factory or KafkaConsumer)(**settings)
    except (KafkaError, OSError, ValueError) as e:
        rep.fail(f"broker {servers}: cannot connect ({type(e).__name__}: {e}); "
                 "check kafka.bootstrap_servers and kafka.client")
        return rep
    try:
        existing = set(consumer.topics())
        rep.ok(f"broker {servers}: connected, {len(existing)} topics visible")
        topics = [(k.predictions_topic, "predictions"), (k.labels_topic, "labels")]
        topics += [(t, role) for t, role in ((k.dead_letter_topic, "dead letters"),
                                             (k.calibrators_topic, "calibrators"),
                                             (k.joined_topic, "joined samples")) if t]
        reports: dict[str, TopicReport] = {}
        for topic, role in topics:
            tr = TopicReport(topic, role)
            reports[role] = tr
            if topic not in existing:
                key = {"predictions": "kafka.predictions_topic", "labels": "kafka.labels_topic",
                       "dead letters": "kafka.dead_letter_topic",
                       "calibrators": "kafka.calibrators_topic",
                       "joined samples": "kafka.joined_topic"}[role]
                rep.fail(f"{role} topic {topic!r} does not exist (or is not visible to this "
                         f"client): create it or fix {key}")
                continue
            parts = consumer.partitions_for_topic(topic)
            tr.partitions = len(parts or ())
            rep.ok(f"{role} topic {topic!r}: {tr.partitions} partitions")
        _co_partitioning(cfg, reports, rep)
        for role, kind in (("predictions", Kind.PREDICTION), ("labels", Kind.LABEL)):
            tr = reports[role]
            if tr.partitions:
                _sample(cfg, consumer, TopicPartition, tr, kind, sample, timeout_s, rep)
    except KafkaError as e:
        rep.fail(f"broker {servers}: {type(e).__name__}: {e}")
    finally:
        consumer.close()
    return rep


def _co_partitioning(cfg: Config, reports: dict[str, TopicReport], rep: ProbeReport) -> None:
    p, lab = reports["predictions"].partitions, reports["labels"].partitions
    if p is None or lab is None or p == lab:
        if p is not None and p == lab:
            rep.ok(f"input topics co-partition ({p} partitions each)")
        return
    count = cfg.kafka.instance.count if cfg.kafka.instance is not None else 1
    msg = (f"input topics have {p} and {lab} partitions: an id's prediction and label land on "
           "different partition numbers")
    if count > 1:
        rep.fail(f"{msg}, so instances cannot join them (kafka.instance.count {count}); give "
                 "both topics the same partition count")
    else:
        rep.note(f"warning: {msg}; one instance still joins them, but scaling out needs equal "
                 "counts")


def _sample(cfg: Config, consumer: Any, topic_partition: type, tr: TopicReport, kind: Kind,
            sample: int, timeout_s: float, rep: ProbeReport) -> None:
    c = consumer
    tps = [topic_partition(tr.topic, p) for p in range(tr.partitions or 0)]
    c.assign(tps)
    begin = c.beginning_offsets(tps)
    end = c.end_offsets(tps)
    per = max(1, sample // max(1, len(tps)))
    for tp in tps:  # the newest records of each partition: what the daemon reads next
        c.seek(tp, max(begin[tp], end[tp] - per))
    parser = Parser(cfg.fields, cfg.kafka.max_record_bytes, cfg.limits, cfg.kafka.max_clock_skew)
    deadline = time.monotonic() + timeout_s
    while tr.sampled < sample and time.monotonic() < deadline:
        if all(c.position(tp) >= end[tp] for tp in tps):
            break
        polled = c.poll(timeout_ms=500, max_records=sample)
        for records in polled.values():
            for r in records:
                if tr.sampled >= sample:
                    break
                tr.sampled += 1
                raw = Raw(kind, r.value, r.timestamp / 1000.0 if r.timestamp >= 0 else None,
                          f"{r.topic}/{r.partition}/{r.offset}")
                got = parser.parse(raw)
                if isinstance(got, Reject):
                    tr.reasons[got.reason] += 1
                else:
                    tr.parsed += 1
    if tr.sampled == 0:
        rep.note(f"{tr.role} topic {tr.topic!r}: no records to sample yet")
        return
    line = f"{tr.role} topic {tr.topic!r}: {tr.parsed} of {tr.sampled} sampled records parse"
    if tr.parsed >= MAJORITY * tr.sampled:
        rep.ok(line)
    else:
        rep.fail(line)
    for reason, n in tr.reasons.most_common():
        h = hints.hint(cfg, tr.role, reason)
        rep.note(f"  {n} x {reason}" + (f": {h}" if h else ""))
