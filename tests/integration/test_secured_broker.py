"""A SASL_SSL listener (SCRAM-SHA-512, a certificate from a throwaway CA) on the Apache
Kafka fixture: the daemon, the probe, the topic watcher and the cluster's publisher
connect through ``kafka.client`` with both client libraries, and a wrong password or
an untrusted CA is a startup error that names the setting to fix, within 60 s."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from scipy.special import expit

from calmon import config as config_mod
from calmon.calibrators import CalibratorWatcher
from calmon.cli import main
from calmon.cluster.kafka import Publisher, read_back
from tests.brokers.apache import Secured
from tests.conftest import Broker, create_topics, produce, unique_topic
from tests.daemon_helpers import (
    CalmonDaemon,
    Producer,
    end_positions,
    http_get,
    interleave,
    make_dataset,
    wait_until,
    write_config,
)
from tests.tls_helpers import make_tls

pytestmark = [pytest.mark.integration, pytest.mark.brokers("kafka")]

NAMED_WITHIN_S = 60.0  # the acceptance bound for naming a refused login or certificate
LIBRARIES = ("kafka-python", "confluent")


@pytest.fixture
def secured(broker: Broker) -> Secured:
    if broker.secured is None:
        pytest.skip(f"the {broker.kind} broker has no SASL_SSL listener")
    return broker.secured


def client_of(s: Secured, **override: Any) -> dict[str, Any]:
    """``kafka.client`` for the SASL_SSL listener, in kafka-python's spelling (calmon
    translates it for librdkafka)."""
    return {"security_protocol": "SASL_SSL", "sasl_mechanism": s.mechanism,
            "sasl_plain_username": s.username, "sasl_plain_password": s.password,
            "ssl_cafile": str(s.ca_file), "request_timeout_ms": 5000,
            "reconnect_backoff_ms": 50, "reconnect_backoff_max_ms": 500, **override}


@pytest.mark.parametrize("library", LIBRARIES)
def test_the_daemon_joins_over_sasl_ssl(library: str, broker: Broker, secured: Secured,
                                        tmp_path: Path) -> None:
    preds_topic, labels_topic = unique_topic(), unique_topic()
    create_topics(broker.bootstrap, [preds_topic, labels_topic], partitions=2)
    preds, labels = make_dataset(200, seed=331)
    cfg = write_config(tmp_path / "calmon.yaml", secured.bootstrap, preds_topic, labels_topic,
                       kafka={"library": library, "client": client_of(secured)})
    with Producer(broker.bootstrap) as producer:  # the test's own traffic: PLAINTEXT
        sent = producer.send(interleave(preds, labels, preds_topic, labels_topic, seed=332))
    with CalmonDaemon(cfg).start() as daemon:
        daemon.wait_positions(end_positions(sent))
        counters = daemon.counters()
        assert (counters["predictions"], counters["labels"], counters["joined"]) == (
            200, 200, 200)
        assert http_get(daemon.port, "/readyz")[0] == 200


def _refused_at_start(cfg: Path) -> tuple[int, float, str]:
    """(exit code, seconds to exit, log) of a daemon that should refuse to start."""
    daemon = CalmonDaemon(cfg)
    started = time.monotonic()
    daemon.start(wait_ready=False)
    try:
        wait_until(lambda: not daemon.running, NAMED_WITHIN_S + 30, "the daemon to exit",
                   detail=daemon.log_tail)
        assert daemon.proc is not None
        return daemon.proc.returncode, time.monotonic() - started, daemon.log.read_text()
    finally:
        daemon.stop()


@pytest.mark.parametrize("library", LIBRARIES)
def test_a_wrong_password_is_named_at_start(library: str, broker: Broker, secured: Secured,
                                            tmp_path: Path) -> None:
    preds_topic, labels_topic = unique_topic(), unique_topic()
    create_topics(broker.bootstrap, [preds_topic, labels_topic], partitions=1)
    cfg = write_config(tmp_path / "calmon.yaml", secured.bootstrap, preds_topic, labels_topic,
                       kafka={"library": library, "client": client_of(
                           secured, sasl_plain_password="not-the-password")})
    rc, took, log = _refused_at_start(cfg)
    assert rc == 2, log[-3000:]
    assert took < NAMED_WITHIN_S, f"named after {took:.0f}s"
    assert "kafka.client.sasl_plain_password: the broker rejected the SCRAM-SHA-512 " \
           f"credentials for user {secured.username!r}" in log
    assert "not-the-password" not in log  # secrets stay masked in what it says


@pytest.mark.parametrize("library", LIBRARIES)
def test_an_untrusted_ca_is_named_at_start(library: str, broker: Broker, secured: Secured,
                                           tmp_path: Path) -> None:
    other_ca, _, _ = make_tls(tmp_path / "other-ca")
    preds_topic, labels_topic = unique_topic(), unique_topic()
    create_topics(broker.bootstrap, [preds_topic, labels_topic], partitions=1)
    cfg = write_config(tmp_path / "calmon.yaml", secured.bootstrap, preds_topic, labels_topic,
                       kafka={"library": library,
                              "client": client_of(secured, ssl_cafile=str(other_ca))})
    rc, took, log = _refused_at_start(cfg)
    assert rc == 2, log[-3000:]
    assert took < NAMED_WITHIN_S, f"named after {took:.0f}s"
    assert (f"kafka.client.ssl_cafile: the broker's TLS certificate is not trusted by the CA "
            f"in {other_ca}") in log


def _probe_config(tmp_path: Path, s: Secured, preds: str, labels: str,
                  **override: Any) -> Path:
    path = tmp_path / f"probe-{uuid.uuid4().hex[:6]}.yaml"
    path.write_text(json.dumps({"kafka": {"bootstrap_servers": s.bootstrap,
                                          "predictions_topic": preds, "labels_topic": labels,
                                          "client": client_of(s, **override)}}))
    return path


def test_the_probe_connects_and_names_a_refused_login(
        capsys: pytest.CaptureFixture[str], broker: Broker, secured: Secured,
        tmp_path: Path) -> None:
    preds, labels = unique_topic(), unique_topic()
    create_topics(broker.bootstrap, [preds, labels], partitions=2)

    def probe(cfg: Path) -> tuple[int, str]:
        rc = main(["check-config", "-c", str(cfg), "--probe", "--probe-timeout", "10"])
        return rc, capsys.readouterr().out

    rc, out = probe(_probe_config(tmp_path, secured, preds, labels))
    assert rc == 0, out
    assert f"# ok   broker {secured.bootstrap}: connected" in out
    rc, out = probe(_probe_config(tmp_path, secured, preds, labels,
                                  sasl_plain_password="not-the-password"))
    assert rc == 1
    assert "kafka.client.sasl_plain_password: the broker rejected" in out
    other_ca, _, _ = make_tls(tmp_path / "other-ca")
    rc, out = probe(_probe_config(tmp_path, secured, preds, labels, ssl_cafile=str(other_ca)))
    assert rc == 1
    assert "kafka.client.ssl_cafile: the broker's TLS certificate is not trusted" in out


def test_the_topic_watcher_reads_over_sasl_ssl(broker: Broker, secured: Secured) -> None:
    topic = unique_topic("calibrators")
    create_topics(broker.bootstrap, [topic], partitions=1)
    document = {"model": "ctr", "segment": "__all__", "version": 1, "method": "temperature",
                "params": {"temperature": 2.0}, "input": "logit"}
    produce(broker.bootstrap, topic, [json.dumps(document).encode()], keys=[b"ctr/__all__"])
    watcher = CalibratorWatcher(topic=topic, bootstrap_servers=secured.bootstrap,
                                consumer_settings=client_of(secured), min_interval=0.1)
    try:
        z = np.array([-3.0, 0.0, 1.5])
        want = np.clip(expit(z / 2.0), 1e-7, 1 - 1e-7)
        wait_until(lambda: watcher.version("ctr") == 1, 60, "the watcher to serve v1")
        assert np.allclose(watcher.apply("ctr", z), want, rtol=1e-12, atol=0)
    finally:
        watcher.close()


def test_the_owner_publishes_over_sasl_ssl(
        broker: Broker, secured: Secured, kafka_topics: Callable[..., list[str]]) -> None:
    (topic,) = kafka_topics(count=1, partitions=1)
    kafka = config_mod.from_dict({"kafka": {"bootstrap_servers": secured.bootstrap,
                                            "client": client_of(secured)}}).kafka
    publisher = Publisher(kafka, topic, f"calmon-test-{uuid.uuid4().hex[:8]}")
    try:
        publisher.take(0)
        document = {"model": "ctr", "segment": "__all__", "version": 1,
                    "method": "temperature", "input": "logit", "params": {"temperature": 1.5}}
        assert publisher.send(0, "ctr/__all__", (json.dumps(document) + "\n").encode())
        docs = read_back(publisher, 0)  # transactional, read_committed, over SASL_SSL
        assert [(d["version"], d["params"]["temperature"]) for d, _ in docs] == [(1, 1.5)]
    finally:
        publisher.close()


@pytest.mark.parametrize("library", LIBRARIES)
def test_a_login_rejected_while_running_is_the_readyz_reason(
        library: str, private_broker: Broker, tmp_path: Path) -> None:
    """The user's password changes on the broker while calmon runs; the broker
    restarts (SIGKILL), so every connection logs in again and is refused: /readyz
    answers 503 naming the setting, within 60 s, and the daemon keeps running."""
    from kafka.admin import (
        KafkaAdminClient,
        ScramMechanism,
        UserScramCredentialUpsertion,
    )

    broker = private_broker
    assert broker.secured is not None
    user = f"rotating-{uuid.uuid4().hex[:6]}"

    def set_password(password: str) -> None:
        admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap, request_timeout_ms=10000)
        try:
            answer = admin.alter_user_scram_credentials([UserScramCredentialUpsertion(
                user, ScramMechanism.SCRAM_SHA_512, password)])
            assert answer == {user: None}, answer
        finally:
            admin.close()

    set_password("first-password")
    preds_topic, labels_topic = unique_topic(), unique_topic()
    create_topics(broker.bootstrap, [preds_topic, labels_topic], partitions=1)
    preds, labels = make_dataset(50, seed=333)
    client = client_of(broker.secured, sasl_plain_username=user,
                       sasl_plain_password="first-password")
    cfg = write_config(tmp_path / "calmon.yaml", broker.secured.bootstrap, preds_topic,
                       labels_topic, kafka={"library": library, "client": client})
    with Producer(broker.bootstrap) as producer:
        sent = producer.send(interleave(preds, labels, preds_topic, labels_topic, seed=334))
    with CalmonDaemon(cfg).start() as daemon:
        daemon.wait_positions(end_positions(sent))
        set_password("second-password")
        broker.kill()
        broker.start()
        seen: list[tuple[int, bytes]] = []

        def named() -> bool:
            seen.append(http_get(daemon.port, "/readyz", timeout=2.0))
            return seen[-1][0] == 503 and b"kafka.client.sasl_plain_password" in seen[-1][1]

        began = time.monotonic()
        wait_until(named, NAMED_WITHIN_S + 30, "/readyz naming the rejected login",
                   detail=lambda: f"{seen[-3:]}\n{daemon.log_tail()}")
        assert time.monotonic() - began < NAMED_WITHIN_S
        assert seen[-1][1].startswith(b"not ready: the Kafka broker is not reachable: "
                                      b"kafka.client.sasl_plain_password: the broker rejected")
        assert daemon.running
