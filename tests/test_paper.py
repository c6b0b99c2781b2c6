"""The paper (and the README's Performance section) quote only what the
benchmarks measured.

* every figure ``paper/paper.md`` links exists, is a PNG written by
  ``benchmarks/``, and its caption names the command that made it;
* every citation key is in ``paper/paper.bib``;
* every number in the prose and tables appears in a results file of
  ``benchmarks/results/`` (as a JSON number, or inside a JSON string), to
  the precision it is quoted with.  Formulas (``$...$``), code spans,
  citations, links and figure / table / section numbers are not measured
  values and are left out.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAPER = ROOT / "paper" / "paper.md"
BIB = ROOT / "paper" / "paper.bib"
RESULTS = ROOT / "benchmarks" / "results"

NUMBER = re.compile(r"(?<![\w.^/-])(\d{1,3}(?:,\d{3})+|\d+)(\.\d+)?(?:\s?(%|x\b|×))?(?![\w^])")
FIGURE = re.compile(r"!\[(?P<caption>(?:[^\[\]]|\[[^\]]*\])*)\]\((?P<path>[^)\s]+)\)")
LABELLED = re.compile(r"\b(?:Figure|Fig\.|Table|Section|Eq\.|Equation|issue|Issue)\s+\d+", re.I)


def _strip_front_matter(text: str) -> str:
    if text.startswith("---"):
        return text.split("\n---", 1)[1]
    return text


def _body(text: str) -> str:
    """The prose of the paper: no front matter, code, math, citations or links."""
    text = _strip_front_matter(text)
    text = re.sub(r"```.*?```", " ", text, flags=re.S)
    text = re.sub(r"<!--.*?-->", " ", text, flags=re.S)
    text = re.sub(r"\$\$.*?\$\$", " ", text, flags=re.S)
    text = re.sub(r"\$[^$\n]+\$", " ", text)
    text = re.sub(r"`[^`\n]+`", " ", text)
    text = re.sub(r"\[-?@[^\]]+\]", " ", text)
    text = re.sub(r"@[\w:.-]+", " ", text)
    text = re.sub(r"\]\([^)]*\)", "]", text)
    text = re.sub(r"\{#[^}]*\}", " ", text)
    text = re.sub(r"https?://\S+", " ", text)
    return LABELLED.sub(" ", text)


def _quoted_numbers(text: str):
    """(value, decimals, unit, the text quoted) for every number; unit is
    ``"%"``, ``"x"`` (a ratio) or ``""``."""
    for match in NUMBER.finditer(_body(text)):
        whole, frac, unit = match.groups()
        decimals = len(frac) - 1 if frac else 0
        value = float(whole.replace(",", "") + (frac or ""))
        yield value, decimals, (unit or "").replace("×", "x"), match.group(0).strip()


def _measured_numbers() -> list[float]:
    found: list[float] = []

    def walk(node):
        if isinstance(node, bool):
            return
        if isinstance(node, (int, float)):
            if math.isfinite(node):
                found.append(float(node))
        elif isinstance(node, str):
            found.extend(float(s) for s in re.findall(r"\d+(?:\.\d+)?(?:[eE][-+]?\d+)?", node))
        elif isinstance(node, dict):
            for key, value in node.items():
                walk(key)
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    for path in sorted(RESULTS.glob("*.json")):
        walk(json.loads(path.read_text()))
    return found


def _unmeasured(text: str, measured: dict) -> list[str]:
    """The numbers quoted in `text` that no results file contains."""
    return sorted({quoted for value, decimals, unit, quoted in _quoted_numbers(text)
                   if not _was_measured(value, decimals, unit, measured)})


@pytest.fixture(scope="module")
def paper() -> str:
    return PAPER.read_text()


@pytest.fixture(scope="module")
def measured() -> dict:
    """Each measured value rounded to 0-4 decimals, as is and as a percentage."""
    values = _measured_numbers()
    return {
        "exact integers": {v for v in values if v.is_integer()},
        "": {d: {round(v, d) for v in values} for d in range(5)},
        "%": {d: {round(100 * v, d) for v in values} | {round(v, d) for v in values}
              for d in range(5)},
    }


def _was_measured(value: float, decimals: int, unit: str, measured: dict) -> bool:
    """A plain integer must be measured exactly (a count, a size); a decimal,
    a ratio or a percentage to the precision it is quoted with."""
    if decimals == 0 and not unit:
        return value in measured["exact integers"]
    pool = measured["%" if unit == "%" else ""]
    return round(value, decimals) in pool[min(decimals, 4)]


def test_every_number_in_the_paper_is_in_a_results_file(paper, measured):
    missing = _unmeasured(paper, measured)
    assert not missing, (
        f"numbers quoted in paper/paper.md that no benchmarks/results/*.json contains: "
        f"{missing}; rerun the benchmark that measures them (python benchmarks/run_all.py) "
        "or correct the text")


def test_every_number_in_the_readme_performance_section_is_in_a_results_file(measured):
    readme = (ROOT / "README.md").read_text()
    match = re.search(r"^## Performance\n(.*?)(?=^## |\Z)", readme, flags=re.S | re.M)
    assert match, "README.md has no '## Performance' section"
    missing = _unmeasured(match[1], measured)
    assert not missing, (
        f"numbers in README.md's Performance section that no results file contains: {missing}")
    assert "paper/paper.md" in match[1], "the Performance section should link the paper"


def test_the_number_check_can_fail(measured):
    """The check above rejects numbers that were never measured, and reads
    only the prose."""
    assert not _was_measured(123456.789, 3, "", measured)
    assert not _was_measured(987654321.0, 0, "", measured)
    quoted = [q for *_, q in _quoted_numbers("ratio 1.25x, 40 % of it, see Figure 2, "
                                             "`n = 7`, $c = 9$ [@griewank2000]")]
    assert quoted == ["1.25x", "40 %"]


def test_every_figure_exists_and_names_the_command_that_made_it(paper):
    figures = list(FIGURE.finditer(paper))
    assert figures, "the paper shows no figure"
    for figure in figures:
        path = (PAPER.parent / figure["path"]).resolve()
        assert path.is_file(), f"paper/paper.md links {figure['path']}, which does not exist"
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
        assert path.parent == RESULTS.resolve(), f"{path}: figures come from benchmarks/results/"
        assert re.search(r"`python benchmarks/\w+\.py[^`]*`", figure["caption"]), (
            f"the caption of {figure['path']} does not name the command that made it")


def test_every_citation_is_in_the_bibliography(paper):
    keys = set(re.findall(r"@(?:\w+)\{([^,\s]+),", BIB.read_text()))
    cited = set(re.findall(r"\[?-?@([\w:.-]*\w)", _strip_front_matter(paper)))
    cited -= {"fig"}
    assert cited, "the paper cites nothing"
    assert not cited - keys, f"cited but not in paper/paper.bib: {sorted(cited - keys)}"

