"""``server.web_config_file``: TLS and basic auth in the Prometheus exporter-toolkit format.

The same file a node_exporter or any exporter-toolkit exporter takes, so one
file and one habit serve the whole fleet::

    tls_server_config:
      cert_file: tls.crt                              # relative to this file's directory
      key_file: tls.key
      client_auth_type: RequireAndVerifyClientCert   # optional (mutual TLS)
      client_ca_file: ca.crt
      client_allowed_sans: [prometheus.monitoring.svc]  # optional
      min_version: TLS12                              # TLS10 .. TLS13
    http_server_config:
      headers: {Strict-Transport-Security: max-age=31536000}
    basic_auth_users:
      prometheus: $2y$10$...                          # bcrypt hash (htpasswd -nBC 10)

With TLS, every endpoint answers over TLS; with ``basic_auth_users``, every
endpoint but ``/healthz`` and ``/readyz`` needs a user and password (a kubelet
probe has neither), and under mutual TLS a client certificate
(``calmon.io.tls_server`` says what each ``client_auth_type`` means, and how the
files are re-read when they change; ``calmon.io.basic_auth`` how passwords are
checked). Paths are as exporter-toolkit reads them: ``server.web_config_file``
relative to the working directory, like every path of calmon's config, and the
paths inside the web config relative to the web config file's directory.
``cipher_suites``, ``curve_preferences`` and ``http2`` are accepted and left to
Python's defaults. Every problem is a config error
``server.web_config_file: key: what is wrong`` (exit 2).
"""

from __future__ import annotations

import os
import ssl
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from calmon.errors import ConfigError
from calmon.io.basic_auth import BasicAuth
from calmon.io.tls_server import (
    CLIENT_AUTH_TYPES,
    UNENFORCEABLE,
    VERIFYING,
    TlsFileError,
    TlsServer,
    TlsSettings,
)

__all__ = ["KEY", "BasicAuth", "TlsServer", "WebConfig", "load"]

KEY = "server.web_config_file"
TLS_VERSIONS = {"TLS10": ssl.TLSVersion.TLSv1, "TLS11": ssl.TLSVersion.TLSv1_1,
                "TLS12": ssl.TLSVersion.TLSv1_2, "TLS13": ssl.TLSVersion.TLSv1_3}
_TOP = {"tls_server_config", "http_server_config", "basic_auth_users"}
_TLS = {"cert_file", "key_file", "client_auth_type", "client_ca_file", "min_version",
        "max_version", "cipher_suites", "curve_preferences", "prefer_server_cipher_suites",
        "client_allowed_sans"}


@dataclass
class WebConfig:
    tls: TlsServer | None = None
    auth: BasicAuth | None = None
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def ssl_context(self) -> ssl.SSLContext | None:
        """The context a connection made now gets (None without TLS)."""
        return self.tls.context() if self.tls is not None else None


def load(path: str | Path | None) -> WebConfig | None:
    """Read and check the file; None when no file is configured. Raises ConfigError."""
    if path is None:
        return None
    errors: list[str] = []
    where = str(path) if Path(path).is_absolute() else (
        f"{path} (from the working directory: {os.path.abspath(path)})")
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as e:
        raise ConfigError([f"{KEY}: cannot read {where} ({e.strerror})"]) from None
    except yaml.YAMLError as e:
        raise ConfigError([f"{KEY}: {where} is not valid YAML: {e}"]) from None
    data = {} if data is None else data
    if not isinstance(data, dict):
        raise ConfigError([f"{KEY}: {where} must hold a mapping"])
    for k in data:
        if k not in _TOP:
            errors.append(f"{KEY}: {k}: unknown key (expected {', '.join(sorted(_TOP))})")
    out = WebConfig()
    tls = data.get("tls_server_config")
    if tls is not None:
        # as exporter-toolkit: relative to the file's directory (symbolic links not
        # resolved, so a Kubernetes ConfigMap's files sit beside the link)
        settings = _tls(tls, Path(os.path.abspath(path)).parent, errors)
        if settings is not None:
            try:
                out.tls = TlsServer(settings)
            except TlsFileError as e:
                errors.append(f"{KEY}: {e}")
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


