"""The shape of the code: layers, import circles, private names.

Read from the source with ``ast`` (nothing is imported), so each offence is
reported with the file and line that makes it.  Every import statement
counts, wherever it stands: at module level, inside a function (it runs at
call time, but the dependency is the same), and under
``if TYPE_CHECKING:`` (it runs only for the type checker, but the module
still names the other one's types).  Each offence says which kind it is.

* Every module of the package has a layer, and dependencies point one way
  (DESIGN.md section 2): a module never imports from a layer above its own.
* No import circle: no module imports one that imports it back, directly
  or through others.  A package's ``__init__`` is a module like any other:
  its imports of its own submodules are edges, so a submodule that imports
  from its own package's facade closes a circle.
* No private name is imported from another module (``from ._comm import
  _mpi``), inside a package too, and none is reached through an imported
  module (``format._helper``); a private module (``_zarr``) is imported
  only from inside its own package or by the facade that fronts it
  (``lineage.py`` for ``_lineage/``, ``mpi.py`` for ``_mpi/``).  A package's
  ``__init__`` re-exporting its own modules' public names is the
  interface, and fine.
* The examples and tutorials reach the package through public modules
  (and the demo problems in ``vlcc_adjoint._examples``), as a user would.
* ``storage/`` and the state model name neither JAX nor torch.

The checks are functions of a package directory, so the self-tests at the
end run them on small packages written for the purpose, each with the one
offence the check must find.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "vlcc_adjoint"

#: Layer of each top-level part of the package; a module may import only
#: from its own layer or below.  A part missing here is an offence.
LAYERS = {
    "schedules": 0,
    "errors": 0,
    "state": 1,
    "_providers": 1,
    "_layout": 1,
    "_dtype_json": 1,
    "storage": 2,
    "solver": 3,
    "execute": 3,
    "_run": 3,
    "_checks": 3,
    "_result": 3,
    "_error_budget": 3,
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
    "capi": 5,
    "cli": 5,
    "__main__": 5,
    "__init__": 5,
}

#: Private packages and the modules that front them: they may import the
#: package's private modules (the ``vlcc`` command adds the lineage
#: subcommands and runs the demos).
FACADES = {"_lineage": {"lineage", "cli"}, "_mpi": {"mpi"}, "_examples": {"cli"}}

#: Imports of a private name that are allowed, as ``"file:name": reason``
#: (``"vlcc_adjoint/x.py:_y"``).  None today: give a module a public name
#: rather than adding one here.
ALLOWED_PRIVATE: dict[str, str] = {}

#: The part of the package that examples and tutorials may import although
#: its name is private: the demo problems (``SeismicProblem``,
#: ``DistributedSeismic``, ``seismic_demo``, ...) are example physics, not
#: library API, and every example reaches them the same way.
DEMO_PACKAGE = "vlcc_adjoint._examples"

#: Scripts written as a user would write them.
USER_SCRIPTS = ("examples", "docs/tutorials", "tests/mpi/mpi_scripts")


# ---------------------------------------------------------------------------
# reading the package
# ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Import:
    """One imported module or name, as written in one statement."""

    path: Path  #: the importing file
    line: int
    src: str  #: the importing module, dotted (``vlcc_adjoint.storage._tier``)
    dst: str  #: the imported module, dotted; a submodule named in ``from pkg import mod`` is ``pkg.mod``
    name: str | None  #: the name imported from `dst`, or None for the module itself
    kind: str  #: "at import time", "in a function" or "for type checking only"
    #: ``(local name, module)`` when the statement binds a module to a name
    #: (``import a.b as m``: ``("m", "a.b")``; ``import a.b``: ``("a", "a")``)
    binds: tuple[str, str] | None = None

    def where(self, root: Path) -> str:
        return f"{_rel(self.path, root)}:{self.line}"

    def what(self) -> str:
        return self.dst + (f".{self.name}" if self.name else "")


def _rel(path: Path, root: Path) -> str:
    try:
        return str(path.relative_to(root))
    except ValueError:
        return str(path)


def modules(pkg: Path) -> dict[str, Path]:
    """Every module of the package at `pkg`, dotted name -> file; a
    package is named by its ``__init__.py`` (``vlcc_adjoint.storage``)."""
    out = {}
    for path in sorted(pkg.rglob("*.py")):
        parts = [pkg.name, *path.relative_to(pkg).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _statements(tree: ast.Module) -> Iterator[tuple[ast.Import | ast.ImportFrom, str]]:
    """Every import statement of `tree` with the context it runs in."""

    def visit(node: ast.AST, kind: str) -> Iterator[tuple[ast.Import | ast.ImportFrom, str]]:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node, kind
            return
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            kind = "in a function" if kind == "at import time" else kind
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for stmt in node.body:
                yield from visit(stmt, "for type checking only")
            for stmt in node.orelse:
                yield from visit(stmt, kind)
            return
        for child in ast.iter_child_nodes(node):
            yield from visit(child, kind)

    yield from visit(tree, "at import time")


@functools.cache
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


@functools.cache
def parse_imports(pkg: Path) -> tuple[list[Import], list[str]]:
    """The imports of package modules by package modules, and the imports
    that name a module of the package that does not exist (file:line)."""
    mods = modules(pkg)
    top = pkg.name
    found, missing = [], []
    for src, path in mods.items():
        is_pkg = path.name == "__init__.py"
        base = src.split(".") if is_pkg else src.split(".")[:-1]
        for node, kind in _statements(_tree(path)):
            if isinstance(node, ast.Import):
                targets = [(a.name, None, a.asname) for a in node.names]
            else:
                if node.level:
                    up = node.level - 1
                    prefix = base[: len(base) - up] if up else base
                    target = ".".join(prefix + (node.module.split(".") if node.module else []))
                else:
                    target = node.module or ""
                targets = [(target, a.name, a.asname or a.name) for a in node.names]
            for target, name, asname in targets:
                if target != top and not target.startswith(top + "."):
                    continue
                if name is not None and f"{target}.{name}" in mods:
                    target, name = f"{target}.{name}", None  # from package import module
                if target not in mods:
                    missing.append(f"{_rel(path, pkg.parent)}:{node.lineno}: imports {target}")
                    continue
                binds = None
                if name is None:  # ``import a.b`` binds ``a``; ``import a.b as m``, ``m``
                    binds = (asname, target) if asname else (top, top)
                found.append(Import(path, node.lineno, src, target, name, kind, binds))
    return found, missing


def _part(module: str) -> str:
    """The top-level part of the package a dotted module belongs to."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


