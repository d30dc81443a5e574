"""The walls of ARCHITECTURE.md, read from the source: imports only point down."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "calmon"

# layer -> the calmon modules it must never import
WALLS = {
    "engine": ("calmon.io", "calmon.recal", "calmon.daemon", "calmon.demo", "calmon.cli"),
    "calibrators": ("calmon.io", "calmon.recal", "calmon.daemon", "calmon.demo",
                    "calmon.cli"),
    "recal": ("calmon.io", "calmon.daemon", "calmon.demo", "calmon.cli"),
}


def imports(path: Path) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
    return out


@pytest.mark.parametrize("layer", sorted(WALLS))
def test_imports_point_down(layer: str) -> None:
    files = sorted((PACKAGE / layer).glob("*.py"))
    assert files
    bad = [(f.name, m) for f in files for m in sorted(imports(f))
           if m.startswith(WALLS[layer])]
    assert bad == [], bad


def test_only_the_daemon_and_the_demo_install_signal_handlers() -> None:
    users = sorted(str(f.relative_to(PACKAGE)) for f in PACKAGE.rglob("*.py")
                   if "signal.signal(" in f.read_text(encoding="utf-8"))
    # the consumer child ignores SIGINT/SIGTERM: its parent decides when it stops
    assert users == ["daemon.py", "io/consumer_process.py"], users