def _tls(tls: Any, base: Path, errors: list[str]) -> TlsSettings | None:
    where = f"{KEY}: tls_server_config"
    if not isinstance(tls, dict):
        errors.append(f"{where}: must be a mapping")
        return None
    before = len(errors)
    for k in tls:
        if k not in _TLS:
            errors.append(f"{where}.{k}: unknown key")
    cert, key = tls.get("cert_file"), tls.get("key_file")
    if not isinstance(cert, str) or not cert or not isinstance(key, str) or not key:
        errors.append(f"{where}: cert_file and key_file are both required (paths)")
    versions = {}
    for name, value in (("min_version", tls.get("min_version", "TLS12")),
                        ("max_version", tls.get("max_version"))):
        if value is not None and value not in TLS_VERSIONS:
            errors.append(f"{where}.{name}: one of {', '.join(TLS_VERSIONS)}, got {value!r}")
        versions[name] = TLS_VERSIONS.get(value) if value is not None else None
    auth = tls.get("client_auth_type") or "NoClientCert"
    if auth in UNENFORCEABLE:
        errors.append(
            f"{where}.client_auth_type: {auth} (a certificate required but not verified) "
            "cannot be enforced: Python's ssl module verifies every client certificate it "
            "accepts; use RequireAndVerifyClientCert with client_ca_file")
    elif auth not in CLIENT_AUTH_TYPES:
        errors.append(f"{where}.client_auth_type: one of {', '.join(CLIENT_AUTH_TYPES)}, "
                      f"got {auth!r}")
    ca = tls.get("client_ca_file")
    if ca is not None and (not isinstance(ca, str) or not ca):
        errors.append(f"{where}.client_ca_file: a path")
    elif ca and auth == "NoClientCert":  # exporter-toolkit's own refusal
        errors.append(f"{where}.client_ca_file: set without a client_auth_type "
                      "(client CAs configured without a client auth policy)")
    elif not ca and auth in VERIFYING:
        errors.append(f"{where}.client_ca_file: required with {auth}")
    sans = _sans(tls.get("client_allowed_sans"), auth, f"{where}.client_allowed_sans", errors)
    if len(errors) > before:
        return None
    return TlsSettings(
        cert_file=_path(base, str(cert)), key_file=_path(base, str(key)),
        client_ca_file=_path(base, ca) if ca else None, client_auth_type=auth,
        allowed_sans=sans, min_version=versions["min_version"] or ssl.TLSVersion.TLSv1_2,
        max_version=versions["max_version"])


def _sans(sans: Any, auth: str, where: str, errors: list[str]) -> frozenset[str] | None:
    if sans is None:
        return None
    if not isinstance(sans, list) or not sans or not all(
            isinstance(s, str) and s for s in sans):
        errors.append(f"{where}: a list of names (DNS names, e-mail addresses, IPs, URIs)")
        return None
    if auth not in VERIFYING:  # they are the verified leaf's names
        errors.append(f"{where}: needs client_auth_type RequireAndVerifyClientCert or "
                      f"VerifyClientCertIfGiven (got {auth})")
        return None
    return frozenset(sans)


def _users(users: Any, errors: list[str]) -> BasicAuth | None:
    where = f"{KEY}: basic_auth_users"
    if not isinstance(users, dict) or not users:
        errors.append(f"{where}: a mapping of user: bcrypt hash")
        return None
    out: dict[str, bytes] = {}
    for user, hashed in users.items():
        if not isinstance(user, str) or ":" in user or not isinstance(hashed, str) or not (
                hashed.startswith(("$2a$", "$2b$", "$2y$")) and len(hashed) == 60
                and hashed[4:6].isdigit() and 4 <= int(hashed[4:6]) <= 31
                and hashed[6] == "$"):
            errors.append(f"{where}.{user}: a bcrypt hash ($2y$..., 60 characters), "
                          "e.g. from htpasswd -nBC 10 USER")
            continue
        out[user] = hashed.encode("ascii")
    return BasicAuth(out) if out and len(out) == len(users) else None


def _path(base: Path, p: str) -> Path:
    """Relative paths are relative to the web config file's directory, as
    exporter-toolkit reads them."""
    path = Path(p)
    return path if path.is_absolute() else base / path
