"""Generate the documentation sources in docs/_build/src.

Copies the hand-written pages of docs/src, executes each tutorial script of
docs/tutorials (its module docstring is the page's introduction, its source
is shown, then what it printed and the figures it wrote; a warning is an
error, as in ``mkdocs build --strict``), runs
docs/figures.py for the concept figures, and writes the benchmarks page from
benchmarks/results/ (docs/benchpage.py).  A tutorial that fails or warns
fails the build.  A tutorial ``NN_name.py`` may come with files of its own in
``docs/tutorials/NN_name/`` (a script it launches under ``mpiexec``, say):
they are shown on its page before its own code.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchpage  # noqa: E402  (docs/benchpage.py)

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
OUT = DOCS / "_build" / "src"
TUTORIAL_TIMEOUT_S = 300


def split_docstring(path: Path) -> tuple[str, str, str]:
    """Return (title, rest of the docstring, source without the docstring) of a script."""
    text = path.read_text()
    tree = ast.parse(text)
    doc = ast.get_docstring(tree) or ""
    body = text
    if (
        tree.body
        and isinstance(tree.body[0], ast.Expr)
        and isinstance(tree.body[0].value, ast.Constant)
    ):
        end = tree.body[0].end_lineno
        body = "\n".join(text.splitlines()[end:]).lstrip("\n")
    title, _, rest = doc.partition("\n")
    return title.strip().rstrip("."), rest.strip(), body


def run_script(script: Path, figdir: Path) -> tuple[str, float]:
    env = dict(os.environ, MPLBACKEND="Agg", VLCC_DOCS_FIGURES=str(figdir))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-W", "error", str(script)],
        cwd=figdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=TUTORIAL_TIMEOUT_S,
    )
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout + proc.stderr)
        raise SystemExit(
            f"docs: {script.relative_to(ROOT)} failed (exit {proc.returncode}); see above"
        )
    return proc.stdout, seconds


def missing_modules(scripts: list[Path]) -> list[str]:
    """``module (needed by script)`` for each top-level import of `scripts` that is not installed."""
    import importlib.util

    missing = []
    for script in scripts:
        for node in ast.walk(ast.parse(script.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module]
                if isinstance(node, ast.ImportFrom) and node.level == 0
                else []
            )
            for name in names:
                root = name.partition(".")[0]
                if root in sys.stdlib_module_names or importlib.util.find_spec(root) is not None:
                    continue
                missing.append(f"{root} (needed by {script.relative_to(ROOT)})")
    return sorted(set(missing))


def tutorial_page(script: Path) -> str:
    figdir = OUT / "tutorials" / "figures"
    figdir.mkdir(parents=True, exist_ok=True)
    before = set(figdir.iterdir())
    stdout, seconds = run_script(script, figdir)
    figures = sorted(p for p in set(figdir.iterdir()) - before if p.suffix == ".png")
    title, intro, body = split_docstring(script)
    parts = [
        f"# {title}\n",
        intro,
        "",
        f'!!! success "Executed when this site was built ({seconds:.1f} s)"\n'
        f"    The code below ran as `python -W error docs/tutorials/{script.name}`; its output and "
        f"figures follow it.\n",
    ]
    companions = script.with_suffix("")
    if companions.is_dir():
        for path in sorted(
            p for p in companions.rglob("*") if p.is_file() and "__pycache__" not in p.parts
        ):
            lang = "python" if path.suffix == ".py" else "text"
            parts += [
                f"`{path.relative_to(ROOT).as_posix()}`:",
                "",
                f"```{lang}",
                path.read_text().rstrip(),
                "```",
                "",
            ]
        parts += [f"`docs/tutorials/{script.name}`:", ""]
    parts += [
        "```python",
        body.rstrip(),
        "```",
        "",
        "**Output:**",
        "",
        "```text",
        stdout.rstrip(),
        "```",
        "",
    ]
    for fig in figures:
        parts += [f"![{fig.stem}](figures/{fig.name})", ""]
    print(f"docs: {script.name} ran in {seconds:.1f} s", flush=True)
    return "\n".join(parts)


def main() -> None:
    if OUT.exists():
        shutil.rmtree(OUT)
    shutil.copytree(DOCS / "src", OUT)
    tutorials = sorted((DOCS / "tutorials").glob("*.py"))
    missing = missing_modules(
        tutorials + sorted((DOCS / "tutorials").glob("*/*.py")) + [DOCS / "figures.py"]
    )
    if missing:
        raise SystemExit(
            "docs: the tutorials import modules that are not installed: "
            + ", ".join(missing)
            + '; install them with pip install -e ".[docs]"'
        )
    figdir = OUT / "figures"
    figdir.mkdir(exist_ok=True)
    run_script(DOCS / "figures.py", figdir)
    for script in tutorials:
        (OUT / "tutorials" / f"{script.stem}.md").write_text(tutorial_page(script))
    (OUT / "benchmarks.md").write_text(benchpage.page(OUT))


if __name__ == "__main__":
    main()
