"""/readyz says what is true at start: the broker is not reachable while it is not.

The newcomer started calmon before the broker and read "partitions not assigned yet",
where the README promised "the Kafka broker is not reachable"; the reason now comes
from a connection attempt at once (not after the consumer's 30 s metadata timeout),
and readiness follows when the broker comes up.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import create_topics, tansu_binary, unique_topic
from tests.daemon_helpers import CalmonDaemon, http_get, wait_until, write_config

pytestmark = pytest.mark.integration


def test_readyz_names_an_unreachable_broker_then_turns_ready(tmp_path: Path) -> None:
    from calmon.demo.broker import TansuBroker, free_port

    binary = tansu_binary()  # skips when the broker binary is missing
    port = free_port()
    preds, labels = unique_topic(), unique_topic()
    cfg = write_config(tmp_path / "c.yaml", f"127.0.0.1:{port}", preds, labels)
    with CalmonDaemon(cfg).start(wait_ready=False) as daemon:
        def reason() -> bytes | None:
            assert daemon.running, daemon.log_tail()
            code, body = http_get(daemon.port, "/readyz", timeout=2.0)
            return body if code == 503 and b"not reachable" in body else None

        body = wait_until(reason, 30, "/readyz naming the unreachable broker",
                          detail=daemon.log_tail).decode()
        assert body.startswith("not ready: partitions not assigned yet: the Kafka broker is "
                               f"not reachable (127.0.0.1:{port}: Connection refused)"), body
        assert "kafka.bootstrap_servers" in body
        with TansuBroker(binary, port=port, log=tmp_path / "tansu.log"):
            create_topics(f"127.0.0.1:{port}", [preds, labels], partitions=1)
            daemon.wait_ready(60)
            assert http_get(daemon.port, "/readyz") == (200, b"ready\n")