# ---------------------------------------------------------------------------
# the checks: each returns its offences, one line each, file:line first
# ---------------------------------------------------------------------------


def unlayered_parts(pkg: Path, layers: dict[str, int]) -> list[str]:
    """The top-level parts of the package that have no layer."""
    parts = {_part(m) for m in modules(pkg)}
    return [f"{pkg.name}/{p}: no layer (add it to LAYERS)" for p in sorted(parts - set(layers))]


def stale_layers(pkg: Path, layers: dict[str, int]) -> list[str]:
    """The layers that name no part of the package (a part moved or gone)."""
    parts = {_part(m) for m in modules(pkg)}
    return [
        f"{pkg.name}/{p}: in LAYERS but not in the package" for p in sorted(set(layers) - parts)
    ]


def upward_imports(pkg: Path, layers: dict[str, int]) -> list[str]:
    """Imports from a layer above the importer's."""
    imports, _ = parse_imports(pkg)
    bad = []
    for imp in imports:
        a, b = layers.get(_part(imp.src)), layers.get(_part(imp.dst))
        if a is not None and b is not None and b > a:
            bad.append(
                f"{imp.where(pkg.parent)}: {imp.src} (layer {a}) imports {imp.what()} "
                f"(layer {b}) {imp.kind}"
            )
    return bad


def missing_modules(pkg: Path) -> list[str]:
    """Imports of package modules that do not exist."""
    return parse_imports(pkg)[1]


def import_circles(pkg: Path) -> list[str]:
    """Every circle of the module graph (a strongly connected component of
    more than one module), with each import that ties it."""
    imports, _ = parse_imports(pkg)
    edges: dict[str, dict[str, list[Import]]] = {}
    for imp in imports:
        if imp.dst != imp.src:
            edges.setdefault(imp.src, {}).setdefault(imp.dst, []).append(imp)
    # Tarjan's strongly connected components, iteratively.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[list[str]] = []
    counter = 0
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges.get(start, {}))))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, it = work[-1]
            for nxt in it:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(edges.get(nxt, {})))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    comp = []
                    while True:
                        m = stack.pop()
                        on_stack.discard(m)
                        comp.append(m)
                        if m == node:
                            break
                    if len(comp) > 1:
                        components.append(sorted(comp))
    lines = []
    for comp in sorted(components):
        lines.append(f"circle of {len(comp)} modules: {', '.join(comp)}")
        members = set(comp)
        for src in comp:
            for dst, imps in sorted(edges.get(src, {}).items()):
                if dst not in members:
                    continue
                for imp in imps:
                    lines.append(
                        f"  {imp.where(pkg.parent)}: {src} imports {imp.what()} {imp.kind}"
                    )
    return lines


