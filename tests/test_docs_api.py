"""Every public name of every public module is in the API reference and has a docstring.

The reference pages are docs/src/api/*.md; a name is covered by a
mkdocstrings directive (``::: module.name``) or, for a name re-exported from
another public module, by a link ``[`name`][home.module.name]`` to the
directive of its home module, which must exist.  No build is needed.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
API = ROOT / "docs" / "src" / "api"
PUBLIC_MODULES = {
    "vlcc_adjoint": "index.md",
    "vlcc_adjoint.schedules": "schedules.md",
    "vlcc_adjoint.storage": "storage.md",
    "vlcc_adjoint.storage.codecs": "codecs.md",
    "vlcc_adjoint.state": "state.md",
    "vlcc_adjoint.lineage": "lineage.md",
    "vlcc_adjoint.jax": "jax.md",
    "vlcc_adjoint.torch": "torch.md",
    "vlcc_adjoint.mpi": "mpi.md",
    "vlcc_adjoint.devito": "devito.md",
}
DIRECTIVE = re.compile(r"^:::\s+([\w.]+)\s*$", re.M)
LINK = re.compile(r"\[`?(\w+)`?\]\[([\w.]+)\]")


def public_names(module: types.ModuleType) -> list[str]:
    """``__all__``, or the names the module binds without a leading underscore;
    submodules excepted either way (a public submodule has a page of its own)."""
    names = getattr(module, "__all__", None)
    if names is not None:
        return [n for n in names if not isinstance(getattr(module, n, None), types.ModuleType)]
    return sorted(n for n, v in vars(module).items()
                  if not n.startswith("_") and not isinstance(v, types.ModuleType))


def coverage_gaps(pages: dict[str, str]) -> list[str]:
    """The ``module.name`` of each public name that `pages` (file name -> markdown) leave out."""
    directives = {d for text in pages.values() for d in DIRECTIVE.findall(text)}
    gaps = []
    for modname, page in PUBLIC_MODULES.items():
        module = importlib.import_module(modname)
        text = pages.get(page, "")
        page_directives = set(DIRECTIVE.findall(text))
        links = dict(LINK.findall(text))
        for name in public_names(module):
            if f"{modname}.{name}" in page_directives:
                continue
            target = links.get(name)
            if target in directives and target.rpartition(".")[2] == name:
                home = importlib.import_module(target.rpartition(".")[0])
                if getattr(home, name, None) is getattr(module, name):
                    continue
            gaps.append(f"{modname}.{name}")
    return gaps


def attribute_has_doc(name: str) -> bool:
    """A module-level constant `name` has a docstring: a ``#:`` comment above, or a string below."""
    for path in (ROOT / "vlcc_adjoint").rglob("*.py"):
        source = path.read_text()
        if name not in source:
            continue
        lines = source.splitlines()
        tree = ast.parse(source)
        for i, node in enumerate(tree.body):
            targets = (node.targets if isinstance(node, ast.Assign)
                       else [node.target] if isinstance(node, ast.AnnAssign) else [])
            if not any(isinstance(t, ast.Name) and t.id == name for t in targets):
                continue
            nxt = tree.body[i + 1] if i + 1 < len(tree.body) else None
            if (isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant)
                    and isinstance(nxt.value.value, str) and nxt.value.value.strip()):
                return True
            if node.lineno >= 2 and lines[node.lineno - 2].lstrip().startswith("#:"):
                return True
    return False


def has_docstring(obj, name: str) -> bool:
    if inspect.isclass(obj):
        doc = obj.__dict__.get("__doc__")     # its own, not one inherited from a base class
    elif inspect.isroutine(obj) or callable(obj) and hasattr(obj, "__wrapped__"):
        doc = inspect.getdoc(obj)
    elif isinstance(obj, types.ModuleType):
        doc = obj.__doc__
    else:
        return attribute_has_doc(name)
    return bool(doc and doc.strip())


def read_pages() -> dict[str, str]:
    return {p.name: p.read_text() for p in API.glob("*.md")}


def test_every_public_name_is_in_the_api_reference():
    assert coverage_gaps(read_pages()) == []


def test_a_missing_name_or_a_dangling_link_is_reported():
    pages = read_pages()
    dropped = {k: v.replace("::: vlcc_adjoint.schedules.Revolve\n", "") for k, v in pages.items()}
    gaps = coverage_gaps(dropped)
    assert "vlcc_adjoint.schedules.Revolve" in gaps        # its own directive is gone
    assert "vlcc_adjoint.Revolve" in gaps                  # the top-level link now dangles


@pytest.mark.parametrize("modname", sorted(PUBLIC_MODULES))
def test_every_public_name_has_a_docstring(modname):
    module = importlib.import_module(modname)
    assert module.__doc__ and module.__doc__.strip(), f"{modname} has no module docstring"
    missing = [f"{modname}.{n}" for n in public_names(module) if not has_docstring(getattr(module, n), n)]
    assert missing == [], f"public names without a docstring: {missing}"


def test_the_docstring_check_fails_on_undocumented_objects():
    class Undocumented:
        pass

    def undocumented():
        pass

    class Documented(Exception):
        """Documented."""

    assert not has_docstring(Undocumented, "Undocumented")
    assert not has_docstring(undocumented, "undocumented")
    assert not has_docstring(type("E", (ValueError,), {}), "E")   # ValueError's doc is not its own
    assert has_docstring(Documented, "Documented")
    assert not attribute_has_doc("NO_SUCH_CONSTANT_ANYWHERE_123")
