"""calmon.io.security: a refused login and an untrusted certificate named by the
``kafka.client`` setting to fix (the broker tests are in
tests/integration/test_secured_broker.py)."""

from __future__ import annotations

import socket
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from calmon.config import KafkaConfig
from calmon.io.security import credentials_problem, tls_failure, tls_problem
from tests.tls_helpers import make_tls


@pytest.fixture
def tls_server(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A TLS listener on loopback that completes handshakes: (host:port, its CA)."""
    ca, crt, key = make_tls(tmp_path / "server")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(crt, key)
    sock = socket.create_server(("127.0.0.1", 0))
    sock.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = sock.accept()
            except OSError:
                continue
            try:
                with ctx.wrap_socket(conn, server_side=True):
                    pass
            except (OSError, ssl.SSLError):
                pass  # the client refused our certificate: that is the point

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{sock.getsockname()[1]}", ca
    finally:
        stop.set()
        thread.join(5)
        sock.close()


def test_the_handshake_names_the_cafile_that_does_not_vouch_for_the_broker(
        tls_server: tuple[str, Path], tmp_path: Path) -> None:
    server, ca = tls_server
    other, _, _ = make_tls(tmp_path / "other")
    client = {"security_protocol": "SASL_SSL", "ssl_cafile": str(other)}
    why = tls_problem([server], client)
    assert why is not None
    assert why.startswith(f"kafka.client.ssl_cafile: the broker's TLS certificate is not "
                          f"trusted by the CA in {other}: {server}: ")
    assert tls_problem([server], {**client, "ssl_cafile": str(ca)}) is None  # the right CA
    assert tls_problem([server], {"security_protocol": "PLAINTEXT"}) is None  # no TLS at all


def test_an_unreachable_broker_is_no_certificate_problem(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = f"127.0.0.1:{s.getsockname()[1]}"
    ca, _, _ = make_tls(tmp_path / "ca")
    assert tls_problem([closed], {"security_protocol": "SSL", "ssl_cafile": str(ca)}) is None


def test_messages_use_the_spelling_the_config_uses() -> None:
    native = {"sasl.username": "calmon", "sasl.mechanism": "SCRAM-SHA-256",
              "ssl.ca.location": "/ca.pem"}
    assert credentials_problem(native, "rejected").startswith(
        "kafka.client.sasl.password: the broker rejected the SCRAM-SHA-256 credentials for "
        "user 'calmon' (check kafka.client.sasl.username and the password): rejected")
    assert tls_failure(native, "x: certificate verify failed").startswith(
        "kafka.client.ssl.ca.location: the broker's TLS certificate is not trusted by the "
        "CA in /ca.pem")
    assert tls_failure({"security_protocol": "SSL"}, "wrong version number") == (
        "kafka.client.security_protocol: the TLS handshake with the broker failed: "
        "wrong version number")


def test_the_confluent_source_keeps_why_the_broker_refused_it() -> None:
    confluent = pytest.importorskip("confluent_kafka")
    from calmon.io.confluent_source import ConfluentSource

    source = ConfluentSource(KafkaConfig(
        bootstrap_servers=("127.0.0.1:1",), predictions_topic="p", labels_topic="l",
        library="confluent", client={"sasl_plain_username": "calmon",
                                     "sasl_mechanism": "SCRAM-SHA-512"}))
    assert source.refused() is None
    source._on_error(confluent.KafkaError(confluent.KafkaError._AUTHENTICATION,
                                          "SASL authentication error: invalid credentials"))
    why = source.refused()
    assert why is not None and why.startswith(
        "kafka.client.sasl_plain_password: the broker rejected the SCRAM-SHA-512 "
        "credentials for user 'calmon'")
    source._on_stats('{"brokers": {"b": {"state": "UP"}}}')  # connected again: forgotten
    assert source.refused() is None
