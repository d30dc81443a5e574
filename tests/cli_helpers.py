"""Running the ``calmon`` command line in-process, as the config tests do."""

from __future__ import annotations

from pathlib import Path

import pytest

from calmon.cli import main


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
