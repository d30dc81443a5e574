"""``server.web_config_file``: TLS and basic auth in the Prometheus exporter-toolkit format.

The same file a node_exporter or any exporter-toolkit exporter takes, so one
file and one habit serve the whole fleet::

    tls_server_config:
      cert_file: /etc/calmon/tls/tls.crt
      key_file: /etc/calmon/tls/tls.key
      client_auth_type: RequireAndVerifyClientCert   # optional (mutual TLS)
      client_ca_file: /etc/calmon/tls/ca.crt
      min_version: TLS12                              # TLS10 .. TLS13
    http_server_config:
      headers: {Strict-Transport-Security: max-age=31536000}
    basic_auth_users:
      prometheus: $2y$10$...                          # bcrypt hash (htpasswd -nBC 10)

With TLS, every endpoint answers over TLS; with ``basic_auth_users``, every
endpoint but ``/healthz`` and ``/readyz`` needs a user and password (a kubelet
probe has neither). Hashes are checked with the ``bcrypt`` package, and a
verified (user, password) pair is remembered (keyed by a SHA-256 of both), as
exporter-toolkit does, since bcrypt is deliberately slow and Prometheus sends
the same credentials on every scrape. ``cipher_suites``, ``curve_preferences``
and ``http2`` are accepted and left to Python's defaults. Every problem is a
config error ``server.web_config_file: key: what is wrong`` (exit 2).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import ssl
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from calmon.errors import ConfigError

KEY = "server.web_config_file"
TLS_VERSIONS = {"TLS10": ssl.TLSVersion.TLSv1, "TLS11": ssl.TLSVersion.TLSv1_1,
                "TLS12": ssl.TLSVersion.TLSv1_2, "TLS13": ssl.TLSVersion.TLSv1_3}
CLIENT_AUTH = {"NoClientCert": ssl.CERT_NONE, "RequestClientCert": ssl.CERT_OPTIONAL,
               "RequireAnyClientCert": ssl.CERT_OPTIONAL,
               "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
               "RequireAndVerifyClientCert": ssl.CERT_REQUIRED}
_TOP = {"tls_server_config", "http_server_config", "basic_auth_users"}
_TLS = {"cert_file", "key_file", "client_auth_type", "client_ca_file", "min_version",
        "max_version", "cipher_suites", "curve_preferences", "prefer_server_cipher_suites",
        "client_allowed_sans"}
_CACHE_ENTRIES = 1024


@dataclass
class BasicAuth:
    """Users and their bcrypt hashes; ``check`` takes an ``Authorization`` header value."""

    users: dict[str, bytes]
    _ok: set[bytes] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def check(self, header: str | None) -> bool:
        if not header or header[:6].lower() != "basic ":
            return False
        try:
            user, _, password = base64.b64decode(header[6:].strip(),
                                                 validate=True).decode("utf-8").partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return False
        hashed = self.users.get(user)
        if hashed is None:
            return False
        key = hashlib.sha256(user.encode() + b"\0" + password.encode() + b"\0" + hashed).digest()
        with self._lock:
            if key in self._ok:
                return True
        import bcrypt

        try:
            ok = bcrypt.checkpw(password.encode("utf-8"), hashed)
        except ValueError:
            ok = False
        if ok:
            with self._lock:
                if len(self._ok) >= _CACHE_ENTRIES:
                    self._ok.clear()
                self._ok.add(key)
        return ok


@dataclass
class WebConfig:
    ssl_context: ssl.SSLContext | None = None
    auth: BasicAuth | None = None
    headers: dict[str, str] = field(default_factory=dict)


def load(path: str | Path | None) -> WebConfig | None:
    """Read and check the file; None when no file is configured. Raises ConfigError."""
    if path is None:
        return None
    errors: list[str] = []
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as e:
        raise ConfigError([f"{KEY}: cannot read {path} ({e.strerror})"]) from None
    except yaml.YAMLError as e:
        raise ConfigError([f"{KEY}: {path} is not valid YAML: {e}"]) from None
    data = {} if data is None else data
    if not isinstance(data, dict):
        raise ConfigError([f"{KEY}: {path} must hold a mapping"])
    for k in data:
        if k not in _TOP:
            errors.append(f"{KEY}: {k}: unknown key (expected {', '.join(sorted(_TOP))})")
    out = WebConfig()
    tls = data.get("tls_server_config")
    if tls is not None:
        out.ssl_context = _tls(tls, Path(path).parent, errors)
    users = data.get("basic_auth_users")
    if users is not None:
        out.auth = _users(users, errors)
    http = data.get("http_server_config") or {}
    if not isinstance(http, dict):
        errors.append(f"{KEY}: http_server_config: must be a mapping")
    else:
        headers = http.get("headers") or {}
        if not isinstance(headers, dict) or not all(
                isinstance(k, str) and isinstance(v, str) and "\n" not in k + v
                for k, v in headers.items()):
            errors.append(f"{KEY}: http_server_config.headers: a mapping of strings")
        else:
            out.headers = dict(headers)
    if errors:
        raise ConfigError(errors)
    return out


def _tls(tls: Any, base: Path, errors: list[str]) -> ssl.SSLContext | None:
    where = f"{KEY}: tls_server_config"
    if not isinstance(tls, dict):
        errors.append(f"{where}: must be a mapping")
        return None
    for k in tls:
        if k not in _TLS:
            errors.append(f"{where}.{k}: unknown key")
    cert, key = tls.get("cert_file"), tls.get("key_file")
    if not cert or not key:
        errors.append(f"{where}: cert_file and key_file are both required")
        return None
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    lo, hi = tls.get("min_version", "TLS12"), tls.get("max_version")
    for name, value in (("min_version", lo), ("max_version", hi)):
        if value is not None and value not in TLS_VERSIONS:
            errors.append(f"{where}.{name}: one of {', '.join(TLS_VERSIONS)}, got {value!r}")
            return None
    ctx.minimum_version = TLS_VERSIONS[lo]
    if hi is not None:
        ctx.maximum_version = TLS_VERSIONS[hi]
    try:
        ctx.load_cert_chain(_path(base, cert), _path(base, key))
    except (OSError, ssl.SSLError) as e:
        errors.append(f"{where}: cannot load cert_file/key_file ({e})")
        return None
    auth = tls.get("client_auth_type", "NoClientCert")
    if auth not in CLIENT_AUTH:
        errors.append(f"{where}.client_auth_type: one of {', '.join(CLIENT_AUTH)}, got {auth!r}")
        return None
    ctx.verify_mode = CLIENT_AUTH[auth]
    ca = tls.get("client_ca_file")
    if ca:
        try:
            ctx.load_verify_locations(_path(base, ca))
        except (OSError, ssl.SSLError) as e:
            errors.append(f"{where}.client_ca_file: cannot load ({e})")
            return None
    elif ctx.verify_mode == ssl.CERT_REQUIRED:
        errors.append(f"{where}.client_ca_file: required with {auth}")
        return None
    return ctx


def _users(users: Any, errors: list[str]) -> BasicAuth | None:
    where = f"{KEY}: basic_auth_users"
    if not isinstance(users, dict) or not users:
        errors.append(f"{where}: a mapping of user: bcrypt hash")
        return None
    out: dict[str, bytes] = {}
    for user, hashed in users.items():
        if not isinstance(user, str) or ":" in user or not isinstance(hashed, str) or not (
                hashed.startswith(("$2a$", "$2b$", "$2y$")) and len(hashed) == 60):
            errors.append(f"{where}.{user}: a bcrypt hash ($2y$..., 60 characters), "
                          "e.g. from htpasswd -nBC 10 USER")
            continue
        out[user] = hashed.encode("ascii")
    return BasicAuth(out) if out else None


def _path(base: Path, p: str) -> str:
    """Relative paths are relative to the web config file, as exporter-toolkit reads them."""
    path = Path(p)
    return str(path if path.is_absolute() else base / path)