def _package_of(module: str, mods: dict[str, Path]) -> str:
    """The subpackage of the top package that `module` belongs to, or the
    top package itself for the modules directly in it."""
    parts = module.split(".")
    if len(parts) == 1:
        return parts[0]
    if len(parts) == 2 and mods[module].name != "__init__.py":
        return parts[0]
    return ".".join(parts[:2])


def private_imports(pkg: Path, allowed: dict[str, str], facades: dict[str, set[str]]) -> list[str]:
    """Private names imported from another module or reached through an
    imported module, and private modules imported from outside their
    package (other than by its facade)."""
    mods = modules(pkg)
    imports, _ = parse_imports(pkg)
    bad = []

    def refuse(path: Path, line: int, text: str, name: str) -> None:
        if f"{_rel(path, pkg.parent)}:{name}" not in allowed:
            bad.append(f"{_rel(path, pkg.parent)}:{line}: {text}")

    for imp in imports:
        if imp.name is not None and _is_private(imp.name):
            refuse(imp.path, imp.line, f"{imp.src} imports the private name {imp.what()}", imp.name)
            continue
        home, owner = _package_of(imp.src, mods), _package_of(imp.dst, mods)
        if home == owner or _part(imp.src) in facades.get(_part(imp.dst), ()):
            continue
        private = [p for p in imp.dst.split(".")[len(owner.split(".")) :] if _is_private(p)]
        if _is_private(owner.rpartition(".")[2]) or private:
            refuse(
                imp.path,
                imp.line,
                f"{imp.src} imports {imp.what()} from a private module of another package",
                imp.dst.rpartition(".")[2],
            )
    # module.attribute: a private name reached through an imported module
    for src, path in mods.items():
        aliases = dict(i.binds for i in imports if i.path == path and i.binds is not None)
        if not aliases:
            continue
        for node in ast.walk(_tree(path)):
            if not (isinstance(node, ast.Attribute) and _is_private(node.attr)):
                continue
            chain, value = [], node.value
            while isinstance(value, ast.Attribute):
                chain.append(value.attr)
                value = value.value
            if not (isinstance(value, ast.Name) and value.id in aliases):
                continue
            module = ".".join([aliases[value.id], *reversed(chain)])
            if module in mods:
                text = f"{src} reaches the private name {module}.{node.attr}"
                refuse(path, node.lineno, text, node.attr)
    return sorted(set(bad), key=lambda s: (s.split(":")[0], int(s.split(":")[1]), s))


def user_script_imports(scripts: list[Path], root: Path, demo: str) -> list[str]:
    """Imports of private modules or names by scripts written as a user
    would (the demo package excepted)."""
    bad = []
    for path in scripts:
        tree = _tree(path)
        for node, _ in _statements(tree):
            if isinstance(node, ast.Import):
                pairs = [(a.name, None) for a in node.names]
            elif node.level == 0:
                pairs = [(node.module or "", a.name) for a in node.names]
            else:
                continue
            for module, name in pairs:
                if module.split(".")[0] != demo.split(".")[0]:
                    continue
                inside_demo = module == demo or module.startswith(demo + ".")
                rest = module[len(demo) :].split(".") if inside_demo else module.split(".")
                if any(_is_private(p) for p in rest) or (name is not None and _is_private(name)):
                    what = module + (f".{name}" if name else "")
                    bad.append(f"{_rel(path, root)}:{node.lineno}: imports {what}")
    return bad


# ---------------------------------------------------------------------------
# the package
# ---------------------------------------------------------------------------


def _report(title: str, lines: list[str]) -> str:
    return f"{title} ({len(lines)}):\n" + "\n".join(lines)


def test_every_part_of_the_package_has_a_layer():
    bad = unlayered_parts(PKG, LAYERS)
    assert not bad, _report("parts without a layer", bad)


def test_every_layer_names_a_part_of_the_package():
    bad = stale_layers(PKG, LAYERS)
    assert not bad, _report("layers of parts that do not exist", bad)


