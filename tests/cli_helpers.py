"""Running the ``calmon`` command line in-process, as the config tests do."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from calmon.cli import main

# a config error as the contract spells it: ``path.to.key: what is wrong``
ERROR_LINE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*|\[\d+\])*: \S.*$")


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of ``calmon argv...``."""
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def check_config(capsys: pytest.CaptureFixture[str], tmp_path: Path, text: str,
                 *args: str) -> tuple[int, str, str]:
    """``calmon check-config`` of ``text`` written to ``tmp_path/config.yaml``."""
    path = tmp_path / "config.yaml"
    path.write_text(text, encoding="utf-8")
    return run_cli(capsys, "check-config", "-c", str(path), *args)


def config_error(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                 text: str) -> tuple[str, str]:
    """The one error ``check-config`` gives ``text`` (exit 2, nothing on stdout), as
    (key, what is wrong)."""
    rc, out, err = check_config(capsys, tmp_path, text)
    assert rc == 2 and out == "", (rc, out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    key, why = lines[0].split(": ", 1)
    return key, why
