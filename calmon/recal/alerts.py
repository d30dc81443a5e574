"""Alertmanager-compatible webhook: POST a list of alerts to ``/api/v2/alerts``.

Short timeouts and a few retries; a dead webhook costs a refit job a few
seconds at most and never touches the consumer loop.
"""

from __future__ import annotations

import json
import logging
import time
import urllib.error
import urllib.request
from datetime import UTC, datetime, timedelta
from typing import Any

log = logging.getLogger(__name__)


def _iso(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class AlertSender:
    def __init__(self, url: str | None, *, timeout: float = 2.0, retries: int = 3,
                 backoff: float = 0.5, lasts: timedelta = timedelta(hours=1)) -> None:
        self.url = url
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self.lasts = lasts  # events are shown as firing this long, then resolve by themselves
        self.sent = 0
        self.failed = 0

    def send(self, alertname: str, labels: dict[str, str], annotations: dict[str, Any],
             severity: str = "info") -> bool:
        if not self.url:
            return False
        now = datetime.now(UTC)
        alert = {
            "labels": {"alertname": alertname, "severity": severity, **labels},
            "annotations": {k: str(v) for k, v in annotations.items()},
            "startsAt": _iso(now),
            "endsAt": _iso(now + self.lasts),
            "generatorURL": "calmon://recalibration",
        }
        body = json.dumps([alert]).encode()
        for attempt in range(self.retries):
            req = urllib.request.Request(self.url, data=body, method="POST",
                                         headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                    if 200 <= resp.status < 300:
                        self.sent += 1
                        return True
            except (urllib.error.URLError, OSError, ValueError) as e:
                err = e
            else:
                err = RuntimeError(f"HTTP {resp.status}")
            if attempt + 1 < self.retries:
                time.sleep(self.backoff * 2**attempt)  # retry backoff, not synchronisation
        self.failed += 1
        log.warning("alert %s not delivered to %s: %s", alertname, self.url, err)
        return False