def test_dependencies_point_one_way():
    bad = upward_imports(PKG, LAYERS)
    assert not bad, _report("imports from a layer above", bad)


def test_every_imported_module_exists():
    bad = missing_modules(PKG)
    assert not bad, _report("imports of modules that do not exist", bad)


def test_no_import_circle():
    lines = import_circles(PKG)
    assert not lines, _report("import circles, and the imports that tie them", lines)


def test_no_private_name_is_imported_from_another_module():
    bad = private_imports(PKG, ALLOWED_PRIVATE, FACADES)
    assert not bad, _report("private names imported from another module", bad)


def test_examples_and_tutorials_use_public_names():
    scripts = sorted(p for d in USER_SCRIPTS for p in (ROOT / d).rglob("*.py"))
    assert scripts, f"no scripts found under {USER_SCRIPTS}"
    bad = user_script_imports(scripts, ROOT, DEMO_PACKAGE)
    assert not bad, _report(
        f"private imports in scripts written as a user would (only {DEMO_PACKAGE} is allowed)",
        bad,
    )


@pytest.mark.parametrize("part", ["storage", "state.py", "_layout.py", "_providers.py"])
def test_storage_and_state_name_neither_jax_nor_torch(part):
    path = PKG / part
    assert path.exists(), f"{path} does not exist: fix the parametrisation"
    paths = sorted(path.rglob("*.py")) if path.is_dir() else [path]
    word = re.compile(r"\b(jax|jaxlib|torch)\b")
    bad = [
        f"{_rel(p, ROOT)}:{i}: {text.strip()}"
        for p in paths
        for i, text in enumerate(p.read_text().splitlines(), 1)
        if word.search(text)
    ]
    assert not bad, _report("storage and state know no integration by name", bad)


# ---------------------------------------------------------------------------
# self-tests: each check finds what it must, on the package and on a package
# written with one offence
# ---------------------------------------------------------------------------


def test_reader_finds_known_imports_of_every_kind():
    imports, missing = parse_imports(PKG)
    assert missing == []
    seen = {(i.src, i.dst, i.name, i.kind) for i in imports}
    # module level, a name from a module
    assert ("vlcc_adjoint.devito", "vlcc_adjoint.execute", "run_adjoint", "at import time") in seen
    # inside a function, from a package's facade
    assert ("vlcc_adjoint.cli", "vlcc_adjoint.plot", "plot_schedule", "in a function") in seen
    # under if TYPE_CHECKING
    assert (
        "vlcc_adjoint.devito",
        "vlcc_adjoint.storage",
        "TieredStore",
        "for type checking only",
    ) in seen
    # ``from package import module`` resolves to the module
    assert ("vlcc_adjoint.cli", "vlcc_adjoint.schedules", None, "in a function") in seen


def _write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root / "pkg"


def test_checks_pass_a_clean_package(tmp_path):
    pkg = _write(
        tmp_path,
        {
            "pkg/__init__.py": "from .low import f as f\n",
            "pkg/low.py": "def f():\n    return 1\n",
            "pkg/high.py": "from .low import f\n\ndef g():\n    from . import low\n    return low.f()\n",
            "pkg/sub/__init__.py": "from ._impl import h as h\n",
            "pkg/sub/_impl.py": "from ..low import f\n\ndef h():\n    return f()\n",
        },
    )
    layers = {"__init__": 2, "low": 0, "high": 1, "sub": 1}
    assert unlayered_parts(pkg, layers) == []
    assert upward_imports(pkg, layers) == []
    assert missing_modules(pkg) == []
    assert import_circles(pkg) == []
    assert private_imports(pkg, {}, {}) == []


def test_a_part_without_a_layer_is_found(tmp_path):
    pkg = _write(tmp_path, {"pkg/__init__.py": "", "pkg/new.py": ""})
    assert unlayered_parts(pkg, {"__init__": 0}) == ["pkg/new: no layer (add it to LAYERS)"]


def test_a_layer_of_a_part_that_is_gone_is_found(tmp_path):
    pkg = _write(tmp_path, {"pkg/__init__.py": "", "pkg/new.py": ""})
    layers = {"__init__": 0, "new": 0, "old": 1}
    assert stale_layers(pkg, layers) == ["pkg/old: in LAYERS but not in the package"]


