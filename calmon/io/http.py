"""The HTTP side: /metrics, /healthz, /readyz, /status (and pages added by others).

A stdlib ``ThreadingHTTPServer``: scrapes and probes must never wait on the
consumer loop, and every handler only reads through the callables it is given.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import CollectorRegistry

log = logging.getLogger(__name__)

# A page handler takes the query string's parameters and returns (status, content type, body).
Page = Callable[[dict[str, list[str]]], tuple[int, str, bytes]]


class HttpServer:
    def __init__(self, host: str, port: int, registry: CollectorRegistry,
                 ready: Callable[[], bool], status: Callable[[], dict[str, Any]],
                 pages: dict[str, Page] | None = None, *,
                 alive: Callable[[], bool] = lambda: True) -> None:
        self.registry = registry
        self.alive = alive  # /healthz: False when the main loop is stuck
        self.ready = ready
        self.status = status
        self.pages = dict(pages or {})
        handler = _make_handler(self)
        self._server = ThreadingHTTPServer((host, port), handler)
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

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
                    self._send(*app.pages[url.path](parse_qs(url.query)))
                else:
                    self._send(404, "text/plain; charset=utf-8", b"not found\n")
            except Exception:  # a broken page must not take the server down
                log.exception("error serving %s", url.path)
                self._send(500, "text/plain; charset=utf-8", b"internal error\n")

        def _send(self, code: int, ctype: str, body: bytes) -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            log.debug("http: " + format, *args)

    return Handler
