"""What a newcomer meets on the HTTP side: a browser that goes away mid-answer prints
no traceback, and the big pages go gzipped to clients that accept it."""

from __future__ import annotations

import gzip
import logging
import socket
import struct
import urllib.request

import pytest

from calmon.io.exposition import new_registry
from calmon.io.http import HttpServer
from tests.daemon_helpers import http_get, wait_until

PAGE = ("<tr><td>ctr</td><td>0.0123</td></tr>\n" * 9000).encode()  # ~330 KB, as /reliability


def _server() -> HttpServer:
    def big(_q: dict[str, list[str]]) -> tuple[int, str, bytes]:
        return 200, "text/plain", b"x" * (64 * 1024 * 1024)  # far past socket buffers

    return HttpServer("127.0.0.1", 0, new_registry(), lambda: True,
                      lambda: {"ready": True, "pad": "y" * 4000},
                      {"/reliability": lambda _q: (200, "text/html; charset=utf-8", PAGE),
                       "/big": big})


def _hang_up(port: int, path: str) -> None:
    """A browser closing its tab: the request, a few bytes read, then a reset."""
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    s.recv(16)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    s.close()


def test_a_client_that_goes_away_mid_answer_logs_no_error(caplog: pytest.LogCaptureFixture
                                                          ) -> None:
    caplog.set_level(logging.DEBUG, logger="calmon.io.http")
    with _server() as srv:
        for path in ("/big", "/favicon.ico", "/big"):
            _hang_up(srv.port, path)
        # the server noticed (the write failed) and goes on answering
        wait_until(lambda: any("client gone" in r.getMessage() for r in caplog.records), 30,
                   "the hang-up noticed")
        assert http_get(srv.port, "/healthz")[0] == 200
    loud = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert not loud, [(r.levelname, r.getMessage(), r.exc_text) for r in loud]


def _get(port: int, path: str, gz: bool) -> tuple[dict[str, str], bytes]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}",
                                 headers={"Accept-Encoding": "gzip"} if gz else {})
    with urllib.request.urlopen(req, timeout=10) as r:
        return dict(r.headers), r.read()


def test_reliability_and_status_are_gzipped_when_the_client_accepts_it() -> None:
    with _server() as srv:
        headers, body = _get(srv.port, "/reliability", gz=True)
        assert headers.get("Content-Encoding") == "gzip"
        assert gzip.decompress(body) == PAGE and len(body) < len(PAGE) / 20
        plain_headers, plain = _get(srv.port, "/reliability", gz=False)
        assert "Content-Encoding" not in plain_headers and plain == PAGE
        assert plain_headers.get("Vary") == "Accept-Encoding"
        again = _get(srv.port, "/reliability", gz=True)[1]
        assert again == body  # the cached page's gzip form, the same bytes
        headers, body = _get(srv.port, "/status", gz=True)
        assert headers.get("Content-Encoding") == "gzip"
        assert b'"pad"' in gzip.decompress(body)
        headers, body = _get(srv.port, "/healthz", gz=True)  # too small to be worth it
        assert "Content-Encoding" not in headers and body == b"ok\n"
