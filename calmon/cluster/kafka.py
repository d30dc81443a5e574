"""The scaled-out roles on Kafka's own machinery (contract §7).

- ``JoinedProducer``: an instance's joined batches onto ``kafka.joined_topic``, keyed by
  model (the producer's murmur2 partitioner maps a model to its partition, hence owner);
  ``send`` returns True only once the broker acknowledged every batch.
- ``Publisher``: one transactional producer per owned joined-topic partition,
  ``transactional.id = <group_id>-recal-<partition>``. When a new owner initialises
  that id the broker fences the former one: its commit raises, and its open
  transaction is aborted, so readers with ``read_committed`` never see it. No
  check-then-act generation test: the broker decides.
- ``read_back``: on assignment, the owner writes a marker (its own key, no ``model`` or
  ``segment``) to every partition of ``calibrators_topic`` in a transaction, then reads
  every partition from the start up to its marker: everything committed before it
  took over, never trusting a high-water mark.
- ``materialise``: the topic's documents as ``output_dir``'s files (a local view: what
  the registry numbers versions from), phantom versions of a fenced publish removed.
  Only records that ``documents.document`` takes (valid, and signed when signing is on)
  ever get there; the rest are handed to a ``Refuse`` callback.
"""

from __future__ import annotations

import json
import logging
import struct
import time
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.errors import InvalidProducerEpochError, KafkaError, ProducerFencedError

from calmon.calibrators.signing import KeyRing, Signer
from calmon.cluster.checks import Refused
from calmon.cluster.documents import MARKER_PREFIX, document
from calmon.config import KafkaConfig
from calmon.errors import NotOwnerError, describe
from calmon.files import atomic_write
from calmon.io.topics import client_settings
from calmon.recal.registry import Registry

log = logging.getLogger(__name__)

READ_BACK_TIMEOUT_S = 60.0
BROKER_MAX_MESSAGE = 1_048_588  # Kafka's default message.max.bytes
RECORD_OVERHEAD = 16 << 10  # a record's key, headers (the signature) and batch framing

# (record, reason, why): a refused record of calibrators_topic, counted by the caller
Refuse = Callable[[Any, str, str], None]


def _producer_settings(cfg: KafkaConfig) -> dict[str, Any]:
    return {"bootstrap_servers": list(cfg.bootstrap_servers),
            **client_settings(cfg.client, KafkaProducer.DEFAULT_CONFIG, role="producer")}


def _consumer_settings(cfg: KafkaConfig) -> dict[str, Any]:
    return {"bootstrap_servers": list(cfg.bootstrap_servers),
            **client_settings(cfg.client, KafkaConsumer.DEFAULT_CONFIG, role="consumer")}


SIGNATURE_HEADER = "calmon-signature"
_KEY_LEN = struct.Struct(">I")


def signed_bytes(key: bytes | None, value: bytes) -> bytes:
    """What a joined-topic record's signature covers: its key and its value, so a
    signed batch cannot be replayed under another key (and so onto another partition)."""
    k = key or b""
    return _KEY_LEN.pack(len(k)) + k + value


def record_budget(cfg: KafkaConfig) -> int:
    """The largest joined batch one record carries: the producer's ``max_request_size``
    (``kafka.client``, default 1 MiB) and the broker's default ``message.max.bytes``,
    less a record's own overhead."""
    size = int(_producer_settings(cfg).get("max_request_size", 1 << 20))
    return max(64 << 10, min(size, BROKER_MAX_MESSAGE) - RECORD_OVERHEAD)


