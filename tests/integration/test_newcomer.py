"""The README's path for a newcomer, run as one: install, `calmon demo`, then the
sample records on topics of their own with a wrong and then a right mapping
(tests/newcomer.py holds the script and what each step must say).

Set CALMON_TRANSCRIPT=FILE to keep the transcript of a run.
"""

from __future__ import annotations

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


@pytest.mark.slow
def test_the_readme_path_on_this_checkout(tmp_path: Path) -> None:
    tansu_binary()  # skips without the demo's broker
    t = newcomer.run([sys.executable, "-m", "calmon"], sys.executable, tmp_path,
                     subprocess_env(), (free_port(), free_port(), free_port()),
                     tmp_path / "transcript.txt")
    _keep(t)


def _checkout(into: Path) -> Path:
    """The files a fresh clone of this checkout holds (tracked, and new ones not
    ignored), copied so that the build leaves nothing in the working tree."""
    names = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others",
                            "--exclude-standard"], capture_output=True, check=True).stdout
    for name in filter(None, names.decode().split("\0")):
        src = REPO / name
        if src.is_file():  # a file deleted but not yet staged is listed too
            (into / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, into / name)
    return into


@pytest.mark.slow
def test_the_readme_path_in_a_fresh_virtualenv(tmp_path: Path) -> None:
    """The README's install command, `python -m pip install ".[demo]"`, in a new
    virtualenv and a copy of this checkout, then the same path through the venv's
    `calmon`. calmon is built as pip builds it, in an isolated build environment with
    the build requirement (setuptools) from the package index; its dependencies, the
    same versions the suite runs on, are seen through a .pth file into the running
    environment's site-packages, so pip finds them installed and fetches none."""
    tansu_binary()  # skips without the demo's broker
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    py = venv / "bin" / "python"
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()"
                           "['purelib'])"], capture_output=True, text=True, check=True)
    (Path(site.stdout.strip()) / "calmon-deps.pth").write_text(
        sysconfig.get_paths()["purelib"] + "\n", encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    clone = _checkout(tmp_path / "checkout")
    install = subprocess.run([str(py), *newcomer.INSTALL[1:]], cwd=str(clone),
                             env=env, capture_output=True, text=True, timeout=600)
    said = install.stdout + install.stderr
    if install.returncode != 0 and "setuptools" in said and (
            "No matching distribution" in said or "Could not find a version" in said):
        pytest.skip("no package index: pip cannot fetch setuptools to build calmon")
    assert install.returncode == 0, said
    assert "Successfully installed calmon-" in install.stdout, said
    where = subprocess.run([str(py), "-c", "import calmon; print(calmon.__file__)"], env=env,
                           cwd=str(tmp_path), capture_output=True, text=True, check=True)
    assert Path(where.stdout.strip()).is_relative_to(venv), where.stdout  # the installed copy
    t = newcomer.Transcript(tmp_path / "transcript.txt")
    t.add(["python", "-m", "venv", "venv"], 0, "")
    t.add(newcomer.INSTALL, install.returncode,
          "\n".join(line for line in install.stdout.splitlines()
                    if line.startswith(("Processing", "Building", "Successfully"))))
    run = newcomer.run([str(venv / "bin" / "calmon")], str(py), tmp_path, env,
                       (free_port(), free_port(), free_port()), tmp_path / "transcript2.txt")
    t.lines += run.lines
    t.path.write_text("\n".join(t.lines), encoding="utf-8")
    _keep(t)
