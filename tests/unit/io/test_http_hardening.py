"""The HTTP server under misbehaving clients: half-sent requests, trickling clients,
scrape storms of /reliability (calmon.io.http)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from calmon.io.exposition import new_registry
from calmon.io.http import HttpServer
from tests.daemon_helpers import http_get, idle_connections, wait_until

CAP = 8
TIMEOUT_S = 1.0


def make_server(**kw: Any) -> HttpServer:
    builds: list[dict[str, list[str]]] = []

    def page(query: dict[str, list[str]]) -> tuple[int, str, bytes]:
        builds.append(query)
        return 200, "text/html; charset=utf-8", f"<p>{len(builds)}</p>".encode()

    def big(_query: dict[str, list[str]]) -> tuple[int, str, bytes]:
        return 200, "text/plain", b"x" * (64 * 1024 * 1024)  # far past socket buffers

    server = HttpServer("127.0.0.1", 0, new_registry(), lambda: True,
                        lambda: {"ready": True}, {"/reliability": page, "/big": big}, **kw)
    server.builds = builds  # type: ignore[attr-defined]
    return server


@pytest.fixture
def server() -> Iterator[HttpServer]:
    srv = make_server(max_connections=CAP, request_timeout_s=TIMEOUT_S)
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


def test_300_half_sent_requests_hold_no_thread_and_probes_still_answer(
        server: HttpServer) -> None:
    base = threading.active_count()
    socks: list[socket.socket] = []
    most = base
    try:
        for _ in range(300):
            s = socket.create_connection(("127.0.0.1", server.port), timeout=10)
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: calmon\r\nX-Slow: ")  # never finished
            socks.append(s)
            most = max(most, threading.active_count())
        # while they wait, probes answer (they never queue behind other clients)
        assert http_get(server.port, "/healthz", timeout=5)[0] == 200
        assert http_get(server.port, "/readyz", timeout=5)[0] == 200
        # each half-sent request is cut: at its deadline, or as the oldest of too many
        for s in socks:
            s.settimeout(TIMEOUT_S + 30)
            try:
                head = s.recv(64)
            except ConnectionResetError:
                head = b""
            assert head == b""
            most = max(most, threading.active_count())
        assert server.dropped >= 300 and server.rejected == 0
    finally:
        for s in socks:
            s.close()
    # reading requests costs no thread at all
    assert most == base, (most, base)


def test_healthz_answers_under_40_idle_connections_reopened_as_they_close() -> None:
    """The issue's attack: 40 idle connections, re-opened as they close, kept /healthz
    at 503 on 60 of 60 probes while they held the request slots."""
    # a deadline long enough that the slot holders below hold their slots throughout
    srv = make_server(max_connections=32, request_timeout_s=20.0)
    srv.start()
    hogs: list[socket.socket] = []
    try:
        with idle_connections(srv.port, 40):
            # every request thread busy too: 32 clients that never read /big
            for _ in range(32):
                h = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
                h.sendall(b"GET /big HTTP/1.0\r\n\r\n")
                hogs.append(h)
            wait_until(lambda: http_get(srv.port, "/metrics", timeout=5)[0] == 503, 10,
                       "every request slot taken")
            codes = [http_get(srv.port, path, timeout=5)[0]
                     for _ in range(30) for path in ("/healthz", "/readyz")]
        assert codes == [200] * 60
    finally:
        for h in hogs:
            h.close()
        srv.stop()


def test_an_idle_connection_is_closed_at_the_deadline(server: HttpServer) -> None:
    s = socket.create_connection(("127.0.0.1", server.port), timeout=TIMEOUT_S + 20)
    try:
        start = time.monotonic()
        assert s.recv(64) == b""  # closed without a word
        assert time.monotonic() - start >= TIMEOUT_S * 0.9
    finally:
        s.close()


def test_the_oldest_waiting_connection_makes_room(monkeypatch: pytest.MonkeyPatch) -> None:
    from calmon.io import http

    monkeypatch.setattr(http, "MAX_PENDING", 10)
    srv = make_server(request_timeout_s=60.0)
    srv.start()
    socks = [socket.create_connection(("127.0.0.1", srv.port), timeout=10) for _ in range(10)]
    try:
        wait_until(lambda: len(srv._server._waiting) == 10, 10, "ten waiting connections")
        assert srv.dropped == 0
        # a probe is the eleventh: the oldest idle one goes, the probe is answered
        assert http_get(srv.port, "/healthz", timeout=5)[0] == 200
        socks[0].settimeout(10)
        assert socks[0].recv(1) == b""
        assert srv.dropped == 1
    finally:
        for s in socks:
            s.close()
        srv.stop()


def test_readyz_says_why_it_is_not_ready() -> None:
    why: dict[str, str | None] = {"text": "partitions not assigned yet"}
    srv = HttpServer("127.0.0.1", 0, new_registry(), lambda: False, dict,
                     unready_reason=lambda: why["text"])
    with srv:
        assert http_get(srv.port, "/readyz") == (503, b"not ready: partitions not assigned yet\n")
        why["text"] = None
        assert http_get(srv.port, "/readyz") == (200, b"ready\n")


def test_trickling_client_is_cut_off_at_the_request_deadline(server: HttpServer) -> None:
    request = b"GET /metrics HTTP/1.1\r\nHost: calmon\r\n" + b"X-Pad: " + b"a" * 200 + b"\r\n\r\n"
    s = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    start = time.monotonic()
    cut = False
    try:
        stop = threading.Event()
        for i in range(len(request)):  # one byte per 100 ms: 25 s for the whole request
            try:
                s.sendall(request[i:i + 1])
            except OSError:
                cut = True
                break
            if stop.wait(0.1):  # the attack's pace, not a synchronisation
                break
            if time.monotonic() - start > TIMEOUT_S + 10:
                break
            s.setblocking(False)
            try:
                if s.recv(1) == b"":
                    cut = True
                    break
            except BlockingIOError:
                pass
            except OSError:
                cut = True
                break
            finally:
                s.setblocking(True)
    finally:
        s.close()
    elapsed = time.monotonic() - start
    assert cut, "the server kept the trickling connection open"
    assert TIMEOUT_S * 0.9 <= elapsed < TIMEOUT_S + 10, elapsed


def test_reliability_is_built_once_per_cache_period_for_a_scrape_storm() -> None:
    srv = make_server(max_connections=CAP, page_cache_s=60.0)
    srv.start()
    try:
        builds = srv.builds  # type: ignore[attr-defined]
        with ThreadPoolExecutor(CAP) as pool:
            codes = list(pool.map(lambda _: http_get(srv.port, "/reliability?window=24h")[0],
                                  range(100)))
        assert codes.count(200) + codes.count(503) == 100 and codes.count(200) >= CAP
        assert len(builds) == 1, len(builds)
        assert http_get(srv.port, "/reliability?window=1h")[0] == 200  # another query
        assert len(builds) == 2 and builds[-1] == {"window": ["1h"]}
    finally:
        srv.stop()


def test_reliability_cache_expires() -> None:
    srv = make_server(page_cache_s=0.2)
    srv.start()
    try:
        builds = srv.builds  # type: ignore[attr-defined]
        code, first = http_get(srv.port, "/reliability")
        assert code == 200 and first == b"<p>1</p>"
        # within the period the same answer; after it, a fresh build
        wait_until(lambda: http_get(srv.port, "/reliability")[1] == b"<p>2</p>", 10,
                   "a rebuilt page after the cache period")
        assert len(builds) == 2
    finally:
        srv.stop()


def test_megabytes_of_headers_are_cut_off(server: HttpServer) -> None:
    """Request line and headers past 64 KiB: the connection is dropped, never buffered."""
    s = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    sent = 0
    try:
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: calmon\r\n")
        header = b"X-Pad: " + b"a" * 60_000 + b"\r\n"  # under the stdlib 64 KiB a line
        try:
            while sent < 8 * 1024 * 1024:
                s.sendall(header)
                sent += len(header)
        except OSError:  # reset by the server: what we want
            pass
        s.settimeout(10)
        try:
            answer = s.recv(64)
        except OSError:
            answer = b""
    finally:
        s.close()
    assert sent < 8 * 1024 * 1024, "the server kept reading 8 MB of headers"
    assert not answer.startswith(b"HTTP/1.0 200")
    assert http_get(server.port, "/healthz")[0] == 200


def test_a_client_that_never_reads_the_answer_releases_its_slot(server: HttpServer) -> None:
    base = threading.active_count()
    s = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    try:
        s.sendall(b"GET /big HTTP/1.0\r\n\r\n")  # and never read
        wait_until(lambda: threading.active_count() > base, 10, "a thread serving /big")
        wait_until(lambda: threading.active_count() <= base, TIMEOUT_S + 20,
                   "the thread to give up on the reader")
    finally:
        s.close()
