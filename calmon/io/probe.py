"""``calmon check-config --probe``: what the broker and the input topics say about a config.

Connects with the config's own client settings (the group is only asked for its
committed offsets: nothing is committed), checks that every configured topic exists
and that the two input topics co-partition, says per partition this instance reads
where a run would start and how many records lie ahead (``calmon.io.start``), then
reads a sample of recent records from each input topic and parses them exactly as
the daemon would (its parser, its wall-clock ceiling, the Kafka timestamp where
``fields.ts`` is absent), reporting per topic how many parse, one record as the
daemon reads it, the ``fields.ts`` fallback, and for the rest each reason with the
``fields.*`` key to fix. A probe fails (exit 1) when the broker cannot be reached, a
topic is missing, the input topics' partition counts differ where they must not, or
most of a topic's sample does not parse. A record batch that cannot be read (corrupt,
an unknown codec, a bomb) is read past as the daemon reads past it (``batch_guard``)
and reported as one sampled batch under its reason, not as a broker failure.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from calmon import hints
from calmon.config import Config
from calmon.engine.records import BINARY_KINDS, Kind, Label, Parser, Prediction, Raw, Reject
from calmon.errors import describe
from calmon.io import batch_guard, start
from calmon.io.checkpoint import CheckpointStore
from calmon.io.topics import owned_partitions

SAMPLE = 100  # records read per input topic
MAJORITY = 0.5  # a topic fails when fewer than this share of its sample parses
SHOWN_PARTITIONS = 16  # start positions listed per topic; the rest are summed up


@dataclass
class TopicReport:
    topic: str
    role: str  # predictions, labels, dead letters, calibrators, joined
    partitions: int | None = None  # None: missing
    sampled: int = 0
    parsed: int = 0
    reasons: Counter[str] = field(default_factory=Counter)
    no_ts: int = 0  # parsed records whose fields.ts was absent: the Kafka timestamp stood in
    shown: Prediction | Label | None = None  # the first parsed record
    shown_at: str = ""
    shown_kafka_ts: bool = False  # the shown record's ts is its Kafka timestamp
    skipped: list[str] = field(default_factory=list)  # batches that cannot be read


@dataclass
class ProbeReport:
    lines: list[str] = field(default_factory=list)
    failed: bool = False
    partitions: int | None = None  # of the predictions topic, once known

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

    from calmon.io.kafka_source import KafkaSource, connect
    from calmon.io.source import KafkaAuthError

    rep = ProbeReport()
    k = cfg.kafka
    servers = ",".join(k.bootstrap_servers)
    settings = KafkaSource(k, metadata_timeout_s=timeout_s)._settings()
    # the group only answers committed(): assign() joins nothing, auto-commit is off
    settings.update(consumer_timeout_ms=int(timeout_s * 1000))
    try:
        consumer = connect(consumer_factory or KafkaConsumer, settings, k.client,
                           k.bootstrap_servers)
    except KafkaAuthError as e:  # names the kafka.client setting to fix
        rep.fail(f"broker {servers}: {e}")
        return rep
    except (KafkaError, OSError, ValueError) as e:
        rep.fail(f"broker {servers}: cannot connect ({describe(e)}); "
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
            if role == "predictions":
                rep.partitions = tr.partitions
            rep.ok(f"{role} topic {topic!r}: {tr.partitions} partitions")
        _co_partitioning(cfg, reports, rep)
        _starts(cfg, consumer, TopicPartition, [reports["predictions"], reports["labels"]], rep)
        for role, kind in (("predictions", Kind.PREDICTION), ("labels", Kind.LABEL)):
            tr = reports[role]
            if tr.partitions:
                _sample(cfg, consumer, TopicPartition, tr, kind, sample, timeout_s, rep)
    except KafkaError as e:
        rep.fail(f"broker {servers}: {describe(e)}")
    finally:
        consumer.close(autocommit=False)
    return rep


def _co_partitioning(cfg: Config, reports: dict[str, TopicReport], rep: ProbeReport) -> None:
    p, lab = reports["predictions"].partitions, reports["labels"].partitions
    if p is None or lab is None or p == lab:
        if p is not None and p == lab:
            rep.ok(f"input topics co-partition ({p} partitions each)")
        return
    count = cfg.kafka.static.count if cfg.kafka.static is not None else 1
    msg = (f"input topics have {p} and {lab} partitions: an id's prediction and label land on "
           "different partition numbers")
    if count > 1 or cfg.kafka.group:
        shape = "kafka.instance: group" if cfg.kafka.group else f"kafka.instance.count {count}"
        rep.fail(f"{msg}, so instances cannot join them ({shape}); give "
                 "both topics the same partition count")
    else:
        rep.note(f"warning: {msg}; one instance still joins them, but scaling out needs equal "
                 "counts")


def _starts(cfg: Config, consumer: Any, topic_partition: type, trs: list[TopicReport],
            rep: ProbeReport) -> None:
    """Per partition this instance reads: where a run starts and what lies ahead, by the
    rule of ``calmon.io.start``; a warning when the topics hold records but a run would
    read none of them (the newcomer's second run, from a group's committed offsets)."""
    k = cfg.kafka
    ckpt = CheckpointStore(cfg.state.dir).peek()
    where = (f"state.dir {cfg.state.dir!r} holds checkpoint {ckpt.seq}" if ckpt is not None
             else f"no checkpoint in state.dir {cfg.state.dir!r}")
    rep.note(f"where a run starts ({where}; group {k.group_id!r}; auto_offset_reset "
             f"{k.auto_offset_reset}):")
    group_starts = False
    for tr in trs:
        if not tr.partitions:
            continue
        tps = [topic_partition(tr.topic, p)
               for p in owned_partitions(range(tr.partitions), k.static)]
        if not tps:
            continue
        begin, end = consumer.beginning_offsets(tps), _true_ends(consumer, tps)
        starts = []
        for tp in tps:
            committed = (consumer.committed(tp, timeout_ms=15_000) if k.group_id else None)
            stored = None if ckpt is None else ckpt.positions.get((tp.topic, tp.partition))
            starts.append(start.start_of(checkpointed=ckpt is not None, stored=stored,
                                         committed=committed, begin=begin[tp], end=end[tp],
                                         reset=k.auto_offset_reset))
        parts = [(tp.partition, st) for tp, st in zip(tps, starts)]
        for line in start.listed(tr.topic, parts, k.group_id, k.auto_offset_reset,
                                 SHOWN_PARTITIONS):
            rep.note(f"  {line}")
        causes = start.none_ahead(starts, k.group_id)
        if causes is not None:
            rep.note(f"warning: {tr.role} topic {tr.topic!r} holds "
                     f"{sum(s.held for s in starts)} records and a run would read none of "
                     f"them: {causes}")
        group_starts |= any(s.source == start.GROUP and s.held > s.ahead for s in starts)
    if group_starts:
        rep.note(f"note: without a checkpoint a run starts where group {k.group_id!r} "
                 "stopped, not at the start of the topics: to read them again from "
                 "the start, set a new kafka.group_id (with auto_offset_reset earliest)")


def _true_ends(consumer: Any, tps: list[Any], timeout_s: float = 10.0) -> dict[Any, int]:
    """End offsets (the next offset of each partition), read to the end: some brokers
    (Tansu, the demo's) answer the base offset of the last record batch plus one, so
    the last batch is read and the position after it taken."""
    end = consumer.end_offsets(tps)
    begin = consumer.beginning_offsets(tps)
    live = [tp for tp in tps if end[tp] > begin[tp]]
    if not live:
        return dict(end)
    consumer.assign(live)
    for tp in live:
        consumer.seek(tp, end[tp] - 1)
    deadline = time.monotonic() + timeout_s
    seen: set[Any] = set()
    while time.monotonic() < deadline:
        polled, skips = _guarded_poll(consumer, 300, 100_000)
        seen.update(tp for tp, recs in polled.items() if recs)
        skipped = {(s.topic, s.partition) for s in skips}  # read past: their end is known
        seen.update(tp for tp in live if (tp.topic, tp.partition) in skipped)
        if not polled and seen >= set(live):
            break
    return {tp: max(end[tp], consumer.position(tp)) if tp in seen else end[tp] for tp in tps}


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
    # the daemon's ceiling for event times: its wall clock plus the allowed skew
    parser.not_after = time.time() + cfg.kafka.max_clock_skew
    ts_key, ts_path = hints.field_path(cfg, tr.role, "ts")
    deadline = time.monotonic() + timeout_s
    while tr.sampled < sample and time.monotonic() < deadline:
        if all(c.position(tp) >= end[tp] for tp in tps):
            break
        polled, skips = _guarded_poll(c, 500, sample)
        for skip in skips:  # a batch the daemon reads past too: counted once, by reason
            tr.sampled += 1
            tr.reasons[skip.reason] += 1
            tr.skipped.append(f"{skip.topic}/{skip.partition}/{skip.first}: {skip.detail}")
        for records in polled.values():
            for r in records:
                if tr.sampled >= sample:
                    break
                tr.sampled += 1
                at = f"{r.topic}/{r.partition}/{r.offset}"
                raw = Raw(kind, r.value, r.timestamp / 1000.0 if r.timestamp >= 0 else None, at)
                got = parser.parse(raw)
                if isinstance(got, Reject):
                    tr.reasons[got.reason] += 1
                    continue
                tr.parsed += 1
                absent = not _present(r.value, ts_path)
                tr.no_ts += absent
                if tr.shown is None:
                    tr.shown, tr.shown_at, tr.shown_kafka_ts = got, at, absent
    if tr.sampled == 0:
        rep.note(f"{tr.role} topic {tr.topic!r}: no records to sample yet")
        return
    line = f"{tr.role} topic {tr.topic!r}: {tr.parsed} of {tr.sampled} sampled records parse"
    if tr.parsed >= MAJORITY * tr.sampled:
        rep.ok(line)
    else:
        rep.fail(line)
    if tr.shown is not None:
        rep.note(f"  as the daemon reads {tr.shown_at}: "
                 f"{_render(tr.shown, tr.shown_kafka_ts, ts_key, ts_path)}")
    if tr.no_ts:
        _ts_fallback(tr, ts_key, ts_path, rep)
    for reason, n in tr.reasons.most_common():
        h = hints.hint(cfg, tr.role, reason)
        rep.note(f"  {n} x {reason}" + (f": {h}" if h else ""))
    for where in tr.skipped[:3]:
        rep.note(f"  a record batch that cannot be read, at {where} (the daemon counts "
                 "and skips it)")


def _guarded_poll(consumer: Any, timeout_ms: int, max_records: int) -> tuple[Any, list[Any]]:
    """One poll as the daemon's source polls: a batch that cannot be read is skipped
    and returned (``batch_guard``), never raised as if the broker had failed."""
    batch_guard.install()
    batch_guard.begin()
    try:
        polled = consumer.poll(timeout_ms=timeout_ms, max_records=max_records)
    finally:
        skips, deferred = batch_guard.end()
    for tp, offset in deferred.items():  # read again, first, in the next poll
        consumer.seek(tp, offset)
    return polled, skips


def _ts_fallback(tr: TopicReport, key: str, path: str, rep: ProbeReport) -> None:
    """Records whose ``fields.ts`` is absent parse on Kafka (their Kafka timestamp stands
    in) but not in a replay of the same records: said, with the key, never hidden."""
    what = f"{key} {path!r} is absent from {tr.no_ts} of {tr.parsed} parsed records"
    if tr.role == "labels":  # a label's time is optional: it dates the label delay only
        rep.note(f"  {what}: their Kafka timestamp is taken as the label's time (it only "
                 "feeds calmon_label_delay_seconds)")
        return
    rep.note(f"  warning: {what}: the daemon takes their Kafka timestamp (when they were "
             "produced) as the prediction time, and `calmon replay` of the same records "
             f"rejects them as missing_ts; if they carry their time under another path, "
             f"set {key}")


def _present(value: bytes | None, path: str) -> bool:
    """Whether a record that parsed holds a non-null value at the dotted ``path``."""
    try:
        obj: Any = json.loads(value or b"")
        for part in path.split("."):
            obj = obj[part]
    except (ValueError, KeyError, TypeError, IndexError, RecursionError):
        return False
    return obj is not None


def _render(rec: Prediction | Label, kafka_ts: bool, ts_key: str, ts_path: str) -> str:
    """One parsed record, its fields as the engine holds them."""
    def when(ts: float | None) -> str:
        if ts is None:
            return "none"
        iso = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))
        return f"{ts:.3f} ({iso}, " + ("the Kafka timestamp" if kafka_ts
                                        else f"from {ts_key} {ts_path!r}") + ")"

    if isinstance(rec, Label):
        model = "" if rec.model is None else f", model {rec.model!r}"
        return f"label: id {rec.id!r}, label {rec.label}{model}, ts {when(rec.ts)}"
    score = (f"{rec.score:.6g}" if rec.kind in BINARY_KINDS
             else "[" + ", ".join(f"{v:.4g}" for v in rec.score[:8])
             + (", ..." if len(rec.score) > 8 else "") + f"] ({len(rec.score)} classes)")
    seg = ", ".join(f"{k}={v}" for k, v in rec.segment.items()) or "none"
    return (f"prediction: id {rec.id!r}, model {rec.model!r}, ts {when(rec.ts)}, "
            f"segment {seg}, {rec.kind} {score}")
