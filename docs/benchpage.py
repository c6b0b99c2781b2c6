"""The Benchmarks page, generated from whatever ``benchmarks/results/`` holds.

One section per results file stem (``bench_<name>.json`` and its figures
``bench_<name>.png`` / ``bench_<name>_*.png``): the script that produced it
(``benchmarks/bench_<name>.py``, or the script the JSON names), the
reproducing commands from that script's docstring, the figures, and the
numbers, each with its file and JSON pointer (RFC 6901):

- the claims the file records (``benchmarks/claims.py``: what is claimed,
  its value or range, the peer and its setup, the goal and whether it was
  met), evaluated at build time;
- the numbers README.md and paper/paper.md quote from the file (their
  ``<!-- file.json#/pointer -->`` sources), read from the file at build time;
- the benchmark's own summary lines (a ``summary`` list or string);
- every other number of the file, collapsed (long numeric lists as their
  length and range).

Nothing is copied by hand, so the page shows what the files hold when the
site is built.  A results file whose producing script cannot be found fails
the build.
"""

from __future__ import annotations

import ast
import json
import math
import re
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
sys.path.insert(0, str(ROOT / "benchmarks"))
import claims  # noqa: E402  (benchmarks/claims.py: the claim records and their verdicts)

QUOTING = {"README.md": ROOT / "README.md", "paper": ROOT / "paper" / "paper.md"}
SOURCE = re.compile(r"([-+]?[\d][\d,]*(?:\.\d+)?\s*[x%]?)<!--\s*(.*?)\s*-->", re.S)
MAX_ROWS = 150  # leaves listed per file under "Every number"
LONG_LIST = 8  # numeric lists longer than this are summarised


def escape(key: str) -> str:
    """A key as a JSON pointer token (RFC 6901)."""
    return key.replace("~", "~0").replace("/", "~1")


def resolve(doc, pointer: str):
    """The value at `pointer` in `doc`; raises KeyError naming the missing token."""
    node = doc
    for raw in pointer.split("/")[1:]:
        key = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and key in node:
            node = node[key]
        elif isinstance(node, list) and key.isdigit() and int(key) < len(node):
            node = node[int(key)]
        else:
            raise KeyError(f"no key {key!r} at {pointer}")
    return node


def fmt(value) -> str:
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return f"{value:.6g}" if math.isfinite(value) else str(value)
    text = str(value)
    return text if len(text) <= 160 else text[:157] + "..."


def cell(text: str) -> str:
    """Text safe inside a Markdown table cell."""
    return text.replace("|", "\\|").replace("\n", " ")


UNITS = {"KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "kB": 1e3, "MB": 1e6, "GB": 1e9}


def quoted_sources() -> dict[str, list[dict]]:
    """results file -> the sources README/paper give for numbers from it, one per (source, quote).

    A source is ``FILE#POINTER``, a ratio ``REF / REF`` (the second may be
    ``#POINTER``: the same file), or ``REF in UNIT`` (bytes shown in a unit);
    see tests/project/test_paper.py.  Each entry: ``refs`` [(file, pointer)], ``unit``,
    ``quoted`` (the number as written), ``where`` (README.md, paper).
    """
    out: dict[str, dict[tuple, dict]] = {}
    for where, path in QUOTING.items():
        if not path.exists():
            continue
        for quoted, source in SOURCE.findall(path.read_text()):
            if source.startswith(("external:", "target:", "given:", "claim:")):
                continue
            unit = None
            m = re.search(r"\s+in\s+(KiB|MiB|GiB|kB|MB|GB)$", source)
            if m:
                unit, source = m.group(1), source[: m.start()]
            refs, default = [], None
            for ref in source.split(" / "):
                file, hash_, pointer = ref.strip().partition("#")
                file = file.strip().removeprefix("results/") or default
                if not hash_ or not file:
                    refs = []
                    break
                default = file
                refs.append((file, pointer.strip()))
            if not refs:
                continue
            key = (tuple(refs), unit, quoted.strip())
            entry = out.setdefault(refs[0][0], {}).setdefault(
                key, {"refs": refs, "unit": unit, "quoted": quoted.strip(), "where": []}
            )
            if where not in entry["where"]:
                entry["where"].append(where)
    return {file: list(entries.values()) for file, entries in out.items()}


def evaluate(entry: dict) -> str:
    """The value a source names, read now from the results files (or what is missing)."""
    values = []
    for file, pointer in entry["refs"]:
        path = RESULTS / file
        if not path.is_file():
            return f"**missing**: no file {file}"
        try:
            values.append(resolve(json.loads(path.read_text()), pointer))
        except KeyError as err:
            return f"**missing**: {file}: {err.args[0]}"
    if len(values) == 1 and entry["unit"] is None:
        return fmt(values[0])
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        return "**not a number**: " + ", ".join(fmt(v) for v in values)
    value = values[0] / values[1] if len(values) == 2 else values[0]
    if entry["unit"]:
        return f"{fmt(value / UNITS[entry['unit']])} {entry['unit']}"
    return fmt(value)


def source_text(entry: dict) -> str:
    first = entry["refs"][0][0]
    text = " / ".join(
        f"{file}#{pointer}" if i == 0 or file != first else f"#{pointer}"
        for i, (file, pointer) in enumerate(entry["refs"])
    )
    return text + (f" in {entry['unit']}" if entry["unit"] else "")


def leaves(node, pointer: str = ""):
    """(pointer, value) of every number and summary string, depth first."""
    if isinstance(node, dict):
        for k, v in node.items():
            yield from leaves(v, f"{pointer}/{escape(str(k))}")
    elif isinstance(node, list):
        if len(node) > LONG_LIST and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in node
        ):
            yield pointer, f"{len(node)} numbers, {fmt(min(node))} .. {fmt(max(node))}"
        else:
            for i, v in enumerate(node):
                yield from leaves(v, f"{pointer}/{i}")
    elif isinstance(node, (int, float)) and not isinstance(node, bool):
        yield pointer, node


