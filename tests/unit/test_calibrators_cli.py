"""Issue 22 at the command line: ``calibrators list`` reports a broken or forged file and
goes on, ``calibrators keygen`` prints a working key pair, the signing key is masked by
check-config and never logged, and bad keys are config errors (exit 2)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
import yaml

from calmon import secrets
from calmon.calibrators import load
from calmon.calibrators.signing import Signer, keygen
from calmon.cli import main
from calmon.recal.registry import Registry


def doc(model: str, t: float = 2.0) -> dict[str, Any]:
    return {"model": model, "segment": "__all__", "method": "temperature",
            "params": {"temperature": t}, "input": "logit", "trigger": "ece_above"}


def config(tmp_path: Path, **calibrators: Any) -> Path:
    path = tmp_path / "calmon.yaml"
    data: dict[str, Any] = {"recalibration": {"output_dir": str(tmp_path / "out")}}
    if calibrators:
        data["calibrators"] = calibrators
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def test_list_reports_a_broken_file_and_goes_on(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    private, public = keygen()
    keys = [{"id": "k1", "public_key": public}]
    cfg = config(tmp_path, signing_key=private, key_id="k1", verify_keys=keys)
    reg = Registry(tmp_path / "out", signer=Signer(private, "k1"), verify_keys=keys)
    reg.publish(doc("a"))
    reg.publish(doc("z"))
    broken = tmp_path / "out" / "b" / "__all__"
    broken.mkdir(parents=True)
    signed = Signer(private, "k1").sign({**doc("b", 10**400), "version": 1})  # signed, broken
    (broken / "latest.json").write_text(json.dumps(signed), encoding="utf-8")
    forged = tmp_path / "out" / "f" / "__all__"
    forged.mkdir(parents=True)
    (forged / "latest.json").write_text(json.dumps({**doc("f"), "version": 1}),
                                        encoding="utf-8")  # well formed, unsigned

    assert main(["calibrators", "list", "-c", str(cfg)]) == 0
    out = capsys.readouterr().out
    lines = {line.split()[0]: line for line in out.splitlines() if line and line[0] != " "}
    assert lines["a"].split()[2] == "1" and lines["z"].split()[2] == "1"
    assert "out of range" in out and "unsigned" in out  # both reasons shown

    assert main(["calibrators", "list", "--json", "-c", str(cfg)]) == 0
    rows = {e["model"]: e for e in json.loads(capsys.readouterr().out)}
    assert rows["a"]["live"] == 1 and rows["a"]["error"] is None
    assert rows["b"]["live"] is None and "out of range" in rows["b"]["error"]
    assert rows["f"]["live"] is None and "unsigned" in rows["f"]["error"]
    assert rows["z"]["live"] == 1


def test_keygen_prints_a_pair_that_signs_and_verifies(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["calibrators", "keygen"]) == 0
    out = capsys.readouterr().out
    private = next(line.split("=", 1)[1] for line in out.splitlines()
                   if line.startswith("CALMON_SIGNING_KEY="))
    public = next(line.split(": ", 1)[1] for line in out.splitlines()
                  if line.startswith("public_key: "))
    signed = Signer(private, "k").sign({**doc("m"), "version": 1})
    assert load(signed, [{"id": "k", "public_key": public}]).meta["model"] == "m"


def test_the_signing_key_is_masked_in_check_config_and_logs(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    private, public = keygen()
    monkeypatch.setenv("CALMON_TEST_SIGNING_KEY", private)
    cfg = config(tmp_path, signing_key="${CALMON_TEST_SIGNING_KEY}", key_id="k1",
                 verify_keys=[{"id": "k1", "public_key": public}])
    assert main(["check-config", "-c", str(cfg)]) == 0
    out = capsys.readouterr().out
    assert private not in out
    shown = yaml.safe_load(out)["calibrators"]
    assert shown["signing_key"] == "***" and shown["verify_keys"][0]["public_key"] == public

    secrets.register_config({"calibrators": {"signing_key": private}})
    record = logging.LogRecord("x", logging.ERROR, __file__, 1, "key was %s", (private,), None)
    assert private not in secrets.MaskingFormatter("%(message)s").format(record)


@pytest.mark.parametrize("calibrators, problem", [
    ({"signing_key": "not a key", "key_id": "k1"}, "calibrators.signing_key:"),
    ({"signing_key": "PRIVATE", "key_id": None}, "calibrators.key_id:"),
    ({"verify_keys": [{"id": "k1", "public_key": "AAAA"}]}, "calibrators.verify_keys[0]"),
    ({"verify_keys": [{"id": "k1", "public_key": "PUBLIC"}]}, "calibrators.signing_key:"),
    ({"signing_key": "PRIVATE", "key_id": "k2", "verify_keys": [
        {"id": "k1", "public_key": "PUBLIC"}]}, "calibrators.key_id:"),
    ({"signing_key": "PRIVATE", "key_id": "k1", "verify_keys": [
        {"id": "k1", "public_key": "OTHER"}]}, "calibrators.verify_keys:"),
])
def test_bad_keys_are_config_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                    calibrators: dict[str, Any], problem: str) -> None:
    private, public = keygen()
    other = keygen()[1]
    text = json.dumps(calibrators).replace("PRIVATE", private).replace(
        "PUBLIC", public).replace("OTHER", other)
    cfg = config(tmp_path, **json.loads(text))
    data = yaml.safe_load(cfg.read_text())
    data["recalibration"]["enabled"] = True
    cfg.write_text(yaml.safe_dump(data), encoding="utf-8")
    assert main(["check-config", "-c", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert problem in err, err
    assert private not in err
