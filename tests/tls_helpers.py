"""Throwaway CAs, server and client certificates for TLS tests (made with ``cryptography``)."""

from __future__ import annotations

import datetime as dt
import ipaddress
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from prometheus_client import Counter

from calmon.io import webconfig
from calmon.io.exposition import new_registry
from calmon.io.http import HttpServer


class TestCA:
    """A CA valid for a day; ``issue`` writes a certificate and key it signed."""

    __test__ = False  # not a pytest test class

    def __init__(self, name: str = "calmon test CA") -> None:
        now = dt.datetime.now(dt.UTC)
        self.key = ec.generate_private_key(ec.SECP256R1())
        self.name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        self.cert = (x509.CertificateBuilder().subject_name(self.name).issuer_name(self.name)
                     .public_key(self.key.public_key()).serial_number(x509.random_serial_number())
                     .not_valid_before(now - dt.timedelta(minutes=5))
                     .not_valid_after(now + dt.timedelta(days=1))
                     .add_extension(x509.BasicConstraints(ca=True, path_length=None),
                                    critical=True)
                     .sign(self.key, hashes.SHA256()))

    def write(self, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(self.cert.public_bytes(serialization.Encoding.PEM))
        return path

    def issue(self, crt: Path, key: Path, common_name: str,
              sans: list[x509.GeneralName] | None = None) -> tuple[Path, Path]:
        """A leaf for ``common_name`` with ``sans`` (none: no SAN extension) at crt, key."""
        now = dt.datetime.now(dt.UTC)
        leaf_key = ec.generate_private_key(ec.SECP256R1())
        builder = (x509.CertificateBuilder()
                   .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME,
                                                               common_name)]))
                   .issuer_name(self.name).public_key(leaf_key.public_key())
                   .serial_number(x509.random_serial_number())
                   .not_valid_before(now - dt.timedelta(minutes=5))
                   .not_valid_after(now + dt.timedelta(days=1)))
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = builder.sign(self.key, hashes.SHA256())
        crt.parent.mkdir(parents=True, exist_ok=True)
        crt.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        key.write_bytes(leaf_key.private_bytes(serialization.Encoding.PEM,
                                               serialization.PrivateFormat.PKCS8,
                                               serialization.NoEncryption()))
        return crt, key

    def issue_server(self, crt: Path, key: Path) -> tuple[Path, Path]:
        """A server certificate for 127.0.0.1 and localhost."""
        return self.issue(crt, key, "calmon", [
            x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))])


def make_tls(directory: Path) -> tuple[Path, Path, Path]:
    """(ca.crt, server.crt, server.key) for 127.0.0.1 and localhost, valid for a day."""
    ca = TestCA()
    ca_path = ca.write(directory / "ca.crt")
    crt, key = ca.issue_server(directory / "server.crt", directory / "server.key")
    return ca_path, crt, key


def web_config(directory: Path, users: dict[str, str], *, rounds: int = 4) -> Path:
    """An exporter-toolkit web config: TLS with a fresh certificate, bcrypt users
    (``rounds``: the bcrypt cost; 4 keeps tests fast, 10 is htpasswd's)."""
    import bcrypt
    import yaml

    _, crt, key = make_tls(directory)
    hashed = {u: bcrypt.hashpw(p.encode(), bcrypt.gensalt(rounds=rounds)).decode()
              for u, p in users.items()}
    path = directory / "web.yml"
    path.write_text(yaml.safe_dump({
        "tls_server_config": {"cert_file": crt.name, "key_file": key.name},  # relative paths
        "http_server_config": {"headers": {"X-Content-Type-Options": "nosniff"}},
        "basic_auth_users": hashed}))
    return path


def https_get(port: int, path: str, ca: Path, client: tuple[Path, Path] | None = None,
              authorization: str | None = None, timeout: float = 30.0) -> tuple[int, bytes]:
    """(status, body) of a GET over TLS that trusts ``ca``, presenting ``client`` (a
    certificate and its key) when given; (0, b"") when the TLS connection is refused
    (a failed handshake, an alert on the first read, or no answer within ``timeout``)."""
    import http.client
    import ssl

    ctx = ssl.create_default_context(cafile=str(ca))
    if client is not None:
        ctx.load_cert_chain(str(client[0]), str(client[1]))
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=timeout)
    try:
        conn.request("GET", path, headers={} if authorization is None else {
            "Authorization": authorization})
        r = conn.getresponse()
        return r.status, r.read()
    except (ssl.SSLError, ConnectionError, TimeoutError, http.client.RemoteDisconnected):
        return 0, b""
    finally:
        conn.close()


@contextmanager
def serving(web: Path, pages: dict[str, Any] | None = None) -> Iterator[HttpServer]:
    """An HttpServer under the web config file ``web``, its /metrics one test counter."""
    registry = new_registry()
    Counter("calmon_test_total", "a test counter", registry=registry).inc()
    with HttpServer("127.0.0.1", 0, registry, lambda: True, lambda: {"ready": True}, pages,
                    web=webconfig.load(web)) as server:
        yield server
