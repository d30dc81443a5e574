"""tls_server_config of the web config as exporter-toolkit (and Go's crypto/tls) mean
it: client certificates enforced per path (the probes need none), the client auth
types with their Go meanings, client_allowed_sans, certificates re-read when they
change, and paths relative to the web config's directory (calmon.io.tls_server)."""

from __future__ import annotations

import ipaddress
import logging
import os
import socket
import ssl
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding

from calmon import cli
from calmon.errors import ConfigError
from calmon.io import webconfig
from calmon.io.http import HttpServer
from tests.daemon_helpers import wait_until
from tests.tls_helpers import TestCA, https_get, serving

PROBES = ("/healthz", "/readyz")


@pytest.fixture
def pki(tmp_path: Path) -> dict[str, Any]:
    """A CA with a server certificate and three clients, and a foreign CA's client."""
    ca, other = TestCA(), TestCA("someone else's CA")
    d = tmp_path / "tls"
    out: dict[str, Any] = {"dir": d, "ca": ca, "ca_file": ca.write(d / "ca.crt")}
    ca.issue_server(d / "server.crt", d / "server.key")
    out["prometheus"] = ca.issue(d / "prom.crt", d / "prom.key", "prometheus",
                                 [x509.DNSName("prometheus.monitoring.svc")])
    out["spiffe"] = ca.issue(d / "spiffe.crt", d / "spiffe.key", "spiffe", [
        x509.UniformResourceIdentifier("spiffe://cluster/ns/monitoring/sa/prometheus")])
    out["intruder"] = ca.issue(d / "intruder.crt", d / "intruder.key", "intruder",
                               [x509.DNSName("intruder.default.svc")])
    out["no_sans"] = ca.issue(d / "plain.crt", d / "plain.key", "plain")
    out["foreign"] = other.issue(d / "foreign.crt", d / "foreign.key", "foreign",
                                 [x509.DNSName("prometheus.monitoring.svc")])
    return out


def write_web(directory: Path, **tls: Any) -> Path:
    path = directory / "web.yml"
    path.write_text(yaml.safe_dump({"tls_server_config": {
        "cert_file": "server.crt", "key_file": "server.key", **tls}}))
    return path


def status(server: HttpServer, pki: dict[str, Any], path: str,
           client: str | None = None) -> int:
    return https_get(server.port, path, pki["ca_file"],
                     None if client is None else pki[client])[0]


# ---------------------------------------------------------------- 9: probes under mTLS


def test_probes_answer_a_client_without_a_certificate_under_mutual_tls(
        pki: dict[str, Any]) -> None:
    web = write_web(pki["dir"], client_auth_type="RequireAndVerifyClientCert",
                    client_ca_file="ca.crt")
    with serving(web) as server:
        for path in PROBES:  # a kubelet probe presents no certificate
            assert status(server, pki, path) == 200, path
        code, body = https_get(server.port, "/metrics", pki["ca_file"])
        assert code == 403 and b"calmon_test_total" not in body
        assert b"client certificate is required" in body
        assert status(server, pki, "/status") == 403
        code, body = https_get(server.port, "/metrics", pki["ca_file"], pki["prometheus"])
        assert code == 200 and b"calmon_test_total 1.0" in body
        # a certificate the CA did not sign fails the handshake, probes included (as Go)
        assert status(server, pki, "/metrics", "foreign") == 0
        assert status(server, pki, "/healthz", "foreign") == 0


# ---------------------------------------------------------------- 10: Go's meanings


