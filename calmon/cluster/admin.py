"""``calmon calibrators list`` and ``rollback`` when scaled out (contract §7): both act
on the calibrators topic's history, whichever instance they run on. ``list`` reads the
topic (committed records only); ``rollback`` asks the model's owner, with a request
record on the model's own joined-topic partition (so it reaches the owner, in order
with the model's samples), and waits for the owner's publish. Only the owner writes the
calibrators topic; a request carries an id, written into the republished document, so
a request read again after a crash is done once.
"""

from __future__ import annotations

import json
import tempfile
import time
import uuid
from datetime import UTC, datetime
from typing import Any

from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from calmon.calibrators import load
from calmon.calibrators.signing import Signer
from calmon.cluster.documents import trusted_keys
from calmon.cluster.kafka import (
    SIGNATURE_HEADER,
    _consumer_settings,
    _producer_settings,
    documents_of,
    materialise,
    signed_bytes,
)
from calmon.config import Config
from calmon.errors import CalibratorError
from calmon.recal.registry import Registry

REQUEST = b"CMR1"  # a rollback request on the joined topic (not a batch: its own magic)


def scaled_out(cfg: Config) -> bool:
    """Whether a model's recalibration has one owner among instances (§7, and §8's
    group mode), its versions on the calibrators topic."""
    inst = cfg.kafka.static
    return ((cfg.kafka.group or (inst is not None and inst.count > 1))
            and cfg.recalibration.enabled
            and cfg.kafka.joined_topic is not None and cfg.kafka.calibrators_topic is not None)


def history(cfg: Config, timeout_s: float = 30.0) -> list[tuple[dict[str, Any], bytes]]:
    """Every committed document of the calibrators topic, oldest first per partition
    (valid ones, signed when signing is on: what an owner takes into ``output_dir``)."""
    topic = cfg.kafka.calibrators_topic
    assert topic is not None
    keys = trusted_keys(cfg.calibrators)
    c = KafkaConsumer(enable_auto_commit=False, isolation_level="read_committed",
                      **_consumer_settings(cfg.kafka))
    try:
        deadline = time.monotonic() + timeout_s
        parts = sorted(c.partitions_for_topic(topic) or ())
        while not parts and time.monotonic() < deadline:
            time.sleep(0.2)
            parts = sorted(c.partitions_for_topic(topic) or ())
        tps = [TopicPartition(topic, p) for p in parts]
        c.assign(tps)
        c.seek_to_beginning(*tps)
        ends = c.end_offsets(tps)
        out: list[tuple[dict[str, Any], bytes]] = []
        while any(c.position(tp) < ends[tp] for tp in tps):
            if time.monotonic() > deadline:
                raise CalibratorError(f"reading {topic} did not finish in {timeout_s:.0f}s")
            for recs in c.poll(timeout_ms=300).values():
                out += documents_of(recs, keys, None)
        return out
    finally:
        c.close()


def registry_view(cfg: Config, directory: str) -> Registry:
    """The topic's history as a registry on ``directory`` (a temporary local view)."""
    reg = Registry(directory, verify_keys=cfg.calibrators.verify_keys)
    materialise(reg, history(cfg))
    return reg


def entries(cfg: Config) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory(prefix="calmon-calibrators-") as d:
        return registry_view(cfg, d).entries()


def encode_request(model: str, segment: str, to: int, request_id: str) -> bytes:
    return REQUEST + json.dumps({"rollback": {"model": model, "segment": segment,
                                             "to": to, "request_id": request_id}}).encode()


def decode_request(data: bytes | None) -> dict[str, Any] | None:
    """The rollback a request record asks for, or None when it is not one."""
    if not data or not data.startswith(REQUEST):
        return None
    try:
        body = json.loads(data[len(REQUEST):])["rollback"]
        return {"model": str(body["model"]), "segment": str(body["segment"]),
                "to": int(body["to"]), "request_id": str(body["request_id"])}
    except (ValueError, KeyError, TypeError):
        return None


def apply_rollback(registry: Registry, req: dict[str, Any]) -> dict[str, Any] | None:
    """The owner's side: republish version ``to`` as the newest, once per request id
    (None when a version already carries it). Raises CalibratorError."""
    model, segment = req["model"], req["segment"]
    for v in registry.versions(model, segment):
        if registry.read(model, segment, v).get("request_id") == req["request_id"]:
            return None
    old = registry.read(model, segment, req["to"])
    load(old, registry.verify_keys)
    doc = {k: v for k, v in old.items() if k not in ("version", "signature")}
    doc.update(trigger="rollback", rollback_of=req["to"], request_id=req["request_id"],
               fitted_at=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))
    return registry.publish(doc)


def rollback(cfg: Config, model: str, segment: str, to: int,
             timeout_s: float = 120.0) -> dict[str, Any]:
    """Ask the owner of ``model`` to republish ``to``; the document it published."""
    with tempfile.TemporaryDirectory(prefix="calmon-calibrators-") as d:
        if to not in registry_view(cfg, d).versions(model, segment):
            raise CalibratorError(f"{model}/{segment}: no version {to} on "
                                  f"{cfg.kafka.calibrators_topic}")
    rid = uuid.uuid4().hex
    value = encode_request(model, segment, to, rid)
    signer = Signer.from_config(cfg.calibrators)
    headers = None if signer is None else [
        (SIGNATURE_HEADER, signer.sign_bytes(signed_bytes(model.encode(), value)).encode())]
    p = KafkaProducer(acks="all", **_producer_settings(cfg.kafka))
    try:
        p.send(str(cfg.kafka.joined_topic), key=model.encode(), value=value,
               headers=headers).get(timeout=30)
    finally:
        p.close(timeout=5)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for doc, _ in history(cfg):
            if doc.get("request_id") == rid:
                return doc
        time.sleep(1.0)
    raise CalibratorError(f"the owner of {model!r} did not publish the rollback within "
                       f"{timeout_s:.0f}s (is calmon running?)")
