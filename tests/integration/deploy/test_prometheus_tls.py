"""A real Prometheus scrapes the real daemon over TLS with basic auth (server.web_config_file,
the exporter-toolkit format); a wrong password is refused, and probes need no password."""

from __future__ import annotations

import shutil
import ssl
import subprocess
import urllib.request
from pathlib import Path

import pytest
import yaml

from tests.conftest import create_topics, free_port, unique_topic
from tests.daemon_helpers import CalmonDaemon, write_config
from tests.integration.deploy.test_prometheus_live import Prometheus, wait_for
from tests.tls_helpers import web_config

pytestmark = [
    pytest.mark.integration,
    # one broker: what is tested here is Prometheus / the pages / HTTP TLS, the broker is
    # incidental (and this module is among the suite's heaviest); the Kafka side runs
    # on both brokers in the daemon tests
    pytest.mark.brokers("tansu"),
]


def test_prometheus_scrapes_over_tls_with_basic_auth(tmp_path: Path,
                                                      kafka_bootstrap: str) -> None:
    if shutil.which("prometheus") is None:
        pytest.skip("prometheus is not on PATH (Debian: apt-get install prometheus)")
    web = web_config(tmp_path / "tls", {"prometheus": "scrape-pass"})
    ca = tmp_path / "tls" / "ca.crt"
    preds, labels = unique_topic(), unique_topic()
    create_topics(kafka_bootstrap, [preds, labels], partitions=1)
    cfg = write_config(tmp_path / "calmon.yaml", kafka_bootstrap, preds, labels,
                       server={"web_config_file": str(web)})
    daemon = CalmonDaemon(cfg).start(wait_ready=False)  # its wait speaks plain HTTP
    try:
        # the kubelet's probe: TLS, no password
        ctx = ssl.create_default_context(cafile=str(ca))

        def ready() -> bool:
            assert daemon.running, daemon.log_tail()
            with urllib.request.urlopen(f"https://127.0.0.1:{daemon.port}/readyz", context=ctx,
                                        timeout=10) as r:
                return r.status == 200

        wait_for(ready, 90)
        target = f"127.0.0.1:{daemon.port}"
        job = {"scheme": "https", "tls_config": {"ca_file": str(ca)},
               "static_configs": [{"targets": [target]}]}
        config = {"global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
                  "scrape_configs": [
                      {"job_name": "good", **job,
                       "basic_auth": {"username": "prometheus", "password": "scrape-pass"}},
                      {"job_name": "wrong", **job,
                       "basic_auth": {"username": "prometheus", "password": "guess"}},
                      {"job_name": "plain", "static_configs": [{"targets": [target]}]}]}
        (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
        port = free_port()
        with (tmp_path / "prometheus.log").open("wb") as log:
            proc = subprocess.Popen(
                ["prometheus", f"--config.file={tmp_path / 'prometheus.yml'}",
                 f"--storage.tsdb.path={tmp_path / 'data'}",
                 f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        try:
            prom = Prometheus(f"http://127.0.0.1:{port}")

            def scraped() -> dict[str, dict] | None:
                targets = prom.get("/api/v1/targets")["data"]["activeTargets"]
                by_job = {t["labels"]["job"]: t for t in targets}
                done = set(by_job) == {"good", "wrong", "plain"} and all(
                    t["health"] != "unknown" for t in by_job.values())
                return by_job if done else None

            by_job = wait_for(scraped, 60)
            assert by_job["good"]["health"] == "up", by_job["good"]
            assert by_job["wrong"]["health"] == "down"
            assert "401" in by_job["wrong"]["lastError"], by_job["wrong"]["lastError"]
            assert by_job["plain"]["health"] == "down"  # TLS is not optional
            assert wait_for(lambda: prom.query('calmon_build_info{job="good"}'), 30)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    finally:
        daemon.stop()
