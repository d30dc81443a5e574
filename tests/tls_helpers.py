"""A throwaway CA and server certificate for TLS tests (made with ``cryptography``)."""

from __future__ import annotations

import datetime as dt
import ipaddress
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


def make_tls(directory: Path) -> tuple[Path, Path, Path]:
    """(ca.crt, server.crt, server.key) for 127.0.0.1 and localhost, valid for a day."""
    now = dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "calmon test CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - dt.timedelta(minutes=5))
          .not_valid_after(now + dt.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "calmon")]))
            .issuer_name(ca_name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                critical=False)
            .sign(ca_key, hashes.SHA256()))
    directory.mkdir(parents=True, exist_ok=True)
    paths = directory / "ca.crt", directory / "server.crt", directory / "server.key"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return paths


def web_config(directory: Path, users: dict[str, str]) -> Path:
    """An exporter-toolkit web config: TLS with a fresh certificate, bcrypt users."""
    import bcrypt
    import yaml

    _, crt, key = make_tls(directory)
    hashed = {u: bcrypt.hashpw(p.encode(), bcrypt.gensalt(rounds=4)).decode()
              for u, p in users.items()}
    path = directory / "web.yml"
    path.write_text(yaml.safe_dump({
        "tls_server_config": {"cert_file": crt.name, "key_file": key.name},  # relative paths
        "http_server_config": {"headers": {"X-Content-Type-Options": "nosniff"}},
        "basic_auth_users": hashed}))
    return path
