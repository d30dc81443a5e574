"""``tls_server_config`` of the web config: the TLS context new connections get, and
the client-certificate policy, with the meanings Go's ``crypto/tls`` gives them.

**Re-read when the files change.** ``cert_file``, ``key_file`` and ``client_ca_file``
are looked at (``stat``) at most once a second, when a connection arrives; when any
changed, a new context is built for the connections after it (a rotation by
cert-manager or by hand reaches new connections within a second or two, open ones
keep theirs). A rotation caught half-way (a new certificate with the old key) keeps
the previous context and is retried until the files match; exporter-toolkit reads
the files on every handshake.

**Client certificates are asked for at the handshake and required per path.** The
handshake asks for a certificate but lets a client without one through, so
``/healthz`` and ``/readyz`` answer a kubelet probe under mutual TLS; every other
path is refused (403) when the policy wants a certificate and the connection has
none. What each ``client_auth_type`` means (Go's ``tls.ClientAuthType``):

- ``NoClientCert``: none asked for;
- ``RequestClientCert``: asked for, never required nor verified, so it admits
  whoever ``NoClientCert`` admits: none is asked for;
- ``RequireAnyClientCert``: required, *not* verified. Python's ``ssl`` verifies
  every certificate it accepts (it has no verify callback), so this cannot be
  enforced: refused at start;
- ``VerifyClientCertIfGiven``: a certificate given must verify against
  ``client_ca_file`` (else the handshake fails), none is fine;
- ``RequireAndVerifyClientCert``: a certificate that verifies is required (for
  every path but the probes).

``client_allowed_sans`` (exporter-toolkit's ``VerifyPeerCertificate``): the
verified leaf must carry one of the listed names among its DNS names, e-mail
addresses, IP addresses (as Go prints them) and URIs; a connection without a
certificate is refused too. It needs a verifying ``client_auth_type``.
``client_ca_file`` is required with the verifying kinds (Go would fall back to the
system's roots, which any public certificate satisfies) and refused with
``NoClientCert``, as exporter-toolkit refuses it.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

RECHECK_S = 1.0  # how often the files are looked at, at most
VERIFYING = frozenset({"VerifyClientCertIfGiven", "RequireAndVerifyClientCert"})
CLIENT_AUTH_TYPES = ("NoClientCert", "RequestClientCert", "RequireAnyClientCert",
                     "VerifyClientCertIfGiven", "RequireAndVerifyClientCert")
UNENFORCEABLE = frozenset({"RequireAnyClientCert", "RequireClientCert"})  # Go's old name too


class TlsFileError(Exception):
    """A file of ``tls_server_config`` that cannot be used; ``str`` is
    ``key: what is wrong`` (the key relative to the web config)."""


@dataclass(frozen=True)
class TlsSettings:
    cert_file: Path
    key_file: Path
    client_ca_file: Path | None = None
    client_auth_type: str = "NoClientCert"
    allowed_sans: frozenset[str] | None = None
    min_version: ssl.TLSVersion = ssl.TLSVersion.TLSv1_2
    max_version: ssl.TLSVersion | None = None

    @property
    def files(self) -> tuple[Path, ...]:
        return (self.cert_file, self.key_file) + (
            (self.client_ca_file,) if self.client_ca_file is not None else ())

    @property
    def wants_certificate(self) -> bool:
        """Whether paths other than the probes need a verified client certificate."""
        return self.client_auth_type == "RequireAndVerifyClientCert" or (
            self.allowed_sans is not None)


def build_context(s: TlsSettings) -> ssl.SSLContext:
    """A server context from the files as they are now. Raises TlsFileError naming
    the key and the file."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    where = "tls_server_config"
    cert_pem = _read(f"{where}.cert_file", s.cert_file)
    key_pem = _read(f"{where}.key_file", s.key_file)
    try:
        x509.load_pem_x509_certificates(cert_pem)
    except ValueError:
        raise TlsFileError(f"{where}.cert_file: {s.cert_file} holds no PEM certificate"
                           ) from None
    try:
        serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError) as e:  # TypeError: an encrypted key
        raise TlsFileError(f"{where}.key_file: {s.key_file} holds no unencrypted PEM "
                           f"private key ({e})") from None
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = s.min_version
    if s.max_version is not None:
        ctx.maximum_version = s.max_version
    try:
        ctx.load_cert_chain(s.cert_file, s.key_file)
    except (OSError, ssl.SSLError) as e:
        raise TlsFileError(f"{where}: key_file {s.key_file} does not go with cert_file "
                           f"{s.cert_file} ({getattr(e, 'reason', None) or e})") from None
    if s.client_ca_file is not None and s.client_auth_type in VERIFYING:
        _read(f"{where}.client_ca_file", s.client_ca_file)
        try:
            ctx.load_verify_locations(s.client_ca_file)
        except (OSError, ssl.SSLError) as e:
            raise TlsFileError(f"{where}.client_ca_file: {s.client_ca_file} holds no PEM "
                               f"certificate ({getattr(e, 'reason', None) or e})") from None
        # asked for at the handshake, required per path: the probes need none
        ctx.verify_mode = ssl.CERT_OPTIONAL
    return ctx


