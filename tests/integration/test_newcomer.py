"""The README's path for a newcomer, run as one: install, `calmon demo`, then the
sample records on topics of their own with a wrong and then a right mapping
(tests/newcomer.py holds the script and what each step must say).

Set CALMON_TRANSCRIPT=FILE to keep the transcript of a run.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tests import newcomer
from tests.conftest import free_port, tansu_binary
from tests.daemon_helpers import REPO, subprocess_env

pytestmark = pytest.mark.integration


def _keep(t: newcomer.Transcript) -> None:
    target = os.environ.get("CALMON_TRANSCRIPT")
    if target:
        shutil.copyfile(t.path, target)


def test_the_readme_path_on_this_checkout(tmp_path: Path) -> None:
    tansu_binary()  # skips without the demo's broker
    t = newcomer.run([sys.executable, "-m", "calmon"], sys.executable, tmp_path,
                     subprocess_env(), (free_port(), free_port(), free_port()),
                     tmp_path / "transcript.txt")
    _keep(t)


@pytest.mark.slow
def test_the_readme_path_in_a_fresh_virtualenv(tmp_path: Path) -> None:
    """`pip install ".[demo]"` into a new virtualenv, offline: calmon is built into a
    wheel from this checkout and installed (its package data included); its
    dependencies come from the running environment's site-packages through a .pth
    file, so no index is asked. Then the same path, through the venv's `calmon`."""
    tansu_binary()
    if importlib.util.find_spec("wheel") is None:
        pytest.skip("the wheel package is missing: setuptools cannot build calmon's wheel "
                    "offline")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    py = venv / "bin" / "python"
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()"
                           "['purelib'])"], capture_output=True, text=True, check=True)
    (Path(site.stdout.strip()) / "calmon-deps.pth").write_text(
        sysconfig.get_paths()["purelib"] + "\n", encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    install = subprocess.run([str(py), "-m", "pip", "install", "--no-index", "--no-deps",
                              "--no-build-isolation", f"{REPO}[demo]"], env=env,
                             capture_output=True, text=True, timeout=600)
    assert install.returncode == 0, install.stdout + install.stderr
    where = subprocess.run([str(py), "-c", "import calmon; print(calmon.__file__)"], env=env,
                           cwd=str(tmp_path), capture_output=True, text=True, check=True)
    assert Path(where.stdout.strip()).is_relative_to(venv), where.stdout  # the installed copy
    t = newcomer.Transcript(tmp_path / "transcript.txt")
    t.add(["python", "-m", "venv", "venv"], 0, "")
    t.add(["pip", "install", ".[demo]", "  (offline: --no-index --no-deps --no-build-isolation)"],
          install.returncode, install.stdout.splitlines()[-1] if install.stdout else "")
    run = newcomer.run([str(venv / "bin" / "calmon")], str(py), tmp_path, env,
                       (free_port(), free_port(), free_port()), tmp_path / "transcript2.txt")
    t.lines += run.lines
    t.path.write_text("\n".join(t.lines), encoding="utf-8")
    _keep(t)
