"""server.web_config_file: TLS and basic auth in the exporter-toolkit format, and `/`."""

from __future__ import annotations

import base64
import socket
import ssl
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from calmon.errors import ConfigError
from calmon.io import landing, webconfig
from tests.tls_helpers import serving, web_config


def _get(port: int, path: str, ca: Path | None, user: str | None = None,
         password: str | None = None) -> tuple[int, bytes, dict[str, str]]:
    req = urllib.request.Request(f"https://127.0.0.1:{port}{path}")
    if user is not None:
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        req.add_header("Authorization", f"Basic {token}")
    ctx = ssl.create_default_context(cafile=str(ca)) if ca else None
    try:
        with urllib.request.urlopen(req, timeout=10, context=ctx) as r:
            return r.status, r.read(), dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, e.read(), dict(e.headers)


@pytest.fixture
def served(tmp_path: Path):
    path = web_config(tmp_path, {"prometheus": "s3cret-pass"})
    with serving(path, {"/": landing.page}) as server:
        yield server, tmp_path / "ca.crt"


def test_tls_and_basic_auth(served) -> None:
    server, ca = served
    code, body, headers = _get(server.port, "/metrics", ca, "prometheus", "s3cret-pass")
    assert code == 200 and b"calmon_test_total 1.0" in body
    assert headers.get("X-Content-Type-Options") == "nosniff"
    for user, password in ((None, None), ("prometheus", "wrong"), ("nobody", "s3cret-pass")):
        code, _, headers = _get(server.port, "/metrics", ca, user, password)
        assert code == 401 and headers.get("WWW-Authenticate", "").startswith("Basic")
    code, _, _ = _get(server.port, "/status", ca)
    assert code == 401


def test_probes_need_tls_but_no_password(served) -> None:
    server, ca = served
    assert _get(server.port, "/healthz", ca)[0] == 200
    assert _get(server.port, "/readyz", ca)[0] == 200


def test_plain_http_is_not_answered(served) -> None:
    server, _ = served
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        assert b"calmon_test_total" not in s.recv(65536)


def test_the_landing_page_links_the_endpoints(served) -> None:
    server, ca = served
    code, body, _ = _get(server.port, "/", ca, "prometheus", "s3cret-pass")
    assert code == 200
    for path in ("/metrics", "/reliability", "/status", "/healthz", "/readyz"):
        assert f'href="{path}"'.encode() in body


def test_config_errors_name_the_key(tmp_path: Path) -> None:
    bad = tmp_path / "web.yml"
    bad.write_text("tls_server_config: {cert_file: nope.crt, key_file: nope.key}\n"
                   "basic_auth_users: {prometheus: plaintext}\nhttp2: true\n")
    with pytest.raises(ConfigError) as e:
        webconfig.load(bad)
    text = "\n".join(e.value.problems)
    assert f"server.web_config_file: tls_server_config.cert_file: cannot read {tmp_path}" in text
    assert "basic_auth_users.prometheus: a bcrypt hash" in text
    assert "http2: unknown key" in text
    with pytest.raises(ConfigError):
        webconfig.load(tmp_path / "absent.yml")
    assert webconfig.load(None) is None
