"""The HTTP side: /metrics, /healthz, /readyz, /status (and pages added by others).

Scrapes and probes must never wait on the consumer loop: every handler only
reads through the callables it is given. Probes must not wait on other clients
either (the liveness probe restarts calmon when /healthz does not answer), so
connections are handled in two stages (``_Server``):

- one thread (``calmon-http``) accepts every connection and reads its request
  line and headers without blocking, for all connections at once (a selector):
  a connection that has not sent a whole request costs a socket, never a thread
  or a request slot, and is closed when ``request_timeout_s`` has passed since
  it connected (one deadline over every read, so a byte every few seconds does
  not keep it) or when it has sent ``MAX_REQUEST_BYTES`` without ending its
  headers. At most ``MAX_PENDING`` connections wait so; one more closes the
  oldest waiting one, so idle connections cannot lock new ones out;
- a whole request for ``/healthz`` or ``/readyz`` is answered on that thread at
  once (a few flags read, a few bytes sent): probes are never behind anything;
- any other request gets a thread of its own, at most ``max_connections`` at
  once; one more is answered ``503`` at once and closed. The answer must be
  taken within ``request_timeout_s`` (``sendall`` applies the socket timeout to
  the whole answer).

With a web config, a request for another path is first admitted
(``calmon.io.admission``: the client certificate, then the credentials, bcrypt
on a thread of its own that holds no request slot).

Pages (``/reliability``) are cached for ``page_cache_s`` per parsed query (a
page's ``cache_key`` says which parameters matter: junk ones share an entry), within
``PAGE_CACHE_BYTES``, and built one at a time, so a scrape storm costs one build per
few seconds and junk query strings cannot pin memory. ``/metrics`` bodies come from
an ``Exposition`` (shared per snapshot, gzip when the client accepts it): the one
given, else one over the registry.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import logging
import selectors
import socket
import ssl
import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qs, urlsplit

from prometheus_client.exposition import gzip_accepted
from prometheus_client.registry import CollectorRegistry

from calmon.io.admission import UNAUTHORIZED as UNAUTHORIZED  # its old home
from calmon.io.admission import Admission
from calmon.io.basic_auth import BasicAuth
from calmon.io.exposition import Exposition
from calmon.io.tls_server import TlsServer
from calmon.io.webconfig import WebConfig

log = logging.getLogger(__name__)

# A page handler takes the query string's parameters and returns (status, content type, body).
# It may have a ``cache_key(params) -> Hashable``: the parsed query as far as it matters.
Page = Callable[[dict[str, list[str]]], tuple[int, str, bytes]]
# /metrics: (Accept, Accept-Encoding) -> (content type, content encoding or None, body parts)
Metrics = Callable[[str, str], tuple[str, str | None, list[bytes]]]


MAX_CONNECTIONS = 32  # requests other than probes served at once, a thread each
MAX_PENDING = 256  # connections whose request has not arrived whole yet
REQUEST_TIMEOUT_S = 10.0
MAX_REQUEST_BYTES = 64 * 1024  # request line and headers of a GET
PROBE_SEND_TIMEOUT_S = 1.0  # a probe's answer is a few bytes: the send buffer takes it
PROBES = frozenset({"/healthz", "/readyz"})
PAGE_CACHE_S = 5.0
PAGE_CACHE_ENTRIES = 64
PAGE_CACHE_BYTES = 32 * 1024 * 1024
GZIP_MIN_BYTES = 1024  # smaller answers go as they are: gzip would not pay for itself
GZIP_LEVEL = 6
BUSY = (b"HTTP/1.0 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\n"
        b"Content-Length: 5\r\nConnection: close\r\nRetry-After: 1\r\n\r\nbusy\n")


@dataclass
class _Waiting:
    """A connection whose request line and headers are being read."""

    address: Any
    deadline: float
    head: bytearray = field(default_factory=bytearray)
    handshaken: bool = True  # False until a TLS connection's handshake is done


@dataclass(frozen=True)
class Exchange:
    """What a handler gets as ``self.server``: the request as read, whole."""

    head: bytes


def _end_of_head(buf: bytearray, searched_from: int) -> bool:
    start = max(0, searched_from - 3)
    return buf.find(b"\r\n\r\n", start) >= 0 or buf.find(b"\n\n", start) >= 0


def _path_of(head: bytes) -> str:
    """The path of ``GET /path?query HTTP/1.1`` (empty when the line is not that)."""
    line = head.split(b"\n", 1)[0].decode("latin-1").split()
    if len(line) < 2 or line[0] != "GET":
        return ""
    return urlsplit(line[1]).path


def header_of(head: bytes, name: str) -> str | None:
    """The value of header ``name`` in a request head (case-insensitive), or None."""
    want = name.lower().encode("latin-1")
    for line in head.split(b"\n")[1:]:
        key, sep, value = line.partition(b":")
        if sep and key.strip().lower() == want:
            return value.strip().decode("latin-1")
    return None


class _Server:
    """The listening socket, the thread that reads requests (see the module
    docstring), and the request threads. ``serve(sock, address, head)`` answers one
    request on a blocking socket; the caller closes it.

    The one place a connection is accepted (``_accept``) is where TLS wraps it (with
    ``tls``'s current context, or a fixed ``ssl_context``); ``_admission`` is where
    the client certificate and ``auth`` are checked."""

    def __init__(self, host: str, port: int, serve: Callable[[socket.socket, Any, bytes], None],
                 *, max_connections: int, request_timeout_s: float,
                 max_pending: int | None = None, ssl_context: ssl.SSLContext | None = None,
                 tls: TlsServer | None = None, auth: BasicAuth | None = None) -> None:
        family, kind, proto, _, address = socket.getaddrinfo(
            host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
        listener = socket.socket(family, kind, proto)
        try:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind(address)
            listener.listen(128)  # bursts wait in the kernel, not in threads
            listener.setblocking(False)
        except OSError:
            listener.close()
            raise
        self._listener = listener
        self.server_address = listener.getsockname()
        self._serve = serve
        self._ssl = ssl_context  # TLS on every connection, probes included
        self._tls = tls  # the same, re-read when its files change, and the client policy
        self._slots = threading.BoundedSemaphore(max_connections)
        self._timeout = request_timeout_s
        self._max_pending = MAX_PENDING if max_pending is None else max_pending
        self._admission = None if tls is None and auth is None else Admission(
            tls, auth, max_waiting=self._max_pending, dispatch=self._dispatch,
            refuse=self._refuse, busy=self._busy, gone=self._gone)
        self._waiting: dict[socket.socket, _Waiting] = {}  # oldest first
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._stopping = threading.Event()
        self._stopped = threading.Event()
        self._stopped.set()  # until serve_forever runs: shutdown() has nothing to wait for
        self.rejected = 0  # requests answered 503 because every request slot was taken
        self.dropped = 0  # connections closed before a whole request (deadline, size, cap)
        self.refused = 0  # requests answered 401 or 403

    # -------------------------------------------------------------- the reading thread

    def serve_forever(self, poll_interval: float = 0.5) -> None:
        sel = self._selector
        sel.register(self._listener, selectors.EVENT_READ, "accept")
        sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        if self._admission is not None:
            self._admission.start()
        try:
            while not self._stopping.is_set():
                now = time.monotonic()
                first = next(iter(self._waiting.values()), None)  # the oldest: first due
                wait = poll_interval if first is None else min(
                    poll_interval, max(0.0, first.deadline - now))
                for key, _ in sel.select(wait):
                    if key.data == "accept":
                        self._accept()
                    elif key.data == "wake":
                        self._wake_r.recv(64)
                    else:
                        self._read(key.fileobj)  # type: ignore[arg-type]
                now = time.monotonic()
                while self._waiting:  # deadlines are in arrival order
                    sock, w = next(iter(self._waiting.items()))
                    if w.deadline > now:
                        break
                    self._drop(sock)
        finally:
            for sock in list(self._waiting):
                self._drop(sock)
            if self._admission is not None:
                self._admission.stop()
            self._stopped.set()

    def _accept(self) -> None:
        for _ in range(64):  # a burst at a time, then the waiting ones get a turn
            try:
                sock, address = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:  # out of file descriptors: make room, try next round
                log.debug("http: accept failed: %s", e)
                if self._waiting:
                    self._drop(next(iter(self._waiting)))
                return
            if len(self._waiting) >= self._max_pending:
                self._drop(next(iter(self._waiting)))
            sock.setblocking(False)
            context = self._tls.context() if self._tls is not None else self._ssl
            if context is not None:  # the handshake runs in _read, without blocking
                try:
                    sock = context.wrap_socket(sock, server_side=True,
                                               do_handshake_on_connect=False)
                except (OSError, ssl.SSLError):
                    _close(sock)
                    continue
            self._waiting[sock] = _Waiting(address, time.monotonic() + self._timeout,
                                           handshaken=context is None)
            self._selector.register(sock, selectors.EVENT_READ, "request")

    def _read(self, sock: socket.socket) -> None:
        w = self._waiting.get(sock)
        if w is None:
            return
        try:
            if not w.handshaken:
                sock.do_handshake()  # type: ignore[attr-defined] # an SSLSocket here
                w.handshaken = True
            chunk = sock.recv(min(16384, MAX_REQUEST_BYTES - len(w.head)))
            # TLS may hold decrypted bytes the selector cannot see: take them now
            while chunk and isinstance(sock, ssl.SSLSocket) and sock.pending() and (
                    len(w.head) + len(chunk) < MAX_REQUEST_BYTES):
                chunk += sock.recv(min(sock.pending(),
                                       MAX_REQUEST_BYTES - len(w.head) - len(chunk)))
        except (BlockingIOError, InterruptedError, ssl.SSLWantReadError,
                ssl.SSLWantWriteError):
            return
        except OSError:  # ssl.SSLError included: a failed handshake
            self._drop(sock)
            return
        if not chunk:  # the client went away
            self._drop(sock)
            return
        seen = len(w.head)
        w.head += chunk
        if not _end_of_head(w.head, seen):
            if len(w.head) >= MAX_REQUEST_BYTES:
                self._drop(sock)
            return
        del self._waiting[sock]
        self._selector.unregister(sock)
        head = bytes(w.head)
        if _path_of(head) in PROBES:
            self._answer(sock, w.address, head, PROBE_SEND_TIMEOUT_S)
            return
        if self._admission is None:
            self._dispatch(sock, w.address, head)
        else:
            self._admission.admit(sock, w.address, head, w.deadline,
                                  header_of(head, "Authorization"))

    def _dispatch(self, sock: socket.socket, address: Any, head: bytes) -> None:
        """A request slot and a thread for an admitted request, or 503 at once."""
        if not self._slots.acquire(blocking=False):
            self._busy(sock)
            return
        try:
            threading.Thread(target=self._work, args=(sock, address, head),
                             name="calmon-http-request", daemon=True).start()
        except BaseException:  # no thread started: give the slot back
            self._slots.release()
            _close(sock)
            raise

    def _busy(self, sock: socket.socket) -> None:
        self.rejected += 1
        with contextlib.suppress(OSError):  # a fresh send buffer takes them at once
            sock.send(BUSY)
        _close(sock)

    def _refuse(self, sock: socket.socket, answer: bytes) -> None:
        self.refused += 1
        with contextlib.suppress(OSError):  # a few bytes: the send buffer takes them
            sock.send(answer)
        _close(sock)

    def _gone(self, sock: socket.socket) -> None:
        """A connection the admission closes unanswered (its client hung up)."""
        self.dropped += 1
        _close(sock)

    def _drop(self, sock: socket.socket) -> None:
        self._waiting.pop(sock, None)
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(sock)
        self.dropped += 1
        _close(sock)

    # -------------------------------------------------------------- answering

    def _work(self, sock: socket.socket, address: Any, head: bytes) -> None:
        try:
            self._answer(sock, address, head, self._timeout)
        finally:
            self._slots.release()

    def _answer(self, sock: socket.socket, address: Any, head: bytes, timeout: float) -> None:
        try:
            sock.settimeout(timeout)  # bounds sending the whole answer
            self._serve(sock, address, head)
        except Exception:  # a client that vanished mid-answer is not worth a traceback
            log.debug("http: error serving %s", address, exc_info=True)
        finally:
            _close(sock)

    # -------------------------------------------------------------- lifecycle

    def starting(self) -> None:
        """Call before running ``serve_forever`` in a thread: ``shutdown`` then waits
        for it."""
        self._stopped.clear()

    def shutdown(self) -> None:
        self._stopping.set()
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")
        self._stopped.wait(5)

    def server_close(self) -> None:
        self._selector.close()
        for s in (self._listener, self._wake_r, self._wake_w):
            s.close()


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_WR)  # what was sent goes out before the close
    sock.close()


class _SendAll(io.BufferedIOBase):
    """A handler's ``wfile``: every write sent whole (``sendall``), under the socket's
    timeout."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        self._sock.sendall(data)
        return len(memoryview(data))


class _PageCache:
    """Answers of pages per (path, parsed query), kept ``ttl_s`` seconds, at most
    ``entries`` of them and ``max_bytes`` of bodies (oldest dropped first); builds run
    one at a time, so concurrent scrapes of one page wait for one build."""

    def __init__(self, ttl_s: float, entries: int = PAGE_CACHE_ENTRIES,
                 max_bytes: int = PAGE_CACHE_BYTES) -> None:
        self.ttl_s = ttl_s
        self.entries = entries
        self.max_bytes = max_bytes
        self.builds = 0
        self._lock = threading.Lock()
        self._cache: dict[tuple[str, Hashable], tuple[float, tuple[int, str, bytes]]] = {}
        self._gz: dict[int, tuple[bytes, bytes]] = {}  # id(cached body) -> (body, its gzip)

    @property
    def nbytes(self) -> int:
        return sum(len(a[2]) for _, a in self._cache.values())

    def gzipped(self, body: bytes) -> bytes:
        """The gzip form of a cached body, compressed once per body (a 338 KB
        /reliability is sent as ~40 KB to every client that accepts gzip)."""
        with self._lock:
            hit = self._gz.get(id(body))
            if hit is not None and hit[0] is body:
                return hit[1]
        gz = gzip.compress(body, GZIP_LEVEL)
        with self._lock:
            live = {id(a[2]) for _, a in self._cache.values()}
            self._gz = {k: v for k, v in self._gz.items() if k in live}
            if id(body) in live:
                self._gz[id(body)] = (body, gz)
        return gz

    def get(self, path: str, query: str, page: Page) -> tuple[int, str, bytes]:
        params = parse_qs(query)
        make_key = getattr(page, "cache_key", None)
        qkey: Hashable = (make_key(params) if make_key is not None else
                          tuple(sorted((k, tuple(v)) for k, v in params.items())))
        key = (path, qkey)
        with self._lock:
            now = time.monotonic()
            for k in [k for k, (t, _) in self._cache.items() if now - t >= self.ttl_s]:
                del self._cache[k]
            hit = self._cache.get(key)
            if hit is not None:
                return hit[1]
            answer = page(params)
            self.builds += 1
            size = len(answer[2])
            if self.ttl_s > 0 and size <= self.max_bytes:
                while self._cache and (len(self._cache) >= self.entries
                                       or self.nbytes + size > self.max_bytes):
                    del self._cache[min(self._cache, key=lambda k: self._cache[k][0])]
                self._cache[key] = (time.monotonic(), answer)
            return answer


class HttpServer:
    def __init__(self, host: str, port: int, registry: CollectorRegistry,
                 ready: Callable[[], bool], status: Callable[[], dict[str, Any]],
                 pages: dict[str, Page] | None = None, *,
                 alive: Callable[[], bool] = lambda: True,
                 unready_reason: Callable[[], str | None] | None = None,
                 max_connections: int = MAX_CONNECTIONS,
                 request_timeout_s: float = REQUEST_TIMEOUT_S,
                 page_cache_s: float = PAGE_CACHE_S, web: WebConfig | None = None,
                 metrics: Metrics | None = None) -> None:
        self.registry = registry
        # without a daemon's exposition, the registry's families rendered per request
        self.metrics = metrics or Exposition(None, lambda: None, [registry]).render
        self.alive = alive  # /healthz: False when the main loop is stuck
        self.ready = ready
        self.unready_reason = unready_reason  # /readyz's 503 says why
        self.status = status
        self.pages = dict(pages or {})
        self.request_timeout_s = request_timeout_s
        self.page_cache = _PageCache(page_cache_s)
        handler = _make_handler(self)

        def serve(sock: socket.socket, address: Any, head: bytes) -> None:
            handler(sock, address, Exchange(head))  # type: ignore[arg-type]

        # the server's construction, in one place: TLS and basic auth from the web config
        self.extra_headers = dict(web.headers) if web is not None else {}
        self.tls = web is not None and web.tls is not None
        self._server = _Server(
            host, port, serve, max_connections=max_connections,
            request_timeout_s=request_timeout_s,
            tls=web.tls if web is not None else None,
            auth=web.auth if web is not None else None)
        self._thread: threading.Thread | None = None

    @property
    def rejected(self) -> int:
        """Requests turned away with 503 because ``max_connections`` were busy."""
        return self._server.rejected

    @property
    def dropped(self) -> int:
        """Connections closed before they sent a whole request (too slow, too large,
        or the oldest of too many waiting)."""
        return self._server.dropped

    @property
    def refused(self) -> int:
        """Requests answered 401 (credentials) or 403 (client certificate)."""
        return self._server.refused

    @property
    def passwords_waiting(self) -> int:
        """Requests whose new credentials wait for the bcrypt thread."""
        admission = self._server._admission
        return 0 if admission is None else admission.waiting

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def __enter__(self) -> HttpServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        self._server.starting()
        self._thread = threading.Thread(target=self._server.serve_forever, name="calmon-http",
                                        kwargs={"poll_interval": 0.2}, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)


class _Handler(BaseHTTPRequestHandler):
    """One request of an ``HttpServer`` (``app``: set on the subclass each server makes)."""

    server_version = "calmon"
    app: HttpServer

    def setup(self) -> None:
        # the request was read whole before a thread was spent on it (_Server)
        self.connection = self.request
        self.rfile = io.BytesIO(self.server.head)  # type: ignore[attr-defined]
        self.wfile = _SendAll(self.connection)

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        try:
            if url.path == "/metrics":
                accept = self.headers.get("Accept", "")
                accept_encoding = self.headers.get("Accept-Encoding", "")
                self._send_parts(200, *self.app.metrics(accept, accept_encoding))
            elif url.path == "/healthz":
                ok = self.app.alive()
                self._send(200 if ok else 503, "text/plain; charset=utf-8",
                           b"ok\n" if ok else b"main loop stalled\n")
            elif url.path == "/readyz":
                app = self.app
                why = app.unready_reason() if app.unready_reason is not None else (
                    None if app.ready() else "not ready")
                self._send(200 if why is None else 503, "text/plain; charset=utf-8",
                           b"ready\n" if why is None else f"not ready: {why}\n".encode())
            elif url.path == "/status":
                body = json.dumps(self.app.status(), indent=2, default=str).encode()
                self._send(200, "application/json", body + b"\n", compress=True)
            elif url.path in self.app.pages:
                code, ctype, body = self.app.page_cache.get(url.path, url.query,
                                                            self.app.pages[url.path])
                self._send(code, ctype, body, compress=True, cached=True)
            else:
                self._send(404, "text/plain; charset=utf-8", b"not found\n")
        except (ConnectionError, TimeoutError, ssl.SSLError) as e:  # the client went away
            # (a browser closing a tab, a dropped /favicon.ico): not a calmon error
            log.debug("client gone while serving %s: %r", url.path, e)
            self.close_connection = True
        except Exception:  # a broken page must not take the server down
            log.exception("error serving %s", url.path)
            self._send(500, "text/plain; charset=utf-8", b"internal error\n")

    def handle_one_request(self) -> None:
        try:
            super().handle_one_request()
        except (TimeoutError, OSError):  # too slow, or gone: drop the connection
            self.close_connection = True

    def _send(self, code: int, ctype: str, body: bytes, *, compress: bool = False,
              cached: bool = False) -> None:
        """One answer; with ``compress``, gzip when the client accepts it and the
        body is worth it (``cached``: the page cache keeps its gzip form too)."""
        if compress and len(body) >= GZIP_MIN_BYTES and gzip_accepted(
                self.headers.get("Accept-Encoding", "")):
            gz = self.app.page_cache.gzipped(body) if cached else gzip.compress(body,
                                                                           GZIP_LEVEL)
            self._send_parts(code, ctype, "gzip", [gz])
            return
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        if compress:  # what a cache in between must key its copies by
            self.send_header("Vary", "Accept-Encoding")
        self.send_header("Content-Length", str(len(body)))
        for name, value in self.app.extra_headers.items():  # http_server_config.headers
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def _send_parts(self, code: int, ctype: str, encoding: str | None,
                    parts: list[bytes]) -> None:
        """A body in parts written one after the other (shared bytes, never joined)."""
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        if encoding is not None:
            self.send_header("Content-Encoding", encoding)
        self.send_header("Vary", "Accept-Encoding")
        self.send_header("Content-Length", str(sum(len(p) for p in parts)))
        for name, value in self.app.extra_headers.items():  # http_server_config.headers
            self.send_header(name, value)
        self.end_headers()
        for part in parts:
            self.wfile.write(part)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("http: " + format, *args)


def _make_handler(app: HttpServer) -> type[BaseHTTPRequestHandler]:
    return type("Handler", (_Handler,), {"app": app})
