"""Acceptance 6 (first half): a published refit reaches a real Alertmanager.

The test starts ``prometheus-alertmanager`` (Debian package) on a free loopback port
with a null receiver and clustering off, points ``alerts.webhook`` at its
``/api/v2/alerts`` and reads the alerts back from its API. The closed-port half
(the daemon keeps consuming) is in test_daemon.py.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from calmon.engine.engine import Engine
from calmon.recal.loop import Recalibrator
from tests.conftest import _free_port
from tests.daemon_helpers import http_get, wait_until
from tests.recal_helpers import BASE_TS, binary_logit_stream, feed, recal_config

ALERTMANAGER = "/usr/bin/prometheus-alertmanager"
AM_CONFIG = """\
route:
  receiver: "null"
receivers:
  - name: "null"
"""


class Alertmanager:
    def __init__(self, tmp: Path) -> None:
        self.port = _free_port()
        self.tmp = tmp
        self.log = tmp / "alertmanager.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api/v2/alerts"

    def start(self) -> None:
        cfg = self.tmp / "alertmanager.yml"
        cfg.write_text(AM_CONFIG, encoding="utf-8")
        (self.tmp / "data").mkdir()
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                [ALERTMANAGER, f"--config.file={cfg}", f"--storage.path={self.tmp / 'data'}",
                 f"--web.listen-address=127.0.0.1:{self.port}", "--cluster.listen-address="],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)

        def ready() -> bool:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"alertmanager exited {self.proc.returncode}:\n"
                                     f"{self.log.read_text(errors='replace')[-2000:]}")
            return http_get(self.port, "/-/ready", timeout=1.0)[0] == 200

        wait_until(ready, 20, "alertmanager /-/ready",
                   detail=lambda: self.log.read_text(errors="replace")[-2000:])

    def alerts(self) -> list[dict[str, Any]]:
        code, body = http_get(self.port, "/api/v2/alerts")
        assert code == 200, code
        return json.loads(body)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


@pytest.fixture
def alertmanager(tmp_path: Path) -> Iterator[Alertmanager]:
    if not os.access(ALERTMANAGER, os.X_OK):
        pytest.skip(f"{ALERTMANAGER} is not installed (Debian package prometheus-alertmanager)")
    am = Alertmanager(tmp_path / "am")
    am.tmp.mkdir()
    am.start()
    try:
        yield am
    finally:
        am.stop()


def test_published_refit_is_an_alert_in_alertmanager(alertmanager: Alertmanager,
                                                     tmp_path: Path) -> None:
    cfg = recal_config(tmp_path, alerts={"webhook": alertmanager.url})
    engine = Engine(cfg)
    recal = Recalibrator(cfg, engine)
    rng = np.random.default_rng(11)
    feed(engine, binary_logit_stream(rng, "ctr", 4000, BASE_TS, 1800.0, scale=2.5))
    events = recal.run_once()
    assert [e.kind for e in events] == ["drift", "published"]
    # only the refit goes to the webhook: drift is alerted by Prometheus rules
    assert recal.alerts.failed == 0 and recal.alerts.sent == 1

    def published() -> dict[str, Any] | None:
        for a in alertmanager.alerts():
            if a["labels"].get("alertname") == "CalmonRefitPublished":
                return a
        return None

    alert = wait_until(published, 10, "CalmonRefitPublished in Alertmanager",
                       detail=alertmanager.alerts)
    assert alert["labels"]["model"] == "ctr"
    assert alert["labels"]["segment"] == "__all__"
    assert alert["labels"]["method"] == "temperature"
    assert alert["annotations"]["version"] == "1"
    assert alert["status"]["state"] == "active"
    names = {a["labels"]["alertname"] for a in alertmanager.alerts()}
    assert names == {"CalmonRefitPublished"}
    assert json.loads(alert["annotations"]["params"])["temperature"] > 1.5