def test_require_any_client_cert_is_refused_at_start_naming_the_key(
        pki: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    key = "server.web_config_file: tls_server_config.client_auth_type: RequireAnyClientCert"
    for extra in ({}, {"client_ca_file": "ca.crt"}):
        web = write_web(pki["dir"], client_auth_type="RequireAnyClientCert", **extra)
        with pytest.raises(ConfigError) as e:
            webconfig.load(web)
        assert any(p.startswith(key) and "cannot be enforced" in p for p in e.value.problems)
    cfg = tmp_path / "calmon.yml"
    cfg.write_text(f"server: {{web_config_file: '{web}'}}\n")
    assert cli.main(["check-config", "-c", str(cfg)]) == 2
    assert key in capsys.readouterr().err


def test_verify_client_cert_if_given_and_request_client_cert_mean_what_go_means(
        pki: dict[str, Any]) -> None:
    web = write_web(pki["dir"], client_auth_type="VerifyClientCertIfGiven",
                    client_ca_file="ca.crt")
    with serving(web) as server:
        assert status(server, pki, "/metrics") == 200  # none given: fine
        assert status(server, pki, "/metrics", "prometheus") == 200  # given and verified
        assert status(server, pki, "/metrics", "foreign") == 0  # given, does not verify
    # RequestClientCert: asked for, never required nor verified (any certificate passes)
    web = write_web(pki["dir"], client_auth_type="RequestClientCert")
    with serving(web) as server:
        assert status(server, pki, "/metrics") == 200
        assert status(server, pki, "/metrics", "foreign") == 200


def test_client_ca_file_without_a_policy_and_verifying_without_one_are_config_errors(
        pki: dict[str, Any]) -> None:
    for tls, problem in (
            ({"client_ca_file": "ca.crt"}, "client_ca_file: set without a client_auth_type"),
            ({"client_auth_type": "VerifyClientCertIfGiven"},
             "client_ca_file: required with VerifyClientCertIfGiven"),
            ({"client_auth_type": "NoClientCert", "client_allowed_sans": ["x"]},
             "client_allowed_sans: needs client_auth_type"),
            ({"client_auth_type": "RequireAndVerifyClientCert", "client_ca_file": "ca.crt",
              "client_allowed_sans": []}, "client_allowed_sans: a list of names"),
            ({"client_auth_type": "Sometimes"}, "client_auth_type: one of NoClientCert")):
        with pytest.raises(ConfigError) as e:
            webconfig.load(write_web(pki["dir"], **tls))
        assert any(problem in p for p in e.value.problems), (tls, e.value.problems)


# ---------------------------------------------------------------- 11: allowed SANs


def test_client_allowed_sans_admits_only_the_listed_sans(pki: dict[str, Any]) -> None:
    web = write_web(pki["dir"], client_auth_type="RequireAndVerifyClientCert",
                    client_ca_file="ca.crt", client_allowed_sans=[
                        "prometheus.monitoring.svc",
                        "spiffe://cluster/ns/monitoring/sa/prometheus"])
    with serving(web) as server:
        assert status(server, pki, "/metrics", "prometheus") == 200  # a listed DNS name
        assert status(server, pki, "/metrics", "spiffe") == 200  # a listed URI
        code, body = https_get(server.port, "/metrics", pki["ca_file"], pki["intruder"])
        assert code == 403 and b"calmon_test_total" not in body
        assert status(server, pki, "/metrics", "no_sans") == 403
        assert status(server, pki, "/metrics") == 403
        assert status(server, pki, "/metrics", "foreign") == 0  # a listed name, wrong CA
        for path in PROBES:
            assert status(server, pki, path) == 200
    # VerifyClientCertIfGiven with SANs: no certificate is no allowed SAN (as Go refuses)
    web = write_web(pki["dir"], client_auth_type="VerifyClientCertIfGiven",
                    client_ca_file="ca.crt", client_allowed_sans=["prometheus.monitoring.svc"])
    with serving(web) as server:
        assert status(server, pki, "/metrics") == 403
        assert status(server, pki, "/metrics", "prometheus") == 200
        assert status(server, pki, "/metrics", "intruder") == 403


def test_sans_are_compared_as_go_prints_them(tmp_path: Path) -> None:
    from calmon.io.tls_server import sans_of

    ca = TestCA()
    crt, _ = ca.issue(tmp_path / "c.crt", tmp_path / "c.key", "c", [
        x509.DNSName("a.example"), x509.RFC822Name("ops@example.com"),
        x509.IPAddress(ipaddress.ip_address("::ffff:10.0.0.1")),
        x509.IPAddress(ipaddress.ip_address("2001:db8:0:0:0:0:0:1")),
        x509.UniformResourceIdentifier("spiffe://td/sa")])
    assert sans_of(der_of(crt)) == {"a.example", "ops@example.com", "10.0.0.1", "2001:db8::1",
                            "spiffe://td/sa"}


# ---------------------------------------------------------------- 12: rotation


def served_certificate(port: int) -> bytes:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE  # which certificate is served, not whether it verifies
    with socket.create_connection(("127.0.0.1", port), timeout=30) as raw, \
            ctx.wrap_socket(raw) as tls:
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return der


def der_of(path: Path) -> bytes:
    return x509.load_pem_x509_certificate(path.read_bytes()).public_bytes(Encoding.DER)


def test_a_replaced_certificate_is_served_to_new_connections_within_5_s(
        pki: dict[str, Any], caplog: pytest.LogCaptureFixture) -> None:
    d: Path = pki["dir"]
    web = write_web(d)
    with serving(web) as server:
        first = served_certificate(server.port)
        assert first == der_of(d / "server.crt")
        # half-way through a rotation (the new certificate, the old key): no outage
        new_crt, new_key = pki["ca"].issue_server(d / "next.crt", d / "next.key")
        with caplog.at_level(logging.WARNING, logger="calmon.io.tls_server"):
            os.replace(new_crt, d / "server.crt")
            # the files are looked at when a connection arrives
            wait_until(lambda: served_certificate(server.port) == first and (
                "still serving the previous certificate" in caplog.text), 30,
                "the half-done rotation noticed")
        assert served_certificate(server.port) == first
        # the key follows: new connections get the new certificate
        os.replace(new_key, d / "server.key")
        replaced = time.monotonic()
        wait_until(lambda: served_certificate(server.port) == der_of(d / "server.crt"), 5,
                   "the new certificate served")
        assert time.monotonic() - replaced < 5
        # rewritten in place (same inode) is noticed too
        again_crt, again_key = pki["ca"].issue_server(d / "n2.crt", d / "n2.key")
        (d / "server.key").write_bytes(again_key.read_bytes())
        (d / "server.crt").write_bytes(again_crt.read_bytes())
        wait_until(lambda: served_certificate(server.port) == der_of(again_crt), 5,
                   "the rewritten certificate served")


# ---------------------------------------------------------------- paths and messages


def test_paths_are_relative_to_the_web_config_and_errors_name_the_file(
        pki: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d: Path = pki["dir"]
    web = write_web(d)
    monkeypatch.chdir(tmp_path)  # the web config's own path: from the working directory
    assert webconfig.load("tls/web.yml") is not None
    with pytest.raises(ConfigError) as e:
        webconfig.load("elsewhere/web.yml")
    assert str(tmp_path / "elsewhere" / "web.yml") in e.value.problems[0]
    assert "working directory" in e.value.problems[0]
    cases = {
        "cert_file": ({"cert_file": "absent.crt"}, f"cert_file: cannot read {d / 'absent.crt'}"),
        "key_file": ({"key_file": "absent.key"}, f"key_file: cannot read {d / 'absent.key'}"),
        "not a key": ({"key_file": "server.crt"},
                      f"key_file: {d / 'server.crt'} holds no unencrypted PEM private key"),
        "not a cert": ({"cert_file": "server.key"},
                       f"cert_file: {d / 'server.key'} holds no PEM certificate"),
        "mismatch": ({"key_file": "prom.key"}, f"key_file {d / 'prom.key'} does not go with "
                     f"cert_file {d / 'server.crt'}"),
    }
    for name, (tls, problem) in cases.items():
        path = web.parent / "bad.yml"
        path.write_text(yaml.safe_dump({"tls_server_config": {
            "cert_file": "server.crt", "key_file": "server.key", **tls}}))
        with pytest.raises(ConfigError) as e:
            webconfig.load(path)
        assert any(p.startswith("server.web_config_file: tls_server_config")
                   and problem in p for p in e.value.problems), (name, e.value.problems)
