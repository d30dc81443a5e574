"""Who gets past the HTTP server's reading thread (``calmon.io.http``) with a web
config: the client certificate its TLS policy wants (``calmon.io.tls_server``; else
403), then basic auth credentials (``calmon.io.basic_auth``; else 401).

Credentials already checked are answered from the cache at once, on the reading
thread. New ones wait in a queue (at most ``max_waiting``, each until its request
deadline; past either, 503) for the one thread that runs bcrypt
(``calmon-http-auth``, at the lowest CPU priority there is), holding no request
slot while they wait, and a client that hung up meanwhile costs no check. So a
flood of wrong passwords costs one core at most, and a scrape whose credentials
are remembered never waits behind it. The probes never come here.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import select
import socket
import ssl
import threading
import time
from collections.abc import Callable
from typing import Any

from calmon.io.basic_auth import Attempt, BasicAuth
from calmon.io.tls_server import TlsServer

log = logging.getLogger(__name__)

UNAUTHORIZED = (b"HTTP/1.0 401 Unauthorized\r\nWWW-Authenticate: Basic realm=\"calmon\"\r\n"
                b"Content-Type: text/plain; charset=utf-8\r\nContent-Length: 13\r\n"
                b"Connection: close\r\n\r\nunauthorized\n")
AUTH_NICE = 19  # the bcrypt thread's niceness: the lowest CPU priority there is

Sock = socket.socket
# (socket, address, head, deadline, credentials) waiting for the bcrypt thread
_Item = tuple[Sock, Any, bytes, float, Attempt]


def forbidden(why: str) -> bytes:
    body = f"forbidden: {why}\n".encode()
    return (b"HTTP/1.0 403 Forbidden\r\nContent-Type: text/plain; charset=utf-8\r\n"
            b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body)) + body


class Admission:
    """``admit`` a whole request: it ends in ``dispatch(sock, address, head)``,
    ``refuse(sock, answer)``, ``busy(sock)`` or ``gone(sock)`` (hung up), now or
    later from the bcrypt thread (``start``/``stop`` it with the server)."""

    def __init__(self, tls: TlsServer | None, auth: BasicAuth | None, *, max_waiting: int,
                 dispatch: Callable[[Sock, Any, bytes], None],
                 refuse: Callable[[Sock, bytes], None], busy: Callable[[Sock], None],
                 gone: Callable[[Sock], None]) -> None:
        self.tls, self.auth = tls, auth
        self._dispatch, self._refuse, self._busy, self._gone = dispatch, refuse, busy, gone
        self._checks: queue.Queue[_Item | None] = queue.Queue(maxsize=max_waiting)
        self._thread: threading.Thread | None = None

    @property
    def waiting(self) -> int:
        """Requests whose new credentials wait for the bcrypt thread."""
        return self._checks.qsize()

    def admit(self, sock: Sock, address: Any, head: bytes, deadline: float,
              authorization: str | None) -> None:
        if self.tls is not None and isinstance(sock, ssl.SSLSocket):
            why = self.tls.refusal(sock)
            if why is not None:
                self._refuse(sock, forbidden(why))
                return
        if self.auth is not None:
            attempt = self.auth.attempt(authorization)
            known = None if attempt is None else self.auth.cached(attempt)
            if attempt is None or known is False:
                self._refuse(sock, UNAUTHORIZED)
                return
            if known is None:  # bcrypt's turn, on the thread that runs it
                try:
                    self._checks.put_nowait((sock, address, head, deadline, attempt))
                except queue.Full:
                    self._busy(sock)
                return
        self._dispatch(sock, address, head)

    def start(self) -> None:
        if self.auth is not None and self._thread is None:
            self._thread = threading.Thread(target=self._check_passwords,
                                            name="calmon-http-auth", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """The queued connections are closed, then the thread is told to end."""
        thread, self._thread = self._thread, None
        if thread is None:
            return
        while True:
            try:
                item = self._checks.get_nowait()
            except queue.Empty:
                break
            if item is not None:
                self._gone(item[0])
        with contextlib.suppress(queue.Full):
            self._checks.put_nowait(None)
        thread.join(timeout=5)

    def _check_passwords(self) -> None:
        """New credentials, one at a time (``BasicAuth.verify`` serialises bcrypt), in
        arrival order, each at most until its request deadline."""
        with contextlib.suppress(OSError, AttributeError):  # Linux: niceness is per thread
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), AUTH_NICE)
        assert self.auth is not None
        while (item := self._checks.get()) is not None:
            sock, address, head, deadline, attempt = item
            try:
                if hung_up(sock):  # its answer would go nowhere: no bcrypt spent on it
                    self._gone(sock)
                elif time.monotonic() >= deadline:  # waited its whole request timeout
                    self._busy(sock)
                elif self.auth.verify(attempt):
                    self._dispatch(sock, address, head)
                else:
                    self._refuse(sock, UNAUTHORIZED)
            except Exception:  # one connection's trouble must not stop the checks
                log.debug("http: error checking credentials of %s", address, exc_info=True)
                self._gone(sock)


def hung_up(sock: Sock) -> bool:
    """Whether the client closed its side of a connection that waits for its answer
    (it has nothing more to send: a request is read whole before it waits)."""
    try:
        poll = select.poll()  # not select(): descriptors past 1024 are fine
        poll.register(sock, select.POLLIN)
        if not poll.poll(0):
            return False
        return sock.recv(1) == b""  # else the client sent more: it is still there
    except (BlockingIOError, InterruptedError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
        return False
    except OSError:  # reset, or a TLS connection cut without close_notify
        return True