def summaries(doc) -> list[tuple[str, str]]:
    """The benchmark's own summary lines: ``summary`` at the top or under ``meta``."""
    out = []
    for base, node in (("", doc), ("/meta", doc.get("meta") if isinstance(doc, dict) else None)):
        s = node.get("summary") if isinstance(node, dict) else None
        if isinstance(s, str):
            out.append((f"{base}/summary", s))
        elif isinstance(s, list):
            out += [
                (f"{base}/summary/{i}", line) for i, line in enumerate(s) if isinstance(line, str)
            ]
    return out


def script_of(stem: str, doc) -> Path:
    """The benchmark script that wrote ``<stem>.json``."""
    candidates = [ROOT / "benchmarks" / f"{stem}.py"]
    if isinstance(doc, dict):
        named = [
            doc.get("benchmark"),
            doc.get("command"),
            (doc.get("meta") or {}).get("benchmark") if isinstance(doc.get("meta"), dict) else None,
        ]
        for text in named:
            if isinstance(text, str):
                m = re.search(r"(?:benchmarks/)?(bench_\w+)(?:\.py)?", text)
                if m:
                    candidates.append(ROOT / "benchmarks" / f"{m.group(1)}.py")
    for path in candidates:
        if path.is_file():
            return path
    raise SystemExit(
        f"docs: benchmarks/results/{stem}.* has no producing script (looked for "
        f"{', '.join(str(p.relative_to(ROOT)) for p in candidates)}); add the script "
        "or remove the stale result"
    )


def docstring(path: Path) -> tuple[str, str]:
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    title, _, rest = doc.partition("\n")
    return title.strip().rstrip("."), rest.strip()


def commands(script: Path, doc: str) -> list[str]:
    """The reproducing commands the script's docstring lists, or the plain invocation."""
    pattern = re.compile(
        r"^(?:[A-Z_]+=\S+\s+)*python3?\s+benchmarks/" + re.escape(script.name) + r"\b"
    )
    found = [line.strip() for line in doc.splitlines() if pattern.match(line.strip())]
    return found or [f"python benchmarks/{script.name}"]


def claim_row(c: claims.Claim) -> str:
    """One claim as a table row: id, what it says, value or range, peer, goal."""
    value = (
        fmt(c.value) if len(c.values) == 1 else f"{fmt(c.low)} to {fmt(c.high)} over {c.set_name}"
    )
    against = ""
    if c.comparison:
        setup = c.comparison.get("peer_setup")
        against = c.comparison["peer"] + (f" ({setup})" if setup else "")
        against += f"; ours {c.direction()} ({c.comparison['better']} is better)"
    goal = ""
    if c.goal:
        kind = next(k for k in claims.GOALS if k in c.goal)
        goal = f"{kind} {fmt(c.goal[kind])}: **{c.verdict()}** ({c.goal['why']})"
    return (
        f"| `{c.id}` | {cell(c.says)} | {cell(value)} {c.unit} | {cell(against)} | {cell(goal)} |"
    )


