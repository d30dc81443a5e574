"""The walls of ARCHITECTURE.md, read from the source.

The layer table is parsed from ARCHITECTURE.md itself (so the page and this test
cannot drift apart), the import graph from every file of calmon/ with ``ast``:
imports inside functions count, only those under ``if TYPE_CHECKING:`` are exempt,
and importing ``calmon.x.y`` from outside ``x`` also runs ``x/__init__.py``. Then:
every module sits in exactly one layer, imports only its own layer and the layers
its row allows, no two files import each other round a circle, and no two packages
import each other.
"""

from __future__ import annotations

import ast
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "calmon"
TABLE = ROOT / "ARCHITECTURE.md"
NOTHING = "nothing of calmon"


@dataclass(frozen=True)
class Layer:
    name: str
    units: tuple[str, ...]  # "names.py", "engine/": files or packages right under calmon/
    may_import: tuple[str, ...]  # names of layers listed before this one


def read_table(text: str) -> list[Layer]:
    """The ``| layer | modules | what it holds | may import |`` table of the page."""
    lines = text.splitlines()
    head = next(i for i, line in enumerate(lines)
                if re.fullmatch(r"\|\s*layer\s*\|\s*modules\s*\|.*\|\s*may import\s*\|", line))
    layers: list[Layer] = []
    for line in lines[head + 2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        assert len(cells) == 4, f"a row of four cells: {line!r}"
        name, modules, _, allowed = cells
        units = tuple(re.findall(r"`([^`]+)`", modules))
        may = () if allowed == NOTHING else tuple(a.strip() for a in allowed.split(","))
        known = [layer.name for layer in layers]
        unknown = [a for a in may if a not in known]
        assert not unknown, f"layer {name} may import {unknown}: not a layer above it"
        assert units, f"layer {name} names no modules"
        layers.append(Layer(name, units, may))
    assert layers, "no layer table"
    return layers


def modules(package: Path) -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its ``__init__``)."""
    out = {}
    for f in sorted(package.rglob("*.py")):
        parts = list(f.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = f
    return out


def _type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def _imported(tree: ast.AST, here: str, is_package: bool) -> list[str]:
    """Dotted names every import statement of ``tree`` asks for (``from a import b``
    gives ``a.b`` and ``a``), relative ones resolved, TYPE_CHECKING blocks skipped."""
    out: list[str] = []
    todo = list(ast.iter_child_nodes(tree))
    while todo:
        node = todo.pop()
        if isinstance(node, ast.If) and _type_checking(node):
            todo.extend(node.orelse)
            continue
        if isinstance(node, ast.Import):
            out.extend(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = here.split(".") if is_package else here.split(".")[:-1]
                pkg = pkg[:len(pkg) - (node.level - 1)]
                base = ".".join([*pkg, *([node.module] if node.module else [])])
            out.append(base)
            out.extend(f"{base}.{a.name}" for a in node.names)
        todo.extend(ast.iter_child_nodes(node))
    return out


def import_graph(package: Path) -> dict[str, set[str]]:
    """module -> the modules of the package it imports."""
    mods = modules(package)
    top = package.name
    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        edges: set[str] = set()
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for wanted in _imported(tree, name, path.name == "__init__.py"):
            if wanted != top and not wanted.startswith(top + "."):
                continue
            while wanted not in mods and "." in wanted:  # a name in a module: the module
                wanted = wanted.rsplit(".", 1)[0]
            if wanted not in mods:
                continue
            # importing a.b.c from outside a.b runs a.b's __init__ first
            parts = wanted.split(".")
            for i in range(2, len(parts)):
                parent = ".".join(parts[:i])
                if not name.startswith(parent + ".") and name != parent:
                    edges.add(parent)
            edges.add(wanted)
        edges.discard(name)
        edges.discard(top)  # calmon/__init__.py: runs before anything, imports nothing
        graph[name] = edges
    return graph


def unit_of(module: str) -> str:
    """The file or package right under calmon/ that holds ``module``."""
    parts = module.split(".")
    return "__init__" if len(parts) == 1 else parts[1]


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The circles of files (strongly connected components of two or more), Tarjan."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def problems(package: Path, layers: list[Layer]) -> list[str]:
    """Everything the table and the house rules forbid, one line each."""
    graph = import_graph(package)
    where: dict[str, str] = {}
    out: list[str] = []
    for layer in layers:
        for unit in layer.units:
            key = unit.removesuffix(".py").removesuffix("/")
            if key in where:
                out.append(f"{unit}: in layers {where[key]} and {layer.name}")
            where[key] = layer.name
    allowed = {layer.name: {layer.name, *layer.may_import} for layer in layers}
    for mod in sorted(graph):
        if unit_of(mod) not in where:
            out.append(f"{mod}: in no layer of the table")
    for mod, deps in sorted(graph.items()):
        src = where.get(unit_of(mod))
        for dep in sorted(deps):
            dst = where.get(unit_of(dep))
            if src and dst and dst not in allowed[src]:
                out.append(f"{mod} -> {dep}: {src} may not import {dst}")
    out.extend(f"circle: {', '.join(c)}" for c in cycles(graph))
    pairs = {(unit_of(a), unit_of(b)) for a, deps in graph.items() for b in deps
             if unit_of(a) != unit_of(b)}
    out.extend(f"packages {a} and {b} import each other" for a, b in sorted(pairs)
               if (b, a) in pairs and a < b)
    return out


# ---------------------------------------------------------------- calmon itself


def test_calmon_keeps_the_walls_of_architecture_md() -> None:
    layers = read_table(TABLE.read_text(encoding="utf-8"))
    assert [layer.name for layer in layers] == [
        "base", "config", "engine", "calibrators", "recal", "io", "cluster", "wiring"]
    assert problems(PACKAGE, layers) == []


def test_every_unit_the_table_names_exists() -> None:
    for layer in read_table(TABLE.read_text(encoding="utf-8")):
        for unit in layer.units:
            assert (PACKAGE / unit).exists(), f"{layer.name}: {unit} is not in calmon/"


def unnamed(package: Path, text: str) -> list[str]:
    """Modules inside a package of the table (``engine/windows.py``) whose name its
    row's "what it holds" cell does not give in backticks (``windows``, or within a
    longer name: ``windows.in_window``); ``__init__`` and ``__main__`` go unnamed."""
    holds: dict[str, set[str]] = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cells) == 4:
            named = {w for t in re.findall(r"`([^`]+)`", cells[2])
                     for w in re.findall(r"[A-Za-z_]\w*", t)}
            for unit in re.findall(r"`([^`]+)/`", cells[1]):
                holds[unit] = named
    return sorted(str(f.relative_to(package)) for f in package.glob("*/*.py")
                  if f.stem not in ("__init__", "__main__")
                  and f.stem not in holds.get(f.parent.name, set()))


def test_every_module_of_a_package_is_named_in_its_row() -> None:
    assert unnamed(PACKAGE, TABLE.read_text(encoding="utf-8")) == []


# ---------------------------------------------------------------- the checker fails


def test_a_module_its_row_does_not_name_is_found(tmp_path: Path) -> None:
    text = TABLE.read_text(encoding="utf-8")
    pkg = _copy(tmp_path)
    assert unnamed(pkg, text) == []
    (pkg / "engine" / "newcomer.py").write_text("", encoding="utf-8")
    (pkg / "io" / "exporter.py").rename(pkg / "io" / "exporting.py")
    assert unnamed(pkg, text) == ["engine/newcomer.py", "io/exporting.py"]


def _copy(tmp_path: Path) -> Path:
    dst = tmp_path / "calmon"
    shutil.copytree(PACKAGE, dst, ignore=shutil.ignore_patterns("__pycache__"))
    return dst


def _append(path: Path, text: str) -> None:
    path.write_text(path.read_text(encoding="utf-8") + "\n" + text, encoding="utf-8")


def test_an_upward_import_inside_a_function_is_refused(tmp_path: Path) -> None:
    pkg = _copy(tmp_path)
    layers = read_table(TABLE.read_text(encoding="utf-8"))
    assert problems(pkg, layers) == []
    _append(pkg / "engine" / "buffer.py",
            "def _peek():\n    from calmon.io.exporter import FAMILIES\n    return FAMILIES\n")
    found = problems(pkg, layers)
    assert "calmon.engine.buffer -> calmon.io.exporter: engine may not import io" in found


def test_an_import_under_type_checking_is_exempt(tmp_path: Path) -> None:
    pkg = _copy(tmp_path)
    _append(pkg / "engine" / "buffer.py",
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
            "    from calmon.daemon import Daemon\n")
    assert problems(pkg, read_table(TABLE.read_text(encoding="utf-8"))) == []


def test_a_circle_two_packages_and_an_unplaced_module_are_refused(tmp_path: Path) -> None:
    pkg = tmp_path / "calmon"
    for name, text in {
        "__init__.py": "",
        "names.py": "",
        "loose.py": "",
        "a/__init__.py": "",
        "a/one.py": "from calmon.a import two\n",
        "a/two.py": "import calmon.a.one\nfrom . import three\n",
        "a/three.py": "def f():\n    from calmon.b.x import y\n",
        "b/__init__.py": "",
        "b/x.py": "from calmon.a.three import f\ny = 1\n",
    }.items():
        (pkg / name).parent.mkdir(parents=True, exist_ok=True)
        (pkg / name).write_text(text, encoding="utf-8")
    table = ("| layer | modules | what it holds | may import |\n|---|---|---|---|\n"
             f"| base | `__init__.py`, `names.py` | names | {NOTHING} |\n"
             "| a | `a/` | a | base |\n| b | `b/` | b | base, a |\n")
    found = problems(pkg, read_table(table))
    assert "calmon.loose: in no layer of the table" in found
    assert "circle: calmon.a.one, calmon.a.two" in found
    assert "circle: calmon.a.three, calmon.b.x" in found
    assert "calmon.a.three -> calmon.b.x: a may not import b" in found
    assert "packages a and b import each other" in found


def test_a_table_that_lets_a_layer_import_one_below_it_is_refused() -> None:
    table = ("| layer | modules | what it holds | may import |\n|---|---|---|---|\n"
             f"| base | `names.py` | names | {NOTHING} |\n| top | `cli.py` | cli | base, later |\n"
             "| later | `daemon.py` | daemon | base |\n")
    with pytest.raises(AssertionError, match="not a layer above it"):
        read_table(table)


def test_only_the_daemon_and_the_demo_install_signal_handlers() -> None:
    users = sorted(str(f.relative_to(PACKAGE)) for f in PACKAGE.rglob("*.py")
                   if "signal.signal(" in f.read_text(encoding="utf-8"))
    # the consumer child ignores SIGINT/SIGTERM: its parent decides when it stops
    assert users == ["daemon.py", "io/consumer_process.py"], users
