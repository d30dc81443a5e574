"""The webhook sender: a bounded queue off the scheduler thread, one deadline per alert,
failures counted, credentials never logged."""

from __future__ import annotations

import http.server
import logging
import threading
import time
from collections.abc import Iterator
from typing import ClassVar

import pytest

from calmon.recal.alerts import QUEUE_SIZE, AlertSender, mask_url
from tests.conftest import _free_port


def test_mask_url_hides_user_info_and_query() -> None:
    masked = mask_url("https://bob:s3cret@alerts.example:9093/api/v2/alerts?token=abc")
    assert "s3cret" not in masked and "bob" not in masked and "abc" not in masked
    assert masked == "https://***@alerts.example:9093/api/v2/alerts?***"
    assert mask_url("http://127.0.0.1:9093/api/v2/alerts") == "http://127.0.0.1:9093/api/v2/alerts"


class _Slow(http.server.BaseHTTPRequestHandler):
    delay = 0.0
    received: ClassVar[list[bytes]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        time.sleep(self.delay)  # the server under test is slow on purpose
        _Slow.received.append(body)
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Slow)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    _Slow.received = []
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}/api/v2/alerts"
    finally:
        srv.shutdown()
        srv.server_close()


def test_send_returns_at_once_and_the_thread_delivers(server: str) -> None:
    _Slow.delay = 0.3
    sender = AlertSender(server)
    sender.start()
    try:
        t0 = time.monotonic()
        for i in range(3):
            assert sender.send("CalmonRefitPublished", {"model": f"m{i}"}, {"x": 1})
        assert time.monotonic() - t0 < 0.2  # enqueued, not delivered inline
        assert sender.flush(10)
        assert sender.sent == 3 and sender.failed == 0 and len(_Slow.received) == 3
    finally:
        sender.stop()
        _Slow.delay = 0.0


def test_a_full_queue_drops_and_counts(server: str) -> None:
    _Slow.delay = 1.0
    sender = AlertSender(server, timeout=5.0, deadline=5.0, retries=1)
    sender.start()
    try:
        results = [sender.send("A", {}, {}) for _ in range(QUEUE_SIZE + 10)]
        assert results.count(False) >= 9  # one may already be in flight
        assert sender.failed == results.count(False)
    finally:
        _Slow.delay = 0.0
        sender.stop(timeout=0.1)


def test_a_dead_webhook_fails_within_the_deadline_and_logs_no_secret(caplog) -> None:
    port = _free_port()  # nothing listens there
    url = f"http://user:topsecret@127.0.0.1:{port}/api/v2/alerts?token=hunter2"
    sender = AlertSender(url, retries=10, backoff=0.2, deadline=1.0)
    caplog.set_level(logging.WARNING)
    t0 = time.monotonic()
    assert sender.send("CalmonRefitRejected", {}, {}) is False  # inline: no thread
    assert time.monotonic() - t0 < 2.5
    assert sender.failed == 1
    text = " ".join(r.getMessage() for r in caplog.records)
    assert "not delivered" in text
    assert "topsecret" not in text and "hunter2" not in text and "user" not in text