def section(stem: str, figdir: Path, quoted: list[dict]) -> list[str]:
    json_path = RESULTS / f"{stem}.json"
    doc = json.loads(json_path.read_text()) if json_path.exists() else None
    script = script_of(stem, doc)
    title, rest = docstring(script)
    rel = script.relative_to(ROOT)
    parts = [
        f"## {stem}: {title.removeprefix('Benchmark: ')} {{#{stem}}}\n",
        f"Produced by `{rel}`"
        + (f", which wrote `benchmarks/results/{stem}.json`" if doc is not None else "")
        + ".  To reproduce it:\n",
        "```bash",
        *commands(script, rest),
        "```",
        "",
    ]
    figures = sorted(RESULTS.glob(f"{stem}.png")) + sorted(RESULTS.glob(f"{stem}_*.png"))
    for png in figures:
        shutil.copy2(png, figdir / png.name)
        parts += [
            f"![{png.stem}](benchmarks/{png.name})",
            "",
            f"*Figure: `benchmarks/results/{png.name}`.*",
            "",
        ]
    if doc is None:
        parts += ["This benchmark has a figure but no JSON results file.", ""]
    else:
        name = f"{stem}.json"
        records = claims.claims(name, RESULTS)
        if records:
            parts += [
                f'**Claims recorded in `{name}`** (`"claims"`; value, direction and '
                "verdict computed when this page was built):\n",
                "| claim | says | value | against | goal |",
                "|---|---|---|---|---|",
            ]
            parts += [claim_row(c) for c in records]
            parts.append("")
        if quoted:
            parts += [
                f"**Numbers README.md and the paper quote from `{name}`**, read from the "
                "file when this page was built (a ratio `A / B` is computed from the two):\n",
                "| source (file#JSON pointer) | value | quoted as | in |",
                "|---|---|---|---|",
            ]
            parts += [
                f"| `{cell(source_text(e))}` | {cell(evaluate(e))} | {cell(e['quoted'])} | "
                f"{', '.join(e['where'])} |"
                for e in quoted
            ]
            parts.append("")
        lines = summaries(doc)
        if lines:
            parts += [
                f"**The benchmark's summary** (`{name}`):\n",
                "| JSON pointer | line |",
                "|---|---|",
            ]
            parts += [f"| `{name}#{cell(p)}` | {cell(s)} |" for p, s in lines]
            parts.append("")
        rows = list(leaves(doc))
        shown = rows[:MAX_ROWS]
        parts += [
            f'??? note "Every number in {name} ({len(rows)})"',
            "    | JSON pointer | value |",
            "    |---|---|",
        ]
        parts += [f"    | `{name}#{cell(p)}` | {cell(fmt(v))} |" for p, v in shown]
        if len(rows) > len(shown):
            parts.append(f"\n    and {len(rows) - len(shown)} more in `benchmarks/results/{name}`.")
        parts.append("")
    parts += [
        '??? note "What it measures (the script\'s description)"',
        "    ```text",
        *("    " + line for line in rest.splitlines()),
        "    ```",
        "",
    ]
    return parts


def stems() -> list[str]:
    """Every results stem: each JSON file, and each figure that belongs to no JSON file."""
    found = {p.stem for p in RESULTS.glob("*.json") if p.stem != "run_all"}
    for png in RESULTS.glob("*.png"):
        if not any(png.stem == s or png.stem.startswith(s + "_") for s in found):
            found.add(png.stem)
    return sorted(found)


def page(out: Path) -> str:
    """Write the figures under `out`/benchmarks and return the page's Markdown."""
    figdir = out / "benchmarks"
    figdir.mkdir(parents=True, exist_ok=True)
    quoted = quoted_sources()
    names = stems()
    parts = [
        "# Benchmarks\n",
        "Generated when this site was built from the files in `benchmarks/results/`: for each "
        "one, the script that produced it and the command that reproduces it, its figures, "
        "and its numbers, each with its file and JSON pointer.  "
        "`python benchmarks/run_all.py --quick` runs every benchmark into "
        "`$TMPDIR/vlcc-bench-results/`; `--full --update-results` rewrites "
        "`benchmarks/results/`.\n",
        *(f"- [{s}](#{s})" for s in names),
        "",
    ]
    for stem in names:
        parts += section(stem, figdir, quoted.get(f"{stem}.json", []))
    return "\n".join(parts)
