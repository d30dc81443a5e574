"""CalibratorWatcher on ``kafka.calibrators_topic`` against the real broker (issue 22):
forged and broken documents are refused while the last good calibrator keeps serving and
the other documents of the same poll are applied; signatures and a key rotation; the
topic is read with isolation_level read_committed. Expected outputs are scipy's."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from scipy.special import expit, softmax

from calmon.calibrators import CalibratorWatcher
from calmon.calibrators.signing import Signer, keygen
from tests.conftest import FAST_CLIENT
from tests.daemon_helpers import wait_until

pytestmark = pytest.mark.integration

Z = np.array([-4.0, -0.3, 0.0, 0.1, 2.5, 9.0])
ZZ = np.random.default_rng(5).normal(0, 2, (40, 3))


def doc(model: str, version: int, t: float, **extra: Any) -> dict[str, Any]:
    return {"model": model, "segment": "__all__", "version": version, "method": "temperature",
            "params": {"temperature": t}, "input": "logit", **extra}


def intent(version: int, t: float) -> dict[str, Any]:
    return {**doc("intent", version, t), "input": "logits"}


def produce(bootstrap: str, topic: str, values: list[tuple[str, bytes | None]]) -> None:
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, request_timeout_ms=10_000,
                             max_request_size=4 * 1024 * 1024)
    try:
        for key, value in values:
            producer.send(topic, key=key.encode(), value=value).get(10)
    finally:
        producer.close(timeout=5)


def as_bytes(d: dict[str, Any]) -> bytes:
    return json.dumps(d).encode()


def serves(w: CalibratorWatcher, model: str, t: float) -> bool:
    if model == "intent":
        return bool(np.allclose(w.apply("intent", ZZ), softmax(ZZ / t, axis=1), rtol=1e-12))
    return bool(np.allclose(w.apply(model, Z), np.clip(expit(Z / t), 1e-7, 1 - 1e-7),
                            rtol=1e-12, atol=0))


def test_the_topic_watcher_refuses_forged_and_broken_documents(
        kafka_bootstrap: str, kafka_topics: Callable[..., list[str]]) -> None:
    (topic,) = kafka_topics(count=1, partitions=1)
    private, public = keygen()
    signer = Signer(private, "k1")
    keys = [{"id": "k1", "public_key": public}]
    produce(kafka_bootstrap, topic, [("ctr/__all__", as_bytes(signer.sign(doc("ctr", 1, 1.5)))),
                                     ("intent/__all__", as_bytes(signer.sign(intent(1, 3.0))))])
    w = CalibratorWatcher(topic=topic, bootstrap_servers=kafka_bootstrap, min_interval=0.05,
                          consumer_settings=dict(FAST_CLIENT), verify_keys=keys)
    try:
        assert w._consumer.config["isolation_level"] == "read_committed"  # contract §7
        assert w.wait_ready(30), "the watcher never read the topic to its end"
        assert w.version("ctr") == 1 and serves(w, "ctr", 1.5)
        assert w.version("intent") == 1 and serves(w, "intent", 3.0)

        n = 2_000_000 // 20
        big = {**doc("ctr", 2, 1.0), "method": "isotonic", "params": {
            "x": np.linspace(0, 1, n).tolist(), "y": np.linspace(0.01, 0.99, n).tolist()}}
        bad: list[bytes] = [
            as_bytes(signer.sign(doc("ctr", 2, 10**400))),  # a 401-digit parameter
            as_bytes(signer.sign(doc("ctr", 10**30, 0.5))),  # would pin the model forever
            as_bytes(signer.sign(doc("ctr", 5000, 0.5))),  # an implausible jump
            as_bytes(signer.sign({**doc("ctr", 2, 0.5), "input": "probs"})),  # binary model
            as_bytes(signer.sign({**doc("ctr", 2, 0.5), "method": "platt",
                                  "params": {"a": -5.0, "b": 0.0}})),  # inverted
            as_bytes(signer.sign(doc("ctr", 2, 1e-300))),
            as_bytes(signer.sign({**doc("ctr", 2, 0.5), "method": "isotonic", "params": {
                "x": [0.2, 0.8], "y": [0.0, 1.0]}})),  # certainties
            json.dumps(signer.sign(big)).encode(),  # over 1 MiB
            as_bytes(doc("ctr", 2, 0.5)),  # unsigned
            as_bytes({**signer.sign(doc("ctr", 2, 0.9)), "params": {"temperature": 0.5}}),
            as_bytes(Signer(keygen()[0], "k2").sign(doc("ctr", 2, 0.5))),  # unknown key
            b"{not json",
            as_bytes(signer.sign(intent(3, 0.5))),  # under ctr's key
        ]
        assert len(bad[7]) > 1 << 20
        # the bad ones, a marker (no model, no segment: not a document) and a tombstone,
        # then a good document of another model in the same poll
        produce(kafka_bootstrap, topic,
                [("ctr/__all__", b) for b in bad]
                + [("marker/x", b'{"marker": 1}'), ("ctr/__all__", None),
                   ("intent/__all__", as_bytes(signer.sign(intent(2, 1.2))))])
        wait_until(lambda: w.version("intent") == 2, 30, "intent v2 applied")
        assert w.refusals() == {"ctr/__all__": len(bad)}
        assert w.version("ctr") == 1 and serves(w, "ctr", 1.5)  # the last good one
        assert serves(w, "intent", 1.2)

        produce(kafka_bootstrap, topic, [("ctr/__all__", as_bytes(signer.sign(doc("ctr", 2,
                                                                                   0.8))))])
        wait_until(lambda: w.version("ctr") == 2, 30, "ctr v2 applied")
        assert serves(w, "ctr", 0.8)
    finally:
        w.close()


def test_a_key_rotation_on_the_topic(
        kafka_bootstrap: str, kafka_topics: Callable[..., list[str]]) -> None:
    """v1 signed by the old key, v2 by the new one: a watcher given both serves v2; after
    the old key is removed a fresh watcher still serves v2 and refuses v1."""
    (topic,) = kafka_topics(count=1, partitions=1)
    old_private, old_public = keygen()
    new_private, new_public = keygen()
    old = {"id": "2026-01", "public_key": old_public}
    new = {"id": "2026-07", "public_key": new_public}
    produce(kafka_bootstrap, topic,
            [("ctr/__all__", as_bytes(Signer(old_private, old["id"]).sign(doc("ctr", 1, 1.5))))])

    def watcher(keys: list[dict[str, str]]) -> CalibratorWatcher:
        w = CalibratorWatcher(topic=topic, bootstrap_servers=kafka_bootstrap,
                              min_interval=0.05, consumer_settings=dict(FAST_CLIENT),
                              verify_keys=keys)
        assert w.wait_ready(30)
        return w

    both = watcher([old, new])
    try:
        assert both.version("ctr") == 1 and serves(both, "ctr", 1.5)
        produce(kafka_bootstrap, topic, [
            ("ctr/__all__", as_bytes(Signer(new_private, new["id"]).sign(doc("ctr", 2, 0.7))))])
        wait_until(lambda: both.version("ctr") == 2, 30, "v2 under the new key")
        assert serves(both, "ctr", 0.7) and both.refused == 0
    finally:
        both.close()
    only_new = watcher([new])
    try:
        assert only_new.version("ctr") == 2 and serves(only_new, "ctr", 0.7)
        assert only_new.refusals() == {"ctr/__all__": 1}  # v1, by the removed key
    finally:
        only_new.close()


def test_apply_answers_while_a_14_mb_record_is_refreshed(
        kafka_bootstrap: str, kafka_topics: Callable[..., list[str]],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The refresh thread is held inside parsing a 14 MB record of another model; apply()
    answers meanwhile, and the record is then refused."""
    from calmon.calibrators import watcher as watcher_mod

    (topic,) = kafka_topics(count=1, partitions=1)
    produce(kafka_bootstrap, topic, [("ctr/__all__", as_bytes(doc("ctr", 1, 1.5)))])
    inside, release, finished = threading.Event(), threading.Event(), threading.Event()
    real = watcher_mod.parse_document

    def held_parse(data: bytes) -> Any:
        if len(data) > 14_000_000:
            inside.set()
            release.wait(60)
            try:
                return real(data)
            finally:
                finished.set()
        return real(data)

    monkeypatch.setattr(watcher_mod, "parse_document", held_parse)
    n = 600_000
    big = {**doc("big", 1, 1.0), "method": "isotonic", "params": {
        "x": np.linspace(0, 1, n).tolist(), "y": np.linspace(0.01, 0.99, n).tolist()}}
    data = json.dumps(big).encode()
    assert len(data) > 14_000_000
    with CalibratorWatcher(topic=topic, bootstrap_servers=kafka_bootstrap, min_interval=0.05,
                           consumer_settings={**FAST_CLIENT,
                                              "max_partition_fetch_bytes": 32 << 20}) as w:
        assert w.wait_ready(30) and serves(w, "ctr", 1.5)
        producer_settings = {"max_request_size": 32 << 20}
        from kafka import KafkaProducer

        producer = KafkaProducer(bootstrap_servers=kafka_bootstrap, request_timeout_ms=30_000,
                                 **producer_settings)
        try:
            producer.send(topic, key=b"big/__all__", value=data).get(30)
        finally:
            producer.close(timeout=5)
        assert inside.wait(60), "the refresh never reached the big record"
        for _ in range(100):
            assert serves(w, "ctr", 1.5)
        assert not finished.is_set()  # every apply returned while the refresh was running
        release.set()
        wait_until(lambda: w.refusals() == {"big/__all__": 1}, 30, "the big record refused")
        assert serves(w, "ctr", 1.5)
