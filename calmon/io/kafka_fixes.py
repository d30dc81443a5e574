"""A fix to kafka-python (3.0) that calmon needs to name a rejected login.

kafka-python's transports read a socket until it would block, and when the
read ends at the peer's close they drop the bytes read before it. Apache Kafka
answers a failed SASL authentication with an error response and then closes
the connection (``connection.failed.authentication.delay.ms`` later), so the
answer and the close often arrive in one read: kafka-python then reports only
"socket disconnected" and retries forever, and a wrong password looks like a
flaky network. Here the bytes are handed on first and the close is reported by
the next read (a closed socket is readable at once and reads empty again), so
the client sees ``SaslAuthenticationFailedError`` with the broker's reason.

While bootstrapping, kafka-python retries even that until its timeout and
raises a bare "Unable to bootstrap". Connections therefore note their last
authentication failure by client id (``auth_failure``), so the source can say
why it could not connect.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

log = logging.getLogger(__name__)

_lock = threading.Lock()
_installed = False
_auth_failures: dict[str, tuple[float, str]] = {}  # client_id -> (monotonic time, reason)


def auth_failure(client_id: str, since: float) -> str | None:
    """The broker's reason for rejecting the last login of a connection of ``client_id``
    at or after monotonic time ``since``, or None."""
    seen = _auth_failures.get(client_id)
    return seen[1] if seen is not None and seen[0] >= since else None


def _noting_auth_failures(original: Any) -> Any:
    from kafka.errors import SaslAuthenticationFailedError

    def connection_lost(self: Any, exc: Any) -> Any:
        if isinstance(exc, SaslAuthenticationFailedError):
            _auth_failures[str(self.config.get("client_id"))] = (time.monotonic(), str(exc))
        return original(self, exc)

    return connection_lost


def _data_before_eof(original: Any) -> Any:
    def _sock_recv(self: Any) -> tuple[bytes, Any]:
        data, err = original(self)
        if err is not None and data:
            return data, None  # the close is read again, and reported, next time
        return data, err

    _sock_recv.__wrapped__ = original  # type: ignore[attr-defined]
    return _sock_recv


def install() -> None:
    """Patch kafka-python once per process (idempotent; a kafka-python without these
    transports is left alone)."""
    global _installed
    with _lock:
        if _installed:
            return
        _installed = True
        try:
            from kafka.net import connection, transport
        except ImportError:  # kafka-python 2.x: another network layer
            return
        conn = getattr(connection, "KafkaConnection", None)
        if conn is not None and "connection_lost" in vars(conn):
            conn.connection_lost = _noting_auth_failures(conn.connection_lost)
        for name in ("KafkaTCPTransport", "KafkaSSLTransport"):
            cls = getattr(transport, name, None)
            recv = getattr(cls, "_sock_recv", None) if cls is not None else None
            if recv is None or "_sock_recv" not in vars(cls):
                continue
            cls._sock_recv = _data_before_eof(recv)  # type: ignore[union-attr]
