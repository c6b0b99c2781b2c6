"""Generate the documentation sources in docs/_build/src.

Copies the hand-written pages of docs/src, executes each tutorial script of
docs/tutorials (its module docstring is the page's introduction, its source
is shown, then what it printed and the figures it wrote; a warning is an
error, as in ``mkdocs build --strict``), runs
docs/figures.py for the concept figures, and writes the benchmarks page from
benchmarks/results/*.png and each benchmark script's module docstring.  A
tutorial that fails or warns fails the build.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

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
    if tree.body and isinstance(tree.body[0], ast.Expr) and isinstance(tree.body[0].value, ast.Constant):
        end = tree.body[0].end_lineno
        body = "\n".join(text.splitlines()[end:]).lstrip("\n")
    title, _, rest = doc.partition("\n")
    return title.strip().rstrip("."), rest.strip(), body


def run_script(script: Path, figdir: Path) -> tuple[str, float]:
    env = dict(os.environ, MPLBACKEND="Agg", VLCC_DOCS_FIGURES=str(figdir))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-W", "error", str(script)], cwd=figdir, env=env, capture_output=True,
                          text=True, timeout=TUTORIAL_TIMEOUT_S)
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout + proc.stderr)
        raise SystemExit(f"docs: {script.relative_to(ROOT)} failed (exit {proc.returncode}); see above")
    return proc.stdout, seconds


def tutorial_page(script: Path) -> str:
    figdir = OUT / "tutorials" / "figures"
    figdir.mkdir(parents=True, exist_ok=True)
    before = set(figdir.iterdir())
    stdout, seconds = run_script(script, figdir)
    figures = sorted(p for p in set(figdir.iterdir()) - before if p.suffix == ".png")
    title, intro, body = split_docstring(script)
    parts = [f"# {title}\n", intro, "",
             f'!!! success "Executed when this site was built ({seconds:.1f} s)"\n'
             f"    The code below ran as `python -W error docs/tutorials/{script.name}`; its output and "
             f"figures follow it.\n",
             "```python", body.rstrip(), "```", "", "**Output:**", "", "```text", stdout.rstrip(), "```", ""]
    for fig in figures:
        parts += [f"![{fig.stem}](figures/{fig.name})", ""]
    print(f"docs: {script.name} ran in {seconds:.1f} s", flush=True)
    return "\n".join(parts)


def bench_commands(script: Path, doc: str) -> list[str]:
    """The reproducing commands a benchmark's docstring lists, or the plain invocation."""
    pattern = re.compile(r"^(?:[A-Z_]+=\S+\s+)*python3?\s+benchmarks/" + re.escape(script.name) + r"\b")
    found = [line.strip() for line in doc.splitlines() if pattern.match(line.strip())]
    return found or [f"python benchmarks/{script.name}"]


def benchmarks_page() -> str:
    results = ROOT / "benchmarks" / "results"
    figdir = OUT / "benchmarks"
    figdir.mkdir(parents=True, exist_ok=True)
    parts = ["# Benchmarks\n",
             "Each figure is `benchmarks/results/<name>.png`, written by the benchmark script with "
             "its JSON next to it; the command under each title reproduces it.  The text is the "
             "script's own description.  `python benchmarks/run_all.py` runs them all.\n"]
    for png in sorted(results.glob("bench_*.png")):
        script = ROOT / "benchmarks" / f"{png.stem}.py"
        if not script.exists():
            raise SystemExit(f"docs: {png.relative_to(ROOT)} has no script benchmarks/{png.stem}.py")
        title, rest, _ = split_docstring(script)
        shutil.copy2(png, figdir / png.name)
        parts += [f"## {png.stem}: {title.removeprefix('Benchmark: ')}\n", "```bash", *bench_commands(script, rest), "```", "",
                  f"![{png.stem}](benchmarks/{png.name})", "", '??? note "What it measures"',
                  "    ```text", *("    " + line for line in rest.splitlines()), "    ```", ""]
    return "\n".join(parts)


def main() -> None:
    if OUT.exists():
        shutil.rmtree(OUT)
    shutil.copytree(DOCS / "src", OUT)
    figdir = OUT / "figures"
    figdir.mkdir(exist_ok=True)
    run_script(DOCS / "figures.py", figdir)
    for script in sorted((DOCS / "tutorials").glob("*.py")):
        (OUT / "tutorials" / f"{script.stem}.md").write_text(tutorial_page(script))
    (OUT / "benchmarks.md").write_text(benchmarks_page())


if __name__ == "__main__":
    main()
