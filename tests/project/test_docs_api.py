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
import json
import re
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
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
    "vlcc_adjoint.torch.dcp": "torch.md",
    "vlcc_adjoint.mpi": "mpi.md",
    "vlcc_adjoint.devito": "devito.md",
    "vlcc_adjoint.capi": "capi.md",
}
DIRECTIVE = re.compile(r"^:::\s+([\w.]+)\s*$", re.M)
LINK = re.compile(r"\[`?(\w+)`?\]\[([\w.]+)\]")


def public_names(module: types.ModuleType) -> list[str]:
    """``__all__``, or the names the module binds without a leading underscore;
    submodules excepted either way (a public submodule has a page of its own)."""
    names = getattr(module, "__all__", None)
    if names is not None:
        return [n for n in names if not isinstance(getattr(module, n, None), types.ModuleType)]
    return sorted(
        n
        for n, v in vars(module).items()
        if not n.startswith("_") and not isinstance(v, types.ModuleType)
    )


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
            targets = (
                node.targets
                if isinstance(node, ast.Assign)
                else [node.target]
                if isinstance(node, ast.AnnAssign)
                else []
            )
            if not any(isinstance(t, ast.Name) and t.id == name for t in targets):
                continue
            nxt = tree.body[i + 1] if i + 1 < len(tree.body) else None
            if (
                isinstance(nxt, ast.Expr)
                and isinstance(nxt.value, ast.Constant)
                and isinstance(nxt.value.value, str)
                and nxt.value.value.strip()
            ):
                return True
            if node.lineno >= 2 and lines[node.lineno - 2].lstrip().startswith("#:"):
                return True
    return False


def has_docstring(obj, name: str) -> bool:
    if inspect.isclass(obj):
        doc = obj.__dict__.get("__doc__")  # its own, not one inherited from a base class
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
    assert "vlcc_adjoint.schedules.Revolve" in gaps  # its own directive is gone
    assert "vlcc_adjoint.Revolve" in gaps  # the top-level link now dangles


@pytest.mark.parametrize("modname", sorted(PUBLIC_MODULES))
def test_every_public_name_has_a_docstring(modname):
    module = importlib.import_module(modname)
    assert module.__doc__ and module.__doc__.strip(), f"{modname} has no module docstring"
    missing = [
        f"{modname}.{n}" for n in public_names(module) if not has_docstring(getattr(module, n), n)
    ]
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
    assert not has_docstring(type("E", (ValueError,), {}), "E")  # ValueError's doc is not its own
    assert has_docstring(Documented, "Documented")
    assert not attribute_has_doc("NO_SUCH_CONSTANT_ANYWHERE_123")


# ---------------------------------------------------------------------------
# the Benchmarks page (docs/benchpage.py), generated from benchmarks/results/
# ---------------------------------------------------------------------------


def _benchpage():
    import sys

    sys.path.insert(0, str(ROOT / "docs"))
    try:
        import benchpage
    finally:
        sys.path.remove(str(ROOT / "docs"))
    return benchpage


def test_benchmarks_page_has_a_section_per_results_file_naming_its_script(tmp_path):
    bp = _benchpage()
    text = bp.page(tmp_path)
    for result in sorted(
        (ROOT / "benchmarks" / "results").glob("bench_*.json")
    ):  # not run_all.json
        assert f"{{#{result.stem}}}" in text, result.name
        script = bp.script_of(result.stem, json.loads(result.read_text()))  # its own or its meta's
        assert f"Produced by `benchmarks/{script.name}`" in text, result.name
        assert f"`{result.name}#/" in text, result.name  # its numbers, with pointers
    for png in (ROOT / "benchmarks" / "results").glob("*.png"):
        assert (tmp_path / "benchmarks" / png.name).is_file()
        assert f"](benchmarks/{png.name})" in text


def test_benchmarks_page_picks_up_new_files_and_refuses_results_without_a_script(
    tmp_path, monkeypatch
):
    bp = _benchpage()
    results = tmp_path / "results"
    results.mkdir()
    monkeypatch.setattr(bp, "RESULTS", results)
    monkeypatch.setattr(bp, "QUOTING", {})
    # a file named after no script, but naming the script that wrote it
    (results / "bench_tiers_rerun.json").write_text(
        '{"benchmark": "bench_tiers", "x": {"a/b": 1.5, "long": [1,2,3,4,5,6,7,8,9,10]}}'
    )
    text = bp.page(tmp_path / "out")
    assert "{#bench_tiers_rerun}" in text and "Produced by `benchmarks/bench_tiers.py`" in text
    assert "| `bench_tiers_rerun.json#/x/a~1b` | 1.5 |" in text  # RFC 6901 escaping
    assert "10 numbers, 1 .. 10" in text
    (results / "bench_no_such_script.json").write_text("{}")
    with pytest.raises(SystemExit, match="bench_no_such_script"):
        bp.page(tmp_path / "out")


def test_benchmarks_page_resolves_the_quoted_sources_at_build_time(tmp_path, monkeypatch):
    bp = _benchpage()
    monkeypatch.setattr(bp, "RESULTS", tmp_path)
    (tmp_path / "bench_x.json").write_text('{"r": [6.2, 2.0], "b": 134217728}')
    doc = tmp_path / "paper.md"
    doc.write_text(
        "3.1x<!-- bench_x.json#/r/0 / #/r/1 --> and 128<!-- bench_x.json#/b in MiB --> "
        "MiB; 7<!-- bench_x.json#/gone -->; 2<!-- external: measured by hand on a laptop -->"
    )
    monkeypatch.setattr(bp, "QUOTING", {"paper": doc})
    entries = bp.quoted_sources()["bench_x.json"]
    got = {bp.source_text(e): (bp.evaluate(e), e["quoted"]) for e in entries}
    assert got["bench_x.json#/r/0 / #/r/1"] == ("3.1", "3.1x")
    assert got["bench_x.json#/b in MiB"] == ("128 MiB", "128")
    assert got["bench_x.json#/gone"][0].startswith("**missing**")
    assert len(entries) == 3  # the external one is not a file's


def test_the_build_names_the_modules_a_tutorial_needs_and_lacks(tmp_path, monkeypatch):
    import sys

    sys.path.insert(0, str(ROOT / "docs"))
    try:
        import gen
    finally:
        sys.path.remove(str(ROOT / "docs"))
    monkeypatch.setattr(gen, "ROOT", tmp_path)
    script = tmp_path / "t.py"
    script.write_text(
        "import os, numpy\nimport no_such_module_abc.sub\nfrom also_missing_xyz import f\n"
        "from . import relative_is_ignored\n"
    )
    assert gen.missing_modules([script]) == [
        "also_missing_xyz (needed by t.py)",
        "no_such_module_abc (needed by t.py)",
    ]
    assert gen.missing_modules(sorted((ROOT / "docs" / "tutorials").glob("*.py"))) == []
