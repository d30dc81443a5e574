"""Secrets never reach a config dump or a log line (calmon.secrets)."""

from __future__ import annotations

import io
import logging
import subprocess
import sys
from pathlib import Path
from unittest.mock import patch

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from calmon import secrets
from calmon.cli import main
from tests.daemon_helpers import REPO, subprocess_env

PASSWORD = "s3cr3t-Pa55w0rd!"
TOKEN = "tok-9f8e7d6c5b4a"
WEBHOOK = f"https://alice:{PASSWORD}@alerts.example.com:9093/api/v2/alerts?token={TOKEN}&x=1"


def test_check_config_masks_expanded_passwords_and_url_credentials(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("KAFKA_PASSWORD", PASSWORD)
    monkeypatch.setenv("HOOK_TOKEN", TOKEN)
    path = tmp_path / "config.yaml"
    path.write_text("""
kafka:
  client:
    security_protocol: SASL_SSL
    sasl_mechanism: PLAIN
    sasl_plain_username: calmon
    sasl_plain_password: ${KAFKA_PASSWORD}
    ssl_password: ${KAFKA_PASSWORD}
alerts:
  webhook: "https://alice:${KAFKA_PASSWORD}@alerts.example.com:9093/api/v2/alerts?token=${HOOK_TOKEN}"
""", encoding="utf-8")
    assert main(["check-config", "-c", str(path)]) == 0
    out, err = capsys.readouterr()
    assert PASSWORD not in out + err and TOKEN not in out + err
    eff = yaml.safe_load(out)
    client = eff["kafka"]["client"]
    assert client["sasl_plain_password"] == secrets.MASK
    assert client["ssl_password"] == secrets.MASK
    # what a reader needs to check the setup stays visible
    assert client["sasl_plain_username"] == "calmon"
    assert client["sasl_mechanism"] == "PLAIN"
    assert client["security_protocol"] == "SASL_SSL"
    assert eff["alerts"]["webhook"] == (
        "https://***@alerts.example.com:9093/api/v2/alerts?token=***")


@pytest.mark.parametrize(("url", "masked"), [
    (WEBHOOK, "https://***@alerts.example.com:9093/api/v2/alerts?token=***&x=***"),
    ("http://am:9093/api/v2/alerts", "http://am:9093/api/v2/alerts"),  # nothing to hide
    ("https://hooks.example.com/x?sig=abc#frag", "https://hooks.example.com/x?sig=***#frag"),
    ("kafka://user@b1:9092", "kafka://***@b1:9092"),
    ("https://u:p@host:notaport/x", "https://***"),
])
def test_mask_url(url: str, masked: str) -> None:
    assert secrets.mask_url(url) == masked


def test_mask_config_keys() -> None:
    cfg = {"client": {"sasl_oauth_token_provider": "obj", "ssl_password": "k",
                      "sasl_plain_password": None, "api_key": 12345, "acks": 1,
                      "sasl_kerberos_service_name": "kafka"},
           "list": [{"password": "x"}], "flag": True, "group_id": "token-svc:calmon",
           "servers": ["kafka://u:p@b1:9092", "b2:9092"]}
    got = secrets.mask_config(cfg)
    assert got == {"client": {"sasl_oauth_token_provider": "***", "ssl_password": "***",
                              "sasl_plain_password": None, "api_key": "***", "acks": 1,
                              "sasl_kerberos_service_name": "kafka"},
                   "list": [{"password": "***"}], "flag": True, "group_id": "token-svc:calmon",
                   "servers": ["kafka://***@b1:9092", "b2:9092"]}


def _formatted(*args: object, exc: BaseException | None = None) -> str:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(secrets.MaskingFormatter("%(levelname)s %(message)s"))
    logger = logging.getLogger(f"calmon.test-secrets-{id(stream)}")
    logger.propagate = False
    logger.addHandler(handler)
    try:
        if exc is not None:
            try:
                raise exc
            except BaseException:
                logger.exception(*args)  # type: ignore[arg-type]
        else:
            logger.warning(*args)  # type: ignore[arg-type]
    finally:
        logger.removeHandler(handler)
    return stream.getvalue()


def test_log_lines_mask_urls_key_values_and_registered_secrets() -> None:
    out = _formatted("alert %s not delivered to %s: %s", "CalmonDrift", WEBHOOK, "timeout")
    assert PASSWORD not in out and TOKEN not in out
    assert "alerts.example.com:9093" in out and "CalmonDrift" in out

    out = _formatted("bad client settings: %r", {"sasl_plain_password": "hunter22",
                                                "bootstrap_servers": "b:9092"})
    assert "hunter22" not in out and "b:9092" in out

    secret = "registered-only-0xBEEF"
    secrets.register(secret)
    out = _formatted("connection failed", exc=RuntimeError(f"auth failed with {secret}"))
    assert secret not in out and "auth failed with ***" in out
    assert "Traceback" in out  # the traceback is kept, masked


def test_log_message_cannot_forge_a_line() -> None:
    forged = "m\n2026-01-01 00:00:00,000 ERROR calmon.daemon: forged\r\x1b[31m"
    out = _formatted("invalid record for model %s", forged)
    assert out.count("\n") == 1 and out.endswith("\n")
    assert "\\n2026-01-01" in out and "\\x1b" in out and "\r" not in out


def test_c1_controls_are_escaped_too() -> None:
    """NEL (U+0085) ends a line for some log viewers and CSI (U+009B) starts a terminal
    sequence like ESC [: names from the trusted topics may hold them (issue 35)."""
    out = _formatted("refusing calibrator %s", "m\x85forged line \x9b31m red \x9f")
    assert all(c not in out for c in "\x85\x9b\x9f")
    assert "\\x85forged line \\x9b31m red \\x9f" in out
    assert secrets.escape_control("caf\u00e9 \u00a0") == "caf\u00e9 \u00a0"  # not controls


def test_every_log_line_of_the_cli_is_masked(tmp_path: Path) -> None:
    """``setup_logging`` (what ``calmon run`` calls) installs the masking formatter, and a
    password from ``${KAFKA_PASSWORD}`` is masked wherever a library prints it."""
    code = f"""
import logging
from calmon import secrets
from calmon.cli import setup_logging
setup_logging()
secrets.register_config({{"kafka": {{"client": {{"sasl_plain_password": {PASSWORD!r}}}}}}})
logging.getLogger("calmon.x").error("SASL authentication failed for {PASSWORD}")
logging.getLogger("calmon.y").warning("posting to %s", {WEBHOOK!r})
"""
    proc = subprocess.run([sys.executable, "-c", code], cwd=str(REPO), env=subprocess_env(),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert PASSWORD not in proc.stderr and TOKEN not in proc.stderr
    assert proc.stderr.count("***") >= 3, proc.stderr


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(st.text(min_size=4, max_size=30).filter(lambda v: v.strip() == v and "*" not in v),
       st.text(max_size=40), st.text(max_size=40),
       st.sampled_from(["{0}", "ssl_password: {0}", "https://u:{0}@h/x", "{0}\n{0}", "'{0}'"]))
def test_a_registered_secret_never_survives_masking(secret: str, before: str, after: str,
                                                    shape: str) -> None:
    with patch.object(secrets, "_registered", set()):
        secrets.register(secret)
        out = secrets.escape_control(secrets.mask_text(before + shape.format(secret) + after))
        if secret not in before + after:  # the surroundings could hold it by chance
            assert secret not in out
