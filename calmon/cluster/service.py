"""The scaled-out recalibration of one instance: its sender (every checkpoint) and its
owner thread (the ``<group_id>-recal`` consumer group on ``kafka.joined_topic``).

The owner thread is the only one that touches the group consumer, the transactional
producers and the policy: it polls joined batches into the owner, and every
``recalibration.interval`` checks the models of the partitions it holds through the
in-process loop's own driver (``recal.driver``). The rebalance listener only hands the
group's decisions to ``assigned`` and ``revoked``; the owner's state is made and dropped
per partition there (``cluster.owner``). On an
assignment it first becomes the one writer of each new partition (``Publisher.take``:
the broker fences the former owner), reads ``calibrators_topic`` back to its own marker
into ``output_dir``, and seeks to the offsets its checkpoint holds, or to the start of
the partition when it never owned it (the topic's retention holds the buffer).
Readers get immutable values published by that thread.

A record of either internal topic that fails its checks (``cluster.checks`` for joined
batches, ``cluster.documents`` for calibrators) is counted under the topic's own name in
``calmon_invalid_records_total``, dead-lettered when ``kafka.dead_letter_topic`` is set,
and skipped: no such record stops the owner or reaches ``output_dir``.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

from kafka import ConsumerRebalanceListener, KafkaConsumer, TopicPartition

from calmon.calibrators.signing import Signer
from calmon.cluster.admin import apply_rollback, decode_request
from calmon.cluster.checks import JOINED_REASONS, LogOnce
from calmon.cluster.documents import CALIBRATOR_REASONS, trusted_keys
from calmon.cluster.kafka import (
    READ_BACK_TIMEOUT_S,
    SIGNATURE_HEADER,
    JoinedProducer,
    Publisher,
    _consumer_settings,
    documents_of,
    materialise,
    read_back,
    record_budget,
    signed_bytes,
)
from calmon.cluster.owner import Owner, Place
from calmon.cluster.reach import InputEnds
from calmon.cluster.sender import JoinedSender, SampleSource
from calmon.config import Config
from calmon.engine.metrics import Bins
from calmon.errors import CalibratorError, NotOwnerError
from calmon.recal.alerts import AlertSender
from calmon.recal.driver import Driver
from calmon.recal.live import Engineish, LiveCalibrators
from calmon.recal.policy import Policy
from calmon.recal.readmodel import RecalState
from calmon.recal.registry import Registry

log = logging.getLogger(__name__)

POLL_MS = 500
LAG_EVERY_S = 5.0

# (value, reason, "topic/partition/offset"): a refused record to the dead-letter topic
DeadLetter = Callable[[bytes | None, str, str], None]


class Cluster:
    def __init__(self, cfg: Config, engine: Engineish | None = None,
                 dead_letter: DeadLetter | None = None) -> None:
        """``engine``: handed every live calibrator of the topic (whoever owns it), for
        its label-free estimates and score PSI, as the in-process loop does;
        ``dead_letter``: where refused records of the internal topics go."""
        kc = cfg.kafka
        assert kc.joined_topic is not None and kc.calibrators_topic is not None
        self.cfg = cfg
        self.topic = kc.joined_topic
        self.group = f"{kc.group_id}-recal"
        self.sender = JoinedSender(kc.static.index if kc.static is not None else 0,
                                   cfg.recalibration.buffer, record_budget(kc))
        signer = Signer.from_config(cfg.calibrators)
        self.producer = JoinedProducer(kc, self.topic, signer=signer)
        # joined batches are refit material and documents are served: with a signing
        # key, only signed ones count (verified with calibrators.verify_keys, else with
        # the instances' shared key)
        self.keys = trusted_keys(cfg.calibrators)
        self.dead_letter = dead_letter
        self.cal_refused: Counter[str] = Counter()  # calibrators-topic records refused
        self._log_due = LogOnce()
        self._joined_partitions: int | None = None
        self.publisher = Publisher(kc, kc.calibrators_topic, kc.group_id)
        self.registry = Registry(cfg.recalibration.output_dir, self._publish,
                                 signer=Signer.from_config(cfg.calibrators),
                                 verify_keys=cfg.calibrators.verify_keys, topic_first=True)
        self.policy = Policy(cfg, self.registry)
        self.owner = Owner(self.policy, cfg.recalibration.buffer)
        self.owned: frozenset[int] = frozenset()
        self.waiting: set[int] = set()  # assigned, not taken over yet (paused)
        self.takeover_failures = 0
        self.lag: dict[tuple[str, int], int] = {}
        self.changes = 0  # owner steps since start: the checkpoint's "anything new?"
        self.engine = engine
        self.alerts = AlertSender(cfg.alerts.webhook)  # refit reports, from the owner
        # output_dir's live calibrators, read by the owner thread (never by scrapes)
        self.live = LiveCalibrators(self.registry, engine)
        # the policy run and what follows it, as the in-process loop's; a series
        # without a calibrator reads its (cluster-wide) raw ECE from the buffer
        self.driver = Driver(cfg, self.policy, self.live, self.alerts,
                             alarms_to_engine=False)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._wake = threading.Event()  # tests: run a check now

    @property
    def outcomes(self) -> Mapping[tuple[str, str, str, str], int]:
        """Refits by (model, segment, method, outcome) since start."""
        return self.driver.outcomes

    def _publish(self, model: str, segment: str, _doc: dict[str, Any], data: bytes) -> bool:
        """The registry's publish: the document to the calibrators topic through the
        producer of the owned joined-topic partition its model is keyed to (the owner
        thread's own reading; raises NotOwnerError when none is owned here)."""
        partition = self.owner.partition_of(model)
        if partition is None or partition not in self.owned:
            raise NotOwnerError(f"model {model!r} has no joined-topic partition here")
        return self.publisher.send(partition, f"{model}/{segment}", data)

    # ------------------------------------------------------------ the sender

    def collect(self, engine: SampleSource, positions: dict[tuple[str, int], int]) -> None:
        self.sender.collect(engine, positions)

    def flush(self) -> bool:
        return self.sender.flush(self.producer.send)

    # ------------------------------------------------------------ state

    def snapshot(self) -> dict[str, Any]:
        return {"sender": self.sender.snapshot(), "owner": self.owner.snapshot()}

    def restore(self, snap: dict[str, Any]) -> None:
        if isinstance(snap.get("sender"), dict):
            self.sender.restore(snap["sender"])
        if isinstance(snap.get("owner"), dict):
            self.owner.restore(snap["owner"])

    def restore_sender(self, snap: dict[str, Any] | None) -> None:
        """A roll-back of the engine: the sender's marks go back with it."""
        self.sender = JoinedSender(self.sender.index, self.sender.capacity,
                                   self.sender.max_bytes)
        if snap is not None and isinstance(snap.get("sender"), dict):
            self.sender.restore(snap["sender"])

    def status(self) -> dict[str, Any]:
        """What /status shows of the owner: its partitions, and per owned model the
        samples it took (its ``__all__`` ring's total) and its event time; the checks done."""
        owned = self.owned
        return {"owned_partitions": sorted(owned),
                "waiting_partitions": sorted(self.waiting),
                "models": {m: {"samples": self.owner.sample_count(m),
                               "now": _finite(self.owner.now_of(m))}
                           for m in self.owner.models(owned)},
                "duplicates": self.owner.duplicates, "bad_batches": self.owner.bad,
                "refused": _nested(self.invalid()),
                "pending_batches": len(self.sender.pending), "checks": self.driver.checks}

    def metrics_state(self) -> RecalState:
        parts = self.owned  # one reading of it (the owner thread replaces it whole)
        owned = set(self.owner.models(parts))
        st = self.driver.state(self.owner.series_of(parts), owned.__contains__)
        st.owned_models = len(owned)
        st.invalid = self.invalid()
        return st

    def invalid(self) -> dict[tuple[str, str], int]:
        """Refused records of the internal topics by (topic, reason), every reason
        present from the start (so rate() alerts work)."""
        with self.owner.lock:
            joined, cal = dict(self.owner.refused), dict(self.cal_refused)
        cal_topic = str(self.cfg.kafka.calibrators_topic)
        return {**{(self.topic, r): joined.get(r, 0) for r in JOINED_REASONS},
                **{(cal_topic, r): cal.get(r, 0) for r in CALIBRATOR_REASONS}}

    def calibrated_bins(self, model: str, segment: str, window: str) -> Bins | None:
        """The /reliability page's calibrated diagram of an owned model's series, as of
        the last check (all instances' samples after the live calibrator's fit); None
        without a calibrator, or when another instance owns the model."""
        if model not in self.owner.models(self.owned):
            return None
        return self.driver.calibrated_bins.get((model, segment, window))

    # ------------------------------------------------------------ the owner thread

    def __enter__(self) -> Cluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        self.alerts.start()
        self._stop.clear()
        self._thread = threading.Thread(target=self._run_safely, name="calmon-recal-owner",
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=15)
            self._thread = None
        self.producer.close()
        self.alerts.stop()

    def check_now(self) -> None:
        self._wake.set()

    def _run_safely(self) -> None:
        while not self._stop.is_set():
            try:
                self._run()
            except Exception:  # the owner thread must not die: a new consumer, a rejoin
                log.exception("the recalibration owner failed; rejoining %s", self.group)
                self._stop.wait(2.0)

    def _run(self) -> None:
        settings = _consumer_settings(self.cfg.kafka)
        consumer = KafkaConsumer(group_id=self.group, enable_auto_commit=False,
                                 isolation_level="read_committed",
                                 auto_offset_reset="earliest", **settings)
        listener = _Listener(self, consumer)
        consumer.subscribe([self.topic], listener=listener)
        interval = float(self.cfg.recalibration.interval)
        next_check = time.monotonic() + min(interval, 15.0)
        next_lag = 0.0
        follow = self._follower(settings)
        ends = InputEnds(settings)
        self.live.refresh()  # what is on disk already serves the estimates
        try:
            while not self._stop.is_set():
                ends.round = time.monotonic()
                for tp, recs in consumer.poll(timeout_ms=POLL_MS).items():
                    if tp.partition not in self.owned:
                        continue
                    if self._joined_partitions is None:
                        self._joined_partitions = len(
                            consumer.partitions_for_topic(self.topic) or ()) or None
                    for r in recs:
                        self._record(r, ends)
                    self.changes += 1  # a checkpoint is due (no new data: none)
                if time.monotonic() >= next_check or self._wake.is_set():
                    self._wake.clear()
                    self._check()
                    next_check = time.monotonic() + interval
                if time.monotonic() >= next_lag:
                    if self.waiting:
                        self.take_over(consumer, set(self.waiting))
                    self._lag(consumer)
                    self._follow(follow)
                    next_lag = time.monotonic() + LAG_EVERY_S
        finally:
            self.publisher.close()
            self.owned = frozenset()
            self.waiting = set()
            # what this member held waits for the next assignment, as on a revoke
            self.owner.revoke(list(self.owner.parts))
            consumer.close()
            follow.close()
            ends.close()

    def _record(self, r: Any, ends: InputEnds) -> None:
        """One record of an owned joined-topic partition: a rollback request, a batch,
        or a refused record (counted, dead-lettered)."""
        why = self._unauthentic(r.key, r.value, r.headers)
        req = decode_request(r.value) if why is None else None
        if why is not None:
            self.owner.reject(r.partition, r.offset, why)
            got: bool | str = "bad_signature"
        elif req is not None:
            if req["model"].encode() == r.key:
                self._rollback(r.partition, r.offset, req)
                return
            self.owner.reject(r.partition, r.offset, "a rollback request keyed by "
                              "another model", "bad_key")
            got = "bad_key"
        else:
            got = self.owner.admit(r.partition, r.offset, r.value, Place(
                r.key, self._joined_partitions, ends.end))
        if isinstance(got, str) and self.dead_letter is not None:
            self.dead_letter(r.value, got, f"{r.topic}/{r.partition}/{r.offset}")

    def _refuse_document(self, r: Any, reason: str, why: str) -> None:
        """A calibrators-topic record that is no document to serve: nothing written."""
        with self.owner.lock:
            self.cal_refused[reason] += 1
        if self._log_due(reason):
            log.warning("skipping %s record %d/%d (%s): %s; nothing of it is written; "
                        "counted in calmon_invalid_records_total, not logged again for "
                        "this reason for a minute", r.topic, r.partition, r.offset, reason,
                        why[:300])
        if self.dead_letter is not None:
            self.dead_letter(r.value, reason, f"{r.topic}/{r.partition}/{r.offset}")

    def _follower(self, settings: dict[str, Any]) -> KafkaConsumer:
        """A reader of every committed document of the calibrators topic, from the
        start: ``output_dir`` follows the whole topic, not only the owned models."""
        follow = KafkaConsumer(enable_auto_commit=False, isolation_level="read_committed",
                               **settings)
        self._follow_from_start(follow)
        return follow

    def _follow_from_start(self, follow: KafkaConsumer) -> None:
        topic = self.publisher.topic
        parts = follow.partitions_for_topic(topic) or set()
        tps = [TopicPartition(topic, p) for p in sorted(parts)]
        follow.assign(tps)
        if tps:
            follow.seek_to_beginning(*tps)

    def _follow(self, follow: KafkaConsumer) -> None:
        docs = []
        try:
            if not follow.assignment():  # the topic was not there at the start
                self._follow_from_start(follow)
            for recs in follow.poll(timeout_ms=0, max_records=10_000).values():
                docs += documents_of(recs, self.keys, self._refuse_document)
        except Exception as e:  # best effort: the next round reads on
            log.debug("following %s: %s", self.publisher.topic, e)
        if docs:
            materialise(self.registry, docs, prune=False)
            self.live.refresh()

    def _rollback(self, partition: int, offset: int, req: dict[str, Any]) -> None:
        """A ``calmon calibrators rollback`` of a model on this partition: done here, by
        its owner, through the partition's transactional producer."""
        self.owner.request(partition, offset, req["model"])
        try:
            doc = apply_rollback(self.registry, req)
        except Exception as e:  # a bad request or a fenced producer: logged, skipped
            log.warning("rollback of %s/%s to v%s refused: %s", req["model"],
                        req["segment"], req["to"], e)
            return
        if doc is not None:
            log.info("rollback: %s/%s v%d republished as v%d", req["model"],
                     req["segment"], req["to"], doc["version"])
            self.live.refresh()
        self.changes += 1

    def _unauthentic(self, key: bytes | None, value: bytes | None,
                     headers: Any) -> str | None:
        if self.keys is None:
            return None
        sig = next((v for k, v in headers or () if k == SIGNATURE_HEADER), None)
        try:
            self.keys.verify_bytes(signed_bytes(key, value or b""), None if sig is None
                                   else bytes(sig).decode("ascii", "replace"))
        except CalibratorError as e:
            return f"joined batch refused: {e}"
        return None

    def _check(self) -> None:
        """One check of the owned models' series on the samples of every instance (the
        calibrated ECE and diagrams too, so that scrapes only read them)."""
        owned = self.owned
        events = self.driver.run(self.owner.now_of, self.owner.series_of(owned),
                                 self.owner.samples_of)
        if events:
            self.changes += 1
        lost = self.publisher.fenced & self.owned
        if lost:  # fenced: a newer owner took them; what this one held is stale now
            log.warning("fenced on joined-topic partitions %s: another instance owns them",
                        sorted(lost))
            self.owned = frozenset(self.owned - lost)
            self.owner.drop(lost)

    def assigned(self, consumer: KafkaConsumer, parts: set[int]) -> None:
        """The group assigned ``parts`` (the rebalance listener's call): their states
        made or kept, what went elsewhere dropped, and the partitions taken over."""
        self.owner.assign(parts)
        if parts:
            self.take_over(consumer, parts)

    def revoked(self, parts: set[int]) -> None:
        """The group took ``parts`` back: neither read, checked nor published any more;
        their state waits for the next assignment (it may hand them straight back)."""
        self.owned = frozenset(self.owned - parts)
        self.waiting -= parts
        self.publisher.release(parts)
        self.owner.revoke(parts)
        log.info("recalibration ownership of joined-topic partitions %s released",
                 sorted(parts))

    def take_over(self, consumer: KafkaConsumer, parts: set[int]) -> bool:
        """Become the one writer of ``parts`` (the broker fences each former owner), read
        the calibrators back to this owner's marker, and read the partitions on from
        where the checkpoint left them (from the start when never owned here). When the
        broker or the calibrators topic is not there yet, the partitions are paused,
        neither read nor checked, and taken over at a later attempt (``waiting``)."""
        t0 = time.monotonic()
        self._joined_partitions = None  # asked again: partitions may have been added
        tps = [TopicPartition(self.topic, p) for p in sorted(parts)]
        try:
            for p in sorted(parts):
                self.publisher.take(p)
            # one read-back covers them all: every fenced writer is done by now. Within
            # half the poll interval, so a slow broker does not cost the membership
            limit = consumer.config["max_poll_interval_ms"] / 2000.0
            materialise(self.registry, read_back(
                self.publisher, min(parts), timeout_s=min(READ_BACK_TIMEOUT_S, limit),
                keys=self.keys))  # refusals: counted once, by the follower
            self.live.refresh()
        except Exception as e:
            consumer.pause(*tps)
            self.waiting |= parts
            self.takeover_failures += 1
            log.warning("cannot take over joined-topic partitions %s yet (%s); paused, "
                        "retrying", sorted(parts), e)
            return False
        for tp in tps:
            at = self.owner.offset(tp.partition)
            if at is None:
                consumer.seek_to_beginning(tp)
            else:
                consumer.seek(tp, at)
        consumer.resume(*tps)
        self.waiting -= parts
        self.owned = frozenset(self.owned | parts)
        log.info("recalibration owner of joined-topic partitions %s (models %s), taken "
                 "over in %.1fs", sorted(self.owned), self.owner.models(self.owned) or
                 "none yet", time.monotonic() - t0)
        return True

    def _lag(self, consumer: KafkaConsumer) -> None:
        tps = [TopicPartition(self.topic, p) for p in sorted(self.owned)]
        if not tps:
            self.lag = {}
            return
        try:
            ends = consumer.end_offsets(tps)
        except Exception as e:  # lag is best effort
            log.debug("end offsets of %s: %s", self.topic, e)
            return
        self.lag = {(self.topic, tp.partition): max(0, end - (self.owner.offset(
            tp.partition) or 0)) for tp, end in ends.items()}


def _finite(t: float) -> float | None:
    return t if math.isfinite(t) else None


def _nested(counts: dict[tuple[str, str], int]) -> dict[str, dict[str, int]]:
    """{topic: {reason: n}} of the non-zero counts (JSON has no tuple keys)."""
    out: dict[str, dict[str, int]] = {}
    for (topic, reason), n in sorted(counts.items()):
        if n:
            out.setdefault(topic, {})[reason] = n
    return out


class _Listener(ConsumerRebalanceListener):  # type: ignore[misc]
    """Hands the group's decisions to the cluster; edits nothing of its own."""

    def __init__(self, cluster: Cluster, consumer: KafkaConsumer) -> None:
        self.c = cluster
        self.consumer = consumer

    def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        self.c.revoked({tp.partition for tp in revoked})

    def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        self.c.assigned(self.consumer, {tp.partition for tp in assigned})
