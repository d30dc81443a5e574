"""Readers of the engine, the recalibration and the cluster use public interfaces
(issue 32): in ``calmon/engine/snapshot.py`` and ``summed.py``, ``calmon/cluster/`` and
``calmon/recal/`` no expression reads ``name._member`` of another object unless
``_member`` is defined in that same file: ``self._x`` too (a member a base class in
another file defines is that file's), ``obj.__x`` too (name mangling hides nothing
from a reader); only dunders (``__name__``) are public. Imports and comments are not
attribute reads, and ``ast`` sees neither as one."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "calmon"
CHECKED = ("engine/snapshot.py", "engine/summed.py", "cluster/", "recal/")


def _defined(tree: ast.AST) -> set[str]:
    """The names a file defines: functions, classes, assigned names and attributes,
    arguments."""
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            out.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            out.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            out.add(node.attr)
        elif isinstance(node, ast.arg):
            out.add(node.arg)
    return out


def private_reads(text: str) -> list[str]:
    """``line: expression`` of every read of another object's private member that the
    file does not define itself."""
    tree = ast.parse(text)
    own = _defined(tree)
    out = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Attribute) and node.attr.startswith("_")):
            continue
        if node.attr.startswith("__") and node.attr.endswith("__"):  # a dunder
            continue
        if node.attr not in own:
            out.append(f"{node.lineno}: {ast.unparse(node)}")
    return out


def checked_files() -> list[Path]:
    out = []
    for unit in CHECKED:
        path = PACKAGE / unit
        out += sorted(path.rglob("*.py")) if unit.endswith("/") else [path]
    return out


def test_readers_read_no_private_member_of_another_file() -> None:
    files = checked_files()
    assert len(files) > 10 and all(f.exists() for f in files)
    found = {str(f.relative_to(PACKAGE)): private_reads(f.read_text(encoding="utf-8"))
             for f in files}
    assert {k: v for k, v in found.items() if v} == {}


def test_the_check_sees_what_it_says() -> None:
    bad = ("import calmon.engine._x\n"
           "from calmon.engine.engine import _take  # an import: not a read\n"
           "def f(engine, self):\n"
           "    # engine._comment is not code\n"
           "    a = engine._changed_at\n"
           "    b = self.engine._lock\n"
           "    c = self._mine + engine.__class__.__name__\n"
           "    d = cls._inherited + engine.__hidden\n"
           "    return engine.windows._rows(a, b, c, d)\n")
    assert private_reads(bad) == ["5: engine._changed_at", "6: self.engine._lock",
                                  "7: self._mine", "8: cls._inherited",
                                  "8: engine.__hidden", "9: engine.windows._rows"]
    own = ("class A:\n"
           "    def __init__(self):\n"
           "        self._n = 0\n"
           "    def _grow(self): ...\n"
           "def f(a: A, other: A) -> int:\n"
           "    other._grow()\n"
           "    return a._n\n")
    assert private_reads(own) == []
