"""Alertmanager-compatible webhook: POST a list of alerts to ``/api/v2/alerts``.

``send`` only enqueues (a bounded queue: when full, the alert is dropped and counted
as failed), so the scheduler thread never waits on a slow webhook. A sender thread
(started by ``start``, i.e. by the daemon through the recalibrator) delivers each
alert with short timeouts and a few retries, all within one overall deadline per
alert. Failures are counted (``calmon_alerts_failed_total``); the URL is logged with
its user-info and query string masked, since they often carry tokens.
"""

from __future__ import annotations

import contextlib
import json
import logging
import queue
import threading
import time
import urllib.error
import urllib.request
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlsplit, urlunsplit

log = logging.getLogger(__name__)

QUEUE_SIZE = 100


def _iso(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def mask_url(url: str) -> str:
    """``url`` with user-info and query string replaced by ``***`` (for logs)."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        if parts.port is not None:
            host = f"{host}:{parts.port}"
        netloc = f"***@{host}" if (parts.username or parts.password) else host
        return urlunsplit((parts.scheme, netloc, parts.path, "***" if parts.query else "",
                           ""))
    except ValueError:
        return "***"


class AlertSender:
    def __init__(self, url: str | None, *, timeout: float = 2.0, retries: int = 3,
                 backoff: float = 0.5, deadline: float = 10.0,
                 lasts: timedelta = timedelta(hours=1)) -> None:
        self.url = url
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self.deadline = deadline  # seconds for all attempts of one alert together
        self.lasts = lasts  # events are shown as firing this long, then resolve by themselves
        self.sent = 0
        self.failed = 0
        self._queue: queue.Queue[bytes | None] = queue.Queue(QUEUE_SIZE)
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self.url and self._thread is None:
            self._thread = threading.Thread(target=self._run, name="calmon-alerts",
                                            daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 2.0) -> None:
        if self._thread is not None:
            with contextlib.suppress(queue.Full):
                self._queue.put_nowait(None)
            self._thread.join(timeout)
            self._thread = None

    def send(self, alertname: str, labels: dict[str, str], annotations: dict[str, Any],
             severity: str = "info") -> bool:
        """Enqueue one alert; False when there is no webhook or the queue is full. Without
        a started sender thread, delivers inline (tests, one-shot tools)."""
        if not self.url:
            return False
        now = datetime.now(UTC)
        alert = {
            "labels": {"alertname": alertname, "severity": severity, **labels},
            "annotations": {k: v if isinstance(v, str) else json.dumps(v)
                            for k, v in annotations.items()},
            "startsAt": _iso(now),
            "endsAt": _iso(now + self.lasts),
            "generatorURL": "calmon://recalibration",
        }
        body = json.dumps([alert]).encode()
        if self._thread is None:
            return self._deliver(alertname, body)
        try:
            self._queue.put_nowait(body)
            return True
        except queue.Full:
            self.failed += 1
            log.warning("alert %s dropped: the alert queue is full", alertname)
            return False

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until the queue is drained (tests); True when it was."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self._queue.unfinished_tasks == 0:
                return True
            time.sleep(0.01)  # polling a condition with a deadline
        return False

    def _run(self) -> None:
        while True:
            body = self._queue.get()
            try:
                if body is None:
                    return
                name = json.loads(body)[0]["labels"]["alertname"]
                self._deliver(name, body)
            finally:
                self._queue.task_done()

    def _deliver(self, alertname: str, body: bytes) -> bool:
        assert self.url
        end = time.monotonic() + self.deadline
        err: Exception = RuntimeError("deadline passed")
        for attempt in range(self.retries):
            left = end - time.monotonic()
            if left <= 0:
                break
            req = urllib.request.Request(self.url, data=body, method="POST",
                                         headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=min(self.timeout, left)) as resp:
                    if 200 <= resp.status < 300:
                        self.sent += 1
                        return True
                    err = RuntimeError(f"HTTP {resp.status}")
            except (urllib.error.URLError, OSError, ValueError) as e:
                err = e
            if attempt + 1 < self.retries:
                time.sleep(min(self.backoff * 2**attempt, max(0.0, end - time.monotonic())))
        self.failed += 1
        log.warning("alert %s not delivered to %s: %s", alertname, mask_url(self.url), err)
        return False
