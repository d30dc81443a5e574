"""Whether the broker can be reached at all, asked before an assignment.

A consumer that cannot reach ``kafka.bootstrap_servers`` says so only after its
metadata timeout (30 s); a TCP connection to each server says it at once, so
``/readyz`` tells "the Kafka broker is not reachable" while it is true, not
"partitions not assigned yet". Reaching a server proves nothing about security
settings or topics: the assignment that follows checks those.
"""

from __future__ import annotations

import socket
from collections.abc import Sequence

DEFAULT_PORT = 9092
TIMEOUT_S = 1.0


def _address(server: str) -> tuple[str, int]:
    """``host:port``, ``[v6]:port`` or a bare host (kafka-python's default port)."""
    host, sep, port = server.strip().rpartition(":")
    if not sep or (host.count(":") and not host.endswith("]")):  # bare host or v6 literal
        return server.strip().strip("[]"), DEFAULT_PORT
    return host.strip("[]") or "localhost", int(port)


def unreachable(servers: Sequence[str], timeout_s: float = TIMEOUT_S) -> str | None:
    """None once one server accepts a TCP connection, else why none did."""
    problems = []
    for server in servers:
        try:
            with socket.create_connection(_address(server), timeout_s):
                return None
        except (OSError, ValueError) as e:
            why = getattr(e, "strerror", None) or str(e) or type(e).__name__
            problems.append(f"{server}: {why}")
    return ("the Kafka broker is not reachable (" + "; ".join(problems)
            + "): check kafka.bootstrap_servers, and that the broker runs")