class JoinedProducer:
    """``signer`` (``calibrators.signing_key``): each batch carries an Ed25519
    signature of its bytes in the ``calmon-signature`` header (deterministic, so a
    re-sent batch carries the same one)."""

    def __init__(self, cfg: KafkaConfig, topic: str, *, timeout_s: float = 30.0,
                 signer: Signer | None = None) -> None:
        self.cfg = cfg
        self.topic = topic
        self.timeout_s = timeout_s
        self.signer = signer
        self._producer: KafkaProducer | None = None

    def send(self, batches: list[tuple[bytes, bytes]]) -> bool:
        try:
            if self._producer is None:
                self._producer = KafkaProducer(acks="all", **_producer_settings(self.cfg))
            futures = [self._producer.send(self.topic, key=k, value=v, headers=(
                None if self.signer is None else
                [(SIGNATURE_HEADER, self.signer.sign_bytes(signed_bytes(k, v)).encode())]))
                for k, v in batches]
            self._producer.flush(timeout=self.timeout_s)
            for f in futures:
                f.get(timeout=self.timeout_s)
            return True
        except Exception as e:  # broker trouble: the batches stay pending, retried later
            log.warning("joined batches not acknowledged yet (%s); retrying at the next "
                        "checkpoint", e)
            return False

    def close(self) -> None:
        if self._producer is not None:
            self._producer.close(timeout=5)
            self._producer = None


FENCED = (ProducerFencedError, InvalidProducerEpochError)  # a newer owner's producer won


def _fenced(producer: KafkaProducer, e: BaseException) -> bool:
    """Whether ``e`` means a newer owner's producer fenced this one. kafka-python raises
    the broker's error itself, or, once its background sender met it first, a bare
    KafkaError ("... in an error state: ProducerFencedError"): its transaction manager
    keeps the error it met (a private attribute, read defensively)."""
    if isinstance(e, FENCED):
        return True
    manager = getattr(producer, "_transaction_manager", None)
    try:
        last = manager.last_error() if manager is not None else None
    except Exception:  # another kafka-python: read the message below
        last = None
    if isinstance(last, FENCED) or (isinstance(last, type) and issubclass(last, FENCED)):
        return True
    # the manager may have moved on (its error reset by the background sender) by the
    # time the bare error is read: the error's own words still name the fence
    return type(e) is KafkaError and any(f.__name__ in str(e) for f in FENCED)


class Publisher:
    """The transactional producers of the owned partitions. A fenced producer raises
    out of ``send`` (the policy counts a failed refit) and is dropped: the partition's
    new owner publishes. Which partition a model's document goes to is the owner's to
    say (``cluster.service``), not this object's."""

    def __init__(self, cfg: KafkaConfig, topic: str, group_id: str) -> None:
        self.cfg = cfg
        self.topic = topic
        self.group_id = group_id  # kafka.group_id
        self.producers: dict[int, KafkaProducer] = {}
        self.fenced: set[int] = set()

    def transactional_id(self, partition: int) -> str:
        return f"{self.group_id}-recal-{partition}"

    def take(self, partition: int) -> KafkaProducer:
        """Become the one writer of ``partition``: fences any former owner."""
        old = self.producers.pop(partition, None)
        if old is not None:
            old.close(timeout=0)
        p = KafkaProducer(transactional_id=self.transactional_id(partition),
                          **_producer_settings(self.cfg))
        p.init_transactions()
        self.producers[partition] = p
        self.fenced.discard(partition)
        return p

    def release(self, partitions: Iterable[int]) -> None:
        for part in partitions:
            p = self.producers.pop(part, None)
            if p is not None:
                p.close(timeout=1)

    def send_in_transaction(self, partition: int,
                            records: list[tuple[bytes, bytes, int | None]]) -> None:
        p = self.producers.get(partition)
        if p is None:
            raise NotOwnerError(f"joined-topic partition {partition} is not owned here")
        try:
            p.begin_transaction()
            for key, value, part in records:
                p.send(self.topic, key=key, value=value, partition=part)
            p.commit_transaction()
        except Exception as e:
            fenced = _fenced(p, e)
            self.fenced.add(partition)
            self.producers.pop(partition, None)
            try:
                p.close(timeout=0)
            except Exception:  # closing a fenced producer may complain too
                log.debug("closing the fenced producer of partition %d raised", partition)
            if fenced:  # a rebalance moved the partition: not a failure here
                raise NotOwnerError(f"joined-topic partition {partition}: fenced by its "
                                    f"newer owner ({describe(e)})") from e
            raise

    def send(self, partition: int, key: str, document: bytes) -> bool:
        """One document in its own transaction of ``partition``'s producer (raises
        NotOwnerError when fenced or not owned here)."""
        self.send_in_transaction(partition, [(key.encode(), document, None)])
        return True

    def close(self) -> None:
        self.release(list(self.producers))