def test_an_upward_import_inside_a_function_is_found(tmp_path):
    pkg = _write(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/low.py": "def f():\n    from .high import g\n    return g\n",
            "pkg/high.py": "def g():\n    pass\n",
        },
    )
    bad = upward_imports(pkg, {"__init__": 2, "low": 0, "high": 1})
    assert bad == ["pkg/low.py:2: pkg.low (layer 0) imports pkg.high.g (layer 1) in a function"]


def test_an_import_of_a_missing_module_is_found(tmp_path):
    pkg = _write(
        tmp_path, {"pkg/__init__.py": "", "pkg/a.py": "def f():\n    from .gone import x\n"}
    )
    assert missing_modules(pkg) == ["pkg/a.py:2: imports pkg.gone"]


def test_a_circle_closed_inside_a_function_is_found_with_each_import(tmp_path):
    pkg = _write(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/a.py": "from .b import g\n\ndef f():\n    return g()\n",
            "pkg/b.py": "def g():\n    from .a import f\n    return f\n",
        },
    )
    assert import_circles(pkg) == [
        "circle of 2 modules: pkg.a, pkg.b",
        "  pkg/a.py:1: pkg.a imports pkg.b.g at import time",
        "  pkg/b.py:2: pkg.b imports pkg.a.f in a function",
    ]


def test_a_circle_through_a_package_facade_or_type_checking_is_found(tmp_path):
    pkg = _write(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/sub/__init__.py": "from .x import X as X\nfrom .y import Y as Y\n",
            "pkg/sub/x.py": "class X:\n    pass\n",
            "pkg/sub/y.py": (
                "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import X\n"
                "class Y:\n    pass\n"
            ),
        },
    )
    lines = import_circles(pkg)
    assert lines[0] == "circle of 2 modules: pkg.sub, pkg.sub.y"
    assert "  pkg/sub/y.py:3: pkg.sub.y imports pkg.sub.X for type checking only" in lines


def test_private_names_are_found_inside_a_package_and_through_a_module(tmp_path):
    pkg = _write(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/sub/__init__.py": "",
            "pkg/sub/_comm.py": "def _mpi():\n    pass\n\ndef public():\n    pass\n",
            "pkg/sub/_halo.py": "from ._comm import _mpi, public\n",
            "pkg/sub/_run.py": "from . import _comm\n\ndef f():\n    return _comm._mpi()\n",
            "pkg/other.py": "def f():\n    from .sub._comm import public\n",
            "pkg/alias.py": "from .sub import _comm as c\nc._mpi()\n",
        },
    )
    assert private_imports(pkg, {}, {}) == [
        "pkg/alias.py:1: pkg.alias imports pkg.sub._comm from a private module of another package",
        "pkg/alias.py:2: pkg.alias reaches the private name pkg.sub._comm._mpi",
        "pkg/other.py:2: pkg.other imports pkg.sub._comm.public from a private module of another package",
        "pkg/sub/_halo.py:1: pkg.sub._halo imports the private name pkg.sub._comm._mpi",
        "pkg/sub/_run.py:4: pkg.sub._run reaches the private name pkg.sub._comm._mpi",
    ]
    # a facade may import its private package; an allowed name is named with its file
    assert private_imports(
        pkg, {"pkg/sub/_halo.py:_mpi": "reason"}, {"sub": {"other", "alias"}}
    ) == [
        "pkg/alias.py:2: pkg.alias reaches the private name pkg.sub._comm._mpi",
        "pkg/sub/_run.py:4: pkg.sub._run reaches the private name pkg.sub._comm._mpi",
    ]


def test_private_imports_in_user_scripts_are_found(tmp_path):
    script = tmp_path / "example.py"
    script.write_text(
        "from vlcc_adjoint.mpi import Guard\n"
        "from vlcc_adjoint._examples.seismic import SeismicProblem\n"
        "from vlcc_adjoint._mpi._comm import Guard\n"
        "import vlcc_adjoint.storage._zarr\n"
        "from vlcc_adjoint.state import _helper\n"
        "from vlcc_adjoint._examples._private import x\n"
    )
    assert user_script_imports([script], tmp_path, DEMO_PACKAGE) == [
        "example.py:3: imports vlcc_adjoint._mpi._comm.Guard",
        "example.py:4: imports vlcc_adjoint.storage._zarr",
        "example.py:5: imports vlcc_adjoint.state._helper",
        "example.py:6: imports vlcc_adjoint._examples._private.x",
    ]
