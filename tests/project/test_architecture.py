"""The shape of the code: layers, import cycles, private names.

Read from the source with ``ast`` (nothing is imported), so a violation is
reported with the file and line that makes it.

* Dependencies point one way (DESIGN.md section 2): a module never imports
  from a layer above its own, lazily inside a function included.
* No import cycle among modules at import time.
* No private name crosses a package boundary: ``from ..storage._zarr import
  x`` and ``from ..state import _helper`` are refused outside the package
  that owns them.  A package's facade (``lineage.py`` for ``_lineage/``,
  ``mpi.py`` for ``_mpi/``) may import its implementation.
* ``storage/`` and ``state`` name neither JAX nor torch.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "vlcc_adjoint"

#: Layer of each top-level part of the package; a module may import only
#: from its own layer or below.
LAYERS = {
    "schedules": 0,
    "errors": 0,
    "_files": 1,
    "state": 1,
    "_providers": 1,
    "_layout": 1,
    "_dtype_json": 1,
    "storage": 2,
    "solver": 3,
    "execute": 3,
    "_checks": 3,
    "_result": 3,
    "budget": 3,
    "plot": 3,
    "jax": 4,
    "torch": 4,
    "mpi": 4,
    "_mpi": 4,
    "lineage": 4,
    "_lineage": 4,
    "devito": 4,
    "_examples": 4,
    "cli": 5,
    "__main__": 5,
    "__init__": 5,
}

#: Private packages and the modules that front them (the ``vlcc`` command
#: adds the lineage subcommands and runs the examples).
FACADES = {"_lineage": {"lineage", "cli"}, "_mpi": {"mpi"}, "_examples": {"cli"}}


def _modules():
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1] or ["__init__"]
        yield path, parts


def _resolve(parts: list[str], is_pkg: bool, node: ast.ImportFrom) -> list[str] | None:
    """The module path (inside vlcc_adjoint) an ImportFrom names, or None if outside."""
    if node.level == 0:
        mod = (node.module or "").split(".")
        if mod[0] != "vlcc_adjoint":
            return None
        return mod[1:]
    base = parts if is_pkg else parts[:-1]
    if parts == ["__init__"]:
        base = []
    up = node.level - 1
    base = base[: len(base) - up] if up else base
    return base + (node.module.split(".") if node.module else [])


def _imports():
    """(path, line, importer parts, imported module parts, imported name or None, top_level)."""
    for path, parts in _modules():
        is_pkg = path.name == "__init__.py"
        tree = ast.parse(path.read_text(), str(path))
        top = set(map(id, tree.body))
        for node in ast.walk(tree):
            top_level = id(node) in top
            if isinstance(node, ast.ImportFrom):
                target = _resolve(parts, is_pkg, node)
                if target is None:
                    continue
                for alias in node.names:
                    yield path, node.lineno, parts, target, alias.name, top_level
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    mod = alias.name.split(".")
                    if mod[0] == "vlcc_adjoint":
                        yield path, node.lineno, parts, mod[1:], None, top_level


def _where(path, line) -> str:
    return f"{path.relative_to(ROOT)}:{line}"


def test_dependencies_point_one_way():
    bad = []
    for path, line, src, dst, name, _ in _imports():
        if not dst:
            continue
        a, b = LAYERS.get(src[0] if src else "__init__"), LAYERS.get(dst[0])
        if a is not None and b is not None and b > a:
            bad.append(f"{_where(path, line)}: {'.'.join(src)} imports {'.'.join(dst)}")
    assert not bad, "imports from a layer above:\n" + "\n".join(bad)


def test_no_import_cycle_at_import_time():
    graph: dict[str, set[str]] = {}
    names = {".".join(p) for _, p in _modules()}
    for path, line, src, dst, name, top_level in _imports():
        if not top_level:
            continue
        target = ".".join(dst)
        if name and f"{target}.{name}" in names:
            target = f"{target}.{name}"  # from .pkg import module
        if target in names and target != ".".join(src):
            graph.setdefault(".".join(src), set()).add(target)
    # a package imports its own submodules from __init__; a cycle is a path back
    state: dict[str, int] = {}
    cycles = []

    def visit(node, stack):
        state[node] = 1
        for nxt in graph.get(node, ()):
            if nxt.startswith(node + "."):
                continue  # a package's __init__ importing its submodules
            if state.get(nxt) == 1 and not node.startswith(nxt + "."):
                cycles.append(" -> ".join(stack[stack.index(nxt) :] + [nxt]))
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def _package(parts: list[str], is_module: bool) -> str:
    """The package a module belongs to: its subpackage of vlcc_adjoint, or
    ``""`` for the modules directly in vlcc_adjoint/."""
    return "" if not parts or (is_module and len(parts) == 1) else parts[0]


def _is_package(parts: list[str]) -> bool:
    return (PKG.joinpath(*parts) / "__init__.py").exists() if parts else True


def test_no_private_name_crosses_a_package():
    bad = []
    for path, line, src, dst, name, _ in _imports():
        home = _package(src, path.name != "__init__.py")
        target = dst
        if name and _is_package(dst) and (PKG.joinpath(*dst) / f"{name}.py").exists():
            target, name = dst + [name], None  # from package import module
        owner = _package(target, not _is_package(target))
        if owner == home or (src and src[0] in FACADES.get(owner, ())):
            continue
        private_module = bool(target) and target[-1].startswith("_") and not _is_package(target)
        private_name = name is not None and name.startswith("_") and name != "__version__"
        if private_module or private_name:
            what = ".".join(target) + (f".{name}" if name else "")
            bad.append(f"{_where(path, line)}: {'.'.join(src)} imports {what}")
    assert not bad, "private names imported across packages:\n" + "\n".join(bad)


@pytest.mark.parametrize("part", ["storage", "state.py", "_state"])
def test_storage_and_state_name_neither_jax_nor_torch(part):
    paths = (
        sorted((PKG / part).rglob("*.py"))
        if (PKG / part).is_dir()
        else [PKG / part]
        if (PKG / part).exists()
        else []
    )
    word = re.compile(r"\b(jax|jaxlib|torch)\b")
    bad = [
        f"{_where(p, i)}: {text.strip()}"
        for p in paths
        for i, text in enumerate(p.read_text().splitlines(), 1)
        if word.search(text)
    ]
    assert not bad, "storage and state know no integration by name:\n" + "\n".join(bad)