def read_back(publisher: Publisher, partition: int, *,
              timeout_s: float = READ_BACK_TIMEOUT_S, keys: KeyRing | None = None,
              refuse: Refuse | None = None) -> list[tuple[dict[str, Any], bytes]]:
    """Every committed calibrator document of ``calibrators_topic`` (parsed, and its
    bytes) up to a marker this owner wrote to each of its partitions (raises
    TimeoutError when they never show); other records go to ``refuse``."""
    cfg, topic = publisher.cfg, publisher.topic
    consumer = KafkaConsumer(enable_auto_commit=False, isolation_level="read_committed",
                             **_consumer_settings(cfg))
    try:
        parts = sorted(consumer.partitions_for_topic(topic) or ())
        deadline = time.monotonic() + timeout_s
        while not parts and time.monotonic() < deadline:
            time.sleep(0.2)  # metadata still loading
            parts = sorted(consumer.partitions_for_topic(topic) or ())
        if not parts:
            raise TimeoutError(f"kafka.calibrators_topic: {topic} has no partitions")
        nonce = uuid.uuid4().hex
        key = f"{MARKER_PREFIX}{publisher.transactional_id(partition)}".encode()
        value = json.dumps({"marker": nonce, "owner": publisher.transactional_id(partition)}
                           ).encode()
        publisher.send_in_transaction(partition, [(key, value, p) for p in parts])
        tps = [TopicPartition(topic, p) for p in parts]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        waiting = set(parts)
        docs: list[tuple[dict[str, Any], bytes]] = []
        while waiting:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the read-back marker did not come back on "
                                   f"{topic} partitions {sorted(waiting)}")
            for tp, recs in consumer.poll(timeout_ms=500).items():
                for r in recs:
                    if tp.partition not in waiting:
                        break
                    if r.key == key and r.value == value:
                        waiting.discard(tp.partition)
                        continue
                    docs += documents_of([r], keys, refuse)
        return docs
    finally:
        consumer.close()


def documents_of(records: Iterable[Any], keys: KeyRing | None,
                 refuse: Refuse | None) -> list[tuple[dict[str, Any], bytes]]:
    """The documents among ``records`` of the calibrators topic (and their bytes); each
    refused record handed to ``refuse`` (markers and tombstones are neither)."""
    out = []
    for r in records:
        try:
            doc = document(r.key, r.value, keys)
        except Refused as e:
            if refuse is not None:
                refuse(r, e.reason, str(e))
            continue
        if doc is not None:
            out.append((doc, bytes(r.value)))
    return out


def materialise(registry: Registry, docs: list[tuple[dict[str, Any], bytes]], *,
                prune: bool = True) -> int:
    """Write the topic's documents as ``output_dir`` files: every version seen, the
    newest as ``latest.json``; with ``prune`` (``docs`` is the whole topic, read back to
    a marker), local versions newer than the topic's (a fenced owner's publish never
    committed) are removed. Returns the series written."""
    newest: dict[tuple[str, str], tuple[dict[str, Any], bytes]] = {}
    for doc, data in docs:
        k = (str(doc["model"]), str(doc["segment"]))
        d = registry.dir_of(*k)
        d.mkdir(parents=True, exist_ok=True)
        path = d / f"v{doc['version']}.json"
        if not path.exists() or path.read_bytes() != data:
            atomic_write(path, data)
        if k not in newest or doc["version"] >= newest[k][0]["version"]:
            newest[k] = (doc, data)
    for (model, segment), (doc, data) in newest.items():
        sdir: Path = registry.dir_of(model, segment)
        local = registry.versions(model, segment)
        if prune:
            for v in local:
                if v > doc["version"]:
                    (sdir / f"v{v}.json").unlink(missing_ok=True)
        elif local and local[-1] > doc["version"]:
            continue  # a newer local version (this owner's own) stays latest
        latest = sdir / "latest.json"
        if not latest.exists() or latest.read_bytes() != data:
            atomic_write(latest, data)
    return len(newest)
