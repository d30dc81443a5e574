"""Why a secured broker refuses calmon, in words that name the setting to fix.

Both client libraries retry a rejected login or an untrusted certificate as if
the network were down. calmon tells them apart: librdkafka reports them as
``_AUTHENTICATION`` and ``_SSL`` errors; kafka-python raises
``SaslAuthenticationFailedError`` (see ``kafka_fixes``) but only logs a failed
TLS handshake, so for it the handshake is tried once with the standard library
and the same settings (``tls_problem``).
"""

from __future__ import annotations

import socket
import ssl
from collections.abc import Mapping, Sequence
from typing import Any


def _key(client: Mapping[str, Any], python: str, native: str) -> str:
    """The spelling of a setting the configuration uses; where it is not given, the
    spelling the rest of ``kafka.client`` uses (librdkafka's when any key has a dot)."""
    for name in (python, native):
        if name in client:
            return f"kafka.client.{name}"
    return f"kafka.client.{native if any('.' in k for k in client) else python}"


def credentials_problem(client: Mapping[str, Any], detail: str) -> str:
    """The broker rejected the SASL login."""
    user = client.get("sasl_plain_username", client.get("sasl.username"))
    mechanism = client.get("sasl_mechanism", client.get("sasl.mechanism", "SASL"))
    who = f" for user {user!r}" if user else ""
    username = _key(client, "sasl_plain_username", "sasl.username")
    return (f"{_key(client, 'sasl_plain_password', 'sasl.password')}: the broker rejected "
            f"the {mechanism} credentials{who} (check {username} and the password): {detail}")


def certificate_problem(client: Mapping[str, Any], detail: str) -> str:
    """The broker's certificate did not verify (or the TLS handshake failed)."""
    cafile = client.get("ssl_cafile", client.get("ssl.ca.location"))
    by = f"the CA in {cafile}" if cafile else "the system's CAs"
    return (f"{_key(client, 'ssl_cafile', 'ssl.ca.location')}: the broker's TLS certificate "
            f"is not trusted by {by}: {detail}")


def tls_failure(client: Mapping[str, Any], detail: str) -> str:
    """A TLS handshake failed: on the certificate (``certificate_problem``), or
    otherwise (a plaintext listener, no common protocol)."""
    if "certificate verify failed" in detail or "CERTIFICATE_VERIFY_FAILED" in detail:
        return certificate_problem(client, detail)
    return (f"{_key(client, 'security_protocol', 'security.protocol')}: the TLS handshake "
            f"with the broker failed: {detail}")


def uses_tls(client: Mapping[str, Any]) -> bool:
    protocol = str(client.get("security_protocol", client.get("security.protocol", "")))
    return protocol.upper() in ("SSL", "SASL_SSL")


def tls_problem(servers: Sequence[str], client: Mapping[str, Any],
                timeout: float = 5.0) -> str | None:
    """A TLS handshake with the first bootstrap server that answers, as kafka-python
    would make it (``ssl_cafile``, ``ssl_certfile``/``ssl_keyfile``,
    ``ssl_check_hostname``): the reason it fails on the certificate, else None
    (also when no server can be reached: that is not a certificate problem)."""
    if not uses_tls(client):
        return None
    try:
        ctx = ssl.create_default_context(cafile=client.get("ssl_cafile") or None)
        if client.get("ssl_certfile"):
            ctx.load_cert_chain(client["ssl_certfile"], client.get("ssl_keyfile") or None,
                                client.get("ssl_password") or None)
        ctx.check_hostname = bool(client.get("ssl_check_hostname", True))
    except (OSError, ssl.SSLError) as e:
        return certificate_problem(client, f"cannot load it: {e}")
    for server in servers:
        host, _, port = server.rpartition(":")
        host = host.strip("[]") or server
        try:
            with socket.create_connection((host, int(port or 9093)), timeout) as raw, \
                    ctx.wrap_socket(raw, server_hostname=host) as tls:
                tls.version()
            return None
        except ssl.SSLCertVerificationError as e:
            return certificate_problem(client, f"{server}: {e.verify_message or e}")
        except ssl.SSLError as e:
            return tls_failure(client, f"{server}: {e}")
        except (OSError, ValueError):
            continue  # unreachable: the caller's own error says so
    return None