class TlsServer:
    """The current context (``context()``) and the per-path policy (``refusal``)."""

    def __init__(self, settings: TlsSettings, *, recheck_s: float = RECHECK_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.settings = settings
        self._recheck_s = recheck_s
        self._clock = clock
        self._lock = threading.Lock()
        self._context = build_context(settings)  # raises: a config error at start
        self._seen = _signature(settings.files)
        self._checked = clock()
        self._failed: tuple[object, ...] | None = None  # files last refused, logged once
        self.reloads = 0

    def context(self) -> ssl.SSLContext:
        """The context for a new connection, rebuilt first when a file changed."""
        now = self._clock()
        if now - self._checked < self._recheck_s:
            return self._context
        with self._lock:
            self._checked = now
            seen = _signature(self.settings.files)
            if seen != self._seen:
                self._reload(seen)
            return self._context

    def _reload(self, seen: tuple[object, ...]) -> None:
        try:
            self._context = build_context(self.settings)
        except TlsFileError as e:  # half-way through a rotation, or a broken file
            if seen != self._failed:
                log.warning("tls: %s; still serving the previous certificate", e)
                self._failed = seen
            return
        self._seen, self._failed = seen, None
        self.reloads += 1
        log.info("tls: %s changed: new connections get the files as they are now",
                 ", ".join(str(p) for p in self.settings.files))

    def refusal(self, sock: ssl.SSLSocket) -> str | None:
        """Why a request for a path other than the probes is refused on this
        connection; None when it may go on."""
        if not self.settings.wants_certificate:
            return None
        der = sock.getpeercert(binary_form=True)
        if der is None:
            return "a client certificate is required"
        allowed = self.settings.allowed_sans
        if allowed is not None and allowed.isdisjoint(sans_of(der)):
            return "the client certificate carries none of client_allowed_sans"
        return None


def sans_of(der: bytes) -> set[str]:
    """A certificate's subject alternative names as Go's exporter-toolkit compares
    them: DNS names, e-mail addresses, IP addresses (an IPv4-mapped IPv6 address as
    dotted IPv4, as Go's ``net.IP.String``) and URIs."""
    from cryptography import x509

    try:
        cert = x509.load_der_x509_certificate(der)
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (ValueError, x509.ExtensionNotFound):
        return set()
    out: set[str] = set(sans.get_values_for_type(x509.DNSName))
    out.update(sans.get_values_for_type(x509.RFC822Name))
    out.update(sans.get_values_for_type(x509.UniformResourceIdentifier))
    for ip in sans.get_values_for_type(x509.IPAddress):
        mapped = ip.ipv4_mapped if isinstance(ip, ipaddress.IPv6Address) else None
        out.add(str(mapped or ip))
    return out


def _read(key: str, path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as e:
        raise TlsFileError(f"{key}: cannot read {path} ({e.strerror})") from None


def _signature(paths: tuple[Path, ...]) -> tuple[object, ...]:
    """What says a file changed: its identity, size and time (a swapped symlink, as a
    Kubernetes secret volume updates, is a new identity)."""
    out: list[object] = []
    for p in paths:
        try:
            st = os.stat(p)
            out.append((st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns))
        except OSError as e:
            out.append(e.errno)
    return tuple(out)
