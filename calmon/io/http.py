"""The HTTP side: /metrics, /healthz, /readyz, /status (and pages added by others).

A stdlib ``ThreadingHTTPServer``: scrapes and probes must never wait on the
consumer loop, and every handler only reads through the callables it is given.

Hardened against clients that misbehave (``calmon run`` sits next to model
servers; anything in the pod can connect):

- at most ``max_connections`` requests are served at once, each on its own
  thread; one more connection is answered ``503`` at once from the accepting
  thread and closed, so 300 half-sent requests cost 300 sockets for a moment,
  never 300 threads;
- a request must arrive whole within ``request_timeout_s`` (one deadline over
  every read, so a byte every few seconds does not keep a slot) and within
  ``MAX_REQUEST_BYTES``, and the answer must be taken within the timeout too
  (``sendall`` applies a socket timeout to the whole answer);
- pages (``/reliability``) are cached for ``page_cache_s`` per query, and built
  one at a time, so a scrape storm costs one build per few seconds.
"""

from __future__ import annotations

import io
import json
import logging
import socket
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import CollectorRegistry

log = logging.getLogger(__name__)

# A page handler takes the query string's parameters and returns (status, content type, body).
Page = Callable[[dict[str, list[str]]], tuple[int, str, bytes]]


MAX_CONNECTIONS = 32
REQUEST_TIMEOUT_S = 10.0
MAX_REQUEST_BYTES = 64 * 1024  # request line and headers of a GET
PAGE_CACHE_S = 5.0
PAGE_CACHE_ENTRIES = 64
BUSY = (b"HTTP/1.0 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\n"
        b"Content-Length: 5\r\nConnection: close\r\nRetry-After: 1\r\n\r\nbusy\n")


class _BoundedServer(ThreadingHTTPServer):
    """ThreadingHTTPServer with a cap on the threads serving requests at once."""

    daemon_threads = True
    request_queue_size = 128  # listen backlog: bursts wait in the kernel, not in threads

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler],
                 max_connections: int) -> None:
        self._slots = threading.BoundedSemaphore(max_connections)
        self.rejected = 0  # connections answered 503 because every slot was taken
        super().__init__(address, handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self.rejected += 1
            try:  # a fresh socket's send buffer takes these bytes without blocking
                request.setblocking(False)
                request.send(BUSY)
            except OSError:
                pass
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:  # no thread started: give the slot back
            self._slots.release()
            raise

    def handle_error(self, request: Any, client_address: Any) -> None:
        # a client that vanished mid-answer is not worth a traceback on stderr
        log.debug("http: error serving %s", client_address, exc_info=True)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()


class _DeadlineReader(io.RawIOBase):
    """Socket reads that share one deadline and one byte budget: a client trickling a
    byte at a time cannot hold a connection past the deadline, and one sending
    megabytes of headers cannot make the server hold them (every page is a GET)."""

    def __init__(self, sock: socket.socket, deadline: float, budget: int) -> None:
        self._sock = sock
        self._deadline = deadline
        self._budget = budget

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        remaining = self._deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("request not received in time")
        if self._budget <= 0:
            raise ConnectionAbortedError("request larger than MAX_REQUEST_BYTES")
        self._sock.settimeout(remaining)
        view = memoryview(buffer)[:self._budget]
        n = self._sock.recv_into(view)
        self._budget -= n
        return n


class _PageCache:
    """Answers of pages per (path, query), kept ``ttl_s`` seconds; builds run one
    at a time, so concurrent scrapes of one page wait for one build."""

    def __init__(self, ttl_s: float, entries: int = PAGE_CACHE_ENTRIES) -> None:
        self.ttl_s = ttl_s
        self.entries = entries
        self.builds = 0
        self._lock = threading.Lock()
        self._cache: dict[tuple[str, str], tuple[float, tuple[int, str, bytes]]] = {}

    def get(self, path: str, query: str, page: Page) -> tuple[int, str, bytes]:
        key = (path, query)
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None and time.monotonic() - hit[0] < self.ttl_s:
                return hit[1]
            answer = page(parse_qs(query))
            self.builds += 1
            if self.ttl_s > 0:
                if len(self._cache) >= self.entries:  # drop the oldest
                    del self._cache[min(self._cache, key=lambda k: self._cache[k][0])]
                self._cache[key] = (time.monotonic(), answer)
            return answer


class HttpServer:
    def __init__(self, host: str, port: int, registry: CollectorRegistry,
                 ready: Callable[[], bool], status: Callable[[], dict[str, Any]],
                 pages: dict[str, Page] | None = None, *,
                 alive: Callable[[], bool] = lambda: True,
                 max_connections: int = MAX_CONNECTIONS,
                 request_timeout_s: float = REQUEST_TIMEOUT_S,
                 page_cache_s: float = PAGE_CACHE_S) -> None:
        self.registry = registry
        self.alive = alive  # /healthz: False when the main loop is stuck
        self.ready = ready
        self.status = status
        self.pages = dict(pages or {})
        self.request_timeout_s = request_timeout_s
        self.page_cache = _PageCache(page_cache_s)
        handler = _make_handler(self)
        self._server = _BoundedServer((host, port), handler, max_connections)
        self._thread: threading.Thread | None = None

    @property
    def rejected(self) -> int:
        """Connections turned away with 503 because ``max_connections`` were busy."""
        return self._server.rejected

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def __enter__(self) -> HttpServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._server.serve_forever, name="calmon-http",
                                        kwargs={"poll_interval": 0.2}, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)


def _make_handler(app: HttpServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "calmon"

        def setup(self) -> None:
            super().setup()
            # every read of the request shares one deadline; sendall of the answer another
            self.connection.settimeout(app.request_timeout_s)
            deadline = time.monotonic() + app.request_timeout_s
            self.rfile = io.BufferedReader(
                _DeadlineReader(self.connection, deadline, MAX_REQUEST_BYTES))

        def do_GET(self) -> None:
            url = urlsplit(self.path)
            try:
                if url.path == "/metrics":
                    encoder, ctype = choose_encoder(self.headers.get("Accept", ""))
                    self._send(200, ctype, encoder(app.registry))
                elif url.path == "/healthz":
                    ok = app.alive()
                    self._send(200 if ok else 503, "text/plain; charset=utf-8",
                               b"ok\n" if ok else b"main loop stalled\n")
                elif url.path == "/readyz":
                    ok = app.ready()
                    self._send(200 if ok else 503, "text/plain; charset=utf-8",
                               b"ready\n" if ok else b"not ready\n")
                elif url.path == "/status":
                    body = json.dumps(app.status(), indent=2, default=str).encode()
                    self._send(200, "application/json", body + b"\n")
                elif url.path in app.pages:
                    self._send(*app.page_cache.get(url.path, url.query, app.pages[url.path]))
                else:
                    self._send(404, "text/plain; charset=utf-8", b"not found\n")
            except Exception:  # a broken page must not take the server down
                log.exception("error serving %s", url.path)
                self._send(500, "text/plain; charset=utf-8", b"internal error\n")

        def handle_one_request(self) -> None:
            try:
                super().handle_one_request()
            except (TimeoutError, OSError):  # too slow, or gone: drop the connection
                self.close_connection = True

        def _send(self, code: int, ctype: str, body: bytes) -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            log.debug("http: " + format, *args)

    return Handler
