"""The paper and the README quote only what the
benchmarks measured, and every quoted number says where it was measured.

Every measured number in ``paper/paper.md`` and in README.md carries its source in an HTML comment written
right after it (no space between), which renders invisibly::

    0.964x<!-- bench_seismic.json#/ratios/revolve -->
    12.5x<!-- bench_schedules.json#/rows/0/peer_s / #/rows/0/ours_s -->
    0.86x<!-- external: an independent measurement at 256^2, n = 10^4 ... -->

A source is one of:

``FILE#POINTER``
    ``FILE`` is a results file in ``benchmarks/results/``; ``POINTER`` is a
    JSON pointer (RFC 6901: ``/``-separated keys and list indices, ``~1``
    for a ``/`` and ``~0`` for a ``~`` inside a key).  If the value there is
    a number, the quoted number must equal it rounded to the precision
    quoted (``0.96x`` matches 0.9637, not 0.9651).  If it is a string (a
    benchmark's own summary line), one number written in that string must.
``REF / REF``
    a derived ratio: the first value divided by the second (a ``/`` with a
    space on each side).  The second ``REF`` may be written ``#POINTER``
    alone, meaning the same file as the first.
``REF in UNIT``
    a size in bytes quoted in ``KiB``, ``MiB``, ``GiB`` (powers of 1024)
    or ``kB``, ``MB``, ``GB`` (powers of 1000): ``128<!-- bench_tiers.json
    #/capture/4/bytes in MiB --> MiB``.
``external: DESCRIPTION``
    a number that no results file holds, measured elsewhere; the
    description (at least five words) must say what was measured and how.
``target: DESCRIPTION``
    a goal a benchmark was measured against (``within 2x``), not a
    measurement; the description names the benchmark.
``given: DESCRIPTION``
    a setting or a count the text states, not a measurement (the demo's
    grid, a convergence rate a test demands); the description says what it
    is.

A percentage (``9.9%``) matches a value that is either that percentage or
the fraction (0.099).  A ratio (``0.44x``) matches its value as it is.

Numbers that are not measured values need no source: formulas (``$...$``),
code spans, citations, links, figure / table / section / equation numbers,
dotted version numbers (``1.0.4``), list markers (``(1)``), ``case N`` and the front matter (title, date).  A
quoted number with no source fails the test; so does a source whose file or
key is missing or whose value does not round to the number quoted.

Also checked: every figure ``paper/paper.md`` links exists, is a PNG written
by ``benchmarks/``, and its caption names the command that made it; every
citation key is in ``paper/paper.bib``.
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAPER = ROOT / "paper" / "paper.md"
BIB = ROOT / "paper" / "paper.bib"
RESULTS = ROOT / "benchmarks" / "results"

#: A placeholder for the i-th HTML comment of a text: a NUL then one
#: private-use character, so it holds no digit and no word character.
_MARK = "\x00"
#: A number, with thousands separators, decimals and a unit: ``%`` (after an
#: optional space) or ``x`` / ``×`` right after it; not part of a word, a
#: power (``10^4``), a path, a version (``1.0.4``) or a range (``2-3`` is
#: two numbers only when written with spaces).
NUMBER = re.compile(
    r"(?<![\w.^/-])(?P<whole>\d{1,3}(?:,\d{3})+|\d+)(?P<frac>\.\d+)?(?P<exp>e[-+]?\d+)?(?!\.\d)"
    r"(?:(?P<unit>x\b|×)|\s?(?P<pct>%))?(?![\w^])"
    r"(?:" + _MARK + r"(?P<comment>.))?"
)
FIGURE = re.compile(r"!\[(?P<caption>(?:[^\[\]]|\[[^\]]*\])*)\]\((?P<path>[^)\s]+)\)")
LABELLED = re.compile(r"\b(?:Figure|Fig\.|Table|Section|Eq\.|Equation|case)\s+\d+|\(\d\)")
UNITS = {"KiB": 2.0**10, "MiB": 2.0**20, "GiB": 2.0**30, "kB": 1e3, "MB": 1e6, "GB": 1e9}
COMMENT = re.compile(r"<!--(.*?)-->", re.S)


def _strip_front_matter(text: str) -> str:
    if text.startswith("---"):
        return text.split("\n---", 1)[1]
    return text


def _mask_comments(text: str) -> tuple[str, list[str]]:
    """Replace each ``<!-- ... -->`` by a two-character mark; the comments."""
    comments: list[str] = []

    def mark(match):
        comments.append(match[1].strip())
        return _MARK + chr(0xE000 + len(comments) - 1)

    return COMMENT.sub(mark, text), comments


def _body(text: str) -> str:
    """The prose: no front matter, code, math, citations, links or labels
    (comments are already masked, so the numbers they hold are not prose)."""
    text = _strip_front_matter(text)
    text = re.sub(r"```.*?```", " ", text, flags=re.S)
    text = re.sub(r"\$\$.*?\$\$", " ", text, flags=re.S)
    text = re.sub(r"\$[^$\n]+\$", " ", text)
    text = re.sub(r"`(?:[^`\n]|\n(?!\n))+`", " ", text)  # a code span may wrap a line
    text = re.sub(r"\[-?@[^\]]+\]", " ", text)
    text = re.sub(r"@[\w:.-]+", " ", text)
    text = re.sub(r"\]\([^)]*\)", "]", text)
    text = re.sub(r"\{#[^}]*\}", " ", text)
    text = re.sub(r"https?://\S+", " ", text)
    return LABELLED.sub(" ", text)


@dataclass
class Quote:
    """One number as the text quotes it, and the source written after it."""

    text: str  # as written, e.g. "0.964x"
    value: float
    decimals: int
    percent: bool
    source: str | None
    context: str  # the words around it, for the error message


def quoted_numbers(text: str) -> list[Quote]:
    masked, comments = _mask_comments(text)
    body = _body(masked)
    quotes = []
    for match in NUMBER.finditer(body):
        frac = match["frac"] or ""
        comment = match["comment"]
        source = comments[ord(comment) - 0xE000] if comment else None
        written = match.group(0).split(_MARK)[0].strip()
        start, stop = max(0, match.start() - 50), match.end() + 20
        context = re.sub(rf"{_MARK}.", "", body[start:stop]).replace("\n", " ")
        exp = int(match["exp"][1:]) if match["exp"] else 0  # 2.1e-4: two digits, 10^-4
        quotes.append(
            Quote(
                written,
                float(match["whole"].replace(",", "") + frac) * 10.0**exp,
                max(len(frac) - 1, 0) - exp,
                bool(match["pct"]),
                source,
                context,
            )
        )
    return quotes


class SourceError(ValueError):
    """A source that cannot be read, or that does not hold the number."""


_FILES: dict[str, object] = {}


def _load(name: str):
    if name not in _FILES:
        if not re.fullmatch(r"[\w.-]+\.json", name):
            raise SourceError(f"{name!r} is not the name of a results file (bench_<name>.json)")
        path = RESULTS / name
        if not path.is_file():
            raise SourceError(f"benchmarks/results/{name} does not exist")
        _FILES[name] = json.loads(path.read_text())
    return _FILES[name]


def resolve(name: str, pointer: str):
    """The value at JSON pointer `pointer` (RFC 6901) of results file `name`."""
    if pointer and not pointer.startswith("/"):
        raise SourceError(f"JSON pointer {pointer!r} must start with '/'")
    node = _load(name)
    for raw in pointer.split("/")[1:]:
        key = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and key in node:
            node = node[key]
        elif isinstance(node, list) and re.fullmatch(r"0|[1-9]\d*", key) and int(key) < len(node):
            node = node[int(key)]
        else:
            raise SourceError(f"{name}#{pointer}: no key {key!r} there")
    return node


def _reference(ref: str, default_file: str | None) -> tuple[str, str]:
    file, hash_, pointer = ref.partition("#")
    if not hash_:
        raise SourceError(f"{ref!r} is not FILE#POINTER")
    file = file.strip() or default_file
    if not file:
        raise SourceError(f"{ref!r} names no results file")
    return file, pointer.strip()


def source_values(source: str) -> list[float]:
    """The values a source offers for a quoted number (several if it points
    at a string that writes several numbers)."""
    source, _, unit = source.partition(" in ")
    if unit and unit.strip() not in UNITS:
        raise SourceError(f"{source!r}: unit {unit.strip()!r} is not one of {sorted(UNITS)}")
    scale = UNITS[unit.strip()] if unit else 1.0
    refs = re.split(r"\s/\s", source)
    if len(refs) > 2:
        raise SourceError(f"{source!r}: a source is one value or a ratio of two")
    file, pointer = _reference(refs[0], None)
    values = []
    for part in [resolve(file, pointer)] + [resolve(*_reference(r, file)) for r in refs[1:]]:
        if isinstance(part, bool) or not isinstance(part, (int, float, str)):
            raise SourceError(f"{source!r} points at {type(part).__name__}, not a number")
        values.append(part)
    if len(values) == 2:
        if not all(isinstance(v, (int, float)) for v in values) or not values[1]:
            raise SourceError(f"{source!r}: a ratio needs two numbers, the second not zero")
        return [values[0] / values[1] / scale]
    if isinstance(values[0], str):
        return [
            float(s.replace(",", ""))
            for s in re.findall(r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?", values[0])
        ]
    return [float(values[0]) / scale]


def _rounds_to(value: float, quote: Quote) -> bool:
    half = 0.5 * 10.0**-quote.decimals
    candidates = [value, 100.0 * value] if quote.percent else [value]
    return any(abs(v - quote.value) <= half * (1 + 1e-9) for v in candidates)


def problems(text: str) -> list[str]:
    """Every quoted number of `text` that has no source, a source that
    cannot be read, or a source that does not hold it."""
    found = []
    for quote in quoted_numbers(text):
        where = f"{quote.text!r} in '...{quote.context}...'"
        if quote.source is None:
            found.append(
                f"{where}: no source; write <!-- bench_<name>.json#/json/pointer --> right after it"
            )
            continue
        kind, colon, description = quote.source.partition(":")
        if colon and kind.strip() in ("external", "target", "given"):
            if len(description.split()) < 5:
                found.append(
                    f"{where}: '{kind.strip()}:' needs a description of at least "
                    "five words (what, where, how)"
                )
            continue
        try:
            values = source_values(quote.source)
        except SourceError as error:
            found.append(f"{where}: {error}")
            continue
        if not any(_rounds_to(v, quote) for v in values):
            shown = ", ".join(f"{v:.6g}" for v in values[:5])
            found.append(f"{where}: the source <!-- {quote.source} --> holds {shown}")
    return found


def _performance_section() -> str:
    readme = (ROOT / "README.md").read_text()
    match = re.search(r"^## Performance\n(.*?)(?=^## |\Z)", readme, flags=re.S | re.M)
    assert match, "README.md has no '## Performance' section"
    return match[1]


@pytest.fixture(scope="module")
def paper() -> str:
    return PAPER.read_text()


def test_every_number_in_the_paper_names_its_source_and_matches_it(paper):
    assert len(quoted_numbers(paper)) > 100, "the paper should quote its measurements"
    found = problems(paper)
    assert not found, (
        "paper/paper.md:\n  "
        + "\n  ".join(found)
        + "\n(correct the text to what the results file says, or rerun the "
        "benchmark with python benchmarks/run_all.py --update-results)"
    )


def test_every_number_in_the_readme_names_its_source():
    readme = (ROOT / "README.md").read_text()
    assert len(quoted_numbers(_performance_section())) > 10
    found = problems(readme)
    assert not found, "README.md:\n  " + "\n  ".join(found)
    assert "paper/paper.md" in _performance_section(), (
        "the Performance section should link the paper"
    )


# The check itself: it must fail on a changed digit, a wrong path, a missing
# source, and read only the prose.  Its results files are written here, so a
# new benchmark run does not change what these tests expect.

FAKE = {
    "bench_seismic.json": {
        "methods": {"vlcc Revolve (c=32)": {"ratio_to_peer_paired": 0.9637}},
        "problem": {"snapshots": 32, "steps": 2000},
    },
    "bench_overlap.json": {
        "backward": {"stall_on_over_off": 0.6023},
        "forward": {
            "hidden_external": 0.44,
            "medians": {"async": {"total_s": 0.58}, "sync": {"total_s": 0.79}},
        },
    },
    "bench_tiers.json": {"capture": [{}, {}, {}, {}, {"bytes": 128 * 2**20}]},
}


@pytest.fixture(autouse=True)
def _results(request, tmp_path, monkeypatch):
    """The self-tests below read FAKE; the tests of the paper and README the real files."""
    if not request.node.name.startswith(SELF_TESTS):
        return
    for name, content in FAKE.items():
        (tmp_path / name).write_text(json.dumps(content))
    monkeypatch.setattr(sys.modules[__name__], "RESULTS", tmp_path)
    monkeypatch.setattr(sys.modules[__name__], "_FILES", {})


SELF_TESTS = ("test_the_self_test", "test_a_", "test_external_", "test_numbers_that")

GOOD = (
    "ours takes 0.964x<!-- bench_seismic.json#/methods/vlcc Revolve (c=32)/"
    "ratio_to_peer_paired --> the time of pyrevolve, with 32<!-- bench_seismic.json"
    "#/problem/snapshots --> snapshots"
)


def test_the_self_test_text_passes():
    assert problems(GOOD) == []
    assert [q.text for q in quoted_numbers(GOOD)] == ["0.964x", "32"]


def test_a_changed_digit_fails():
    for bad in (
        GOOD.replace("0.964x", "0.965x"),
        GOOD.replace("0.964x", "0.97x"),
        GOOD.replace("with 32", "with 33"),
    ):
        found = problems(bad)
        assert len(found) == 1 and "holds" in found[0], found


def test_a_rounding_to_the_quoted_precision_passes():
    assert problems(GOOD.replace("0.964x", "0.96x")) == []


def test_a_wrong_path_fails():
    for bad, said in (
        (GOOD.replace("/problem/snapshots", "/problem/snapshot"), "no key 'snapshot'"),
        (
            GOOD.replace("bench_seismic.json#/problem", "bench_nonesuch.json#/problem"),
            "does not exist",
        ),
        (GOOD.replace("#/problem/snapshots", "#problem/snapshots"), "must start with"),
        (GOOD.replace("#/problem/snapshots", "#/problem"), "points at dict"),
        (GOOD.replace("#/problem/snapshots", "#/problem/steps"), "holds 2000"),
    ):
        found = problems(bad)
        assert len(found) == 1 and said in found[0], found


def test_a_number_without_a_source_fails():
    found = problems(GOOD.replace("<!-- bench_seismic.json#/problem/snapshots -->", ""))
    assert len(found) == 1 and "'32'" in found[0] and "no source" in found[0]
    found = problems("the stall fell to 0.60x.")
    assert len(found) == 1 and "no source" in found[0]


def test_a_source_must_follow_the_number_directly():
    text = "0.60x <!-- bench_overlap.json#/backward/stall_on_over_off -->"
    assert problems(text.replace("x <", "x<")) == []
    assert "no source" in problems(text)[0]


def test_a_ratio_of_two_values_and_a_percentage():
    ratio = (
        "0.73x<!-- bench_overlap.json#/forward/medians/async/total_s / "
        "#/forward/medians/sync/total_s -->"
    )
    assert problems(ratio) == []
    assert problems(ratio.replace("0.73x", "0.74x"))
    assert problems(ratio.replace("sync/total_s", "sync/total")), "a wrong second path fails"
    percent = "44%<!-- bench_overlap.json#/forward/hidden_external -->"
    assert problems(percent) == [] and problems(percent.replace("44%", "45%"))
    size = "128<!-- bench_tiers.json#/capture/4/bytes in MiB --> MiB"
    assert problems(size) == [] and problems(size.replace("128<", "134<"))
    assert "not one of" in problems(size.replace("in MiB", "in MeB"))[0]


def test_the_paper_itself_fails_on_a_changed_digit_a_wrong_path_or_a_lost_source(paper):
    """The same three faults, made in the real paper, one at a time, on its
    first ratio with three decimals and a source."""
    match = re.search(r"(\d\.\d\d)(\d)x<!-- (bench_\w+\.json#/)([^>]*?)-->", paper)
    assert match and not problems(paper)
    number = match[1] + match[2] + "x"
    other = match[1] + str((int(match[2]) + 5) % 10) + "x"
    changed = paper.replace(match[0], match[0].replace(number, other, 1), 1)
    assert [p for p in problems(changed) if f"'{other}'" in p and "holds" in p]
    wrong = paper.replace(match[0], match[0].replace(match[3], match[3] + "nonesuch/", 1), 1)
    assert [p for p in problems(wrong) if f"'{number}'" in p and "no key" in p]
    lost = paper.replace(match[0], number, 1)
    assert [p for p in problems(lost) if f"'{number}'" in p and "no source" in p]
    assert len(problems(changed)) == len(problems(wrong)) == len(problems(lost)) == 1


def test_external_and_target_need_a_description():
    assert problems("0.86x<!-- external: an independent run at another size -->") == []
    assert "five words" in problems("0.86x<!-- external: elsewhere -->")[0]
    assert "five words" in problems("2x<!-- target: -->")[0]
    assert problems("a 300<!-- given: the demo's default grid size --> grid") == []
    assert "five words" in problems("a 300<!-- given: grid --> grid")[0]
    assert "not FILE#POINTER" in problems("0.86x<!-- measured somewhere -->")[0]


def test_numbers_that_are_not_measurements_need_no_source():
    text = (
        "see Figure 2 and Table 1, `n = 7`, $c = 9$, $$t(n, c) = 5$$ [@griewank2000], "
        "version 1.0.4, [a link](https://example.org/3), <!-- a comment with 12 -->"
    )
    assert quoted_numbers(text) == []
    assert quoted_numbers("run `mpiexec -n 4\npython x.py` there") == []  # a wrapped code span
    assert [q.text for q in quoted_numbers("`a`\n\n3 of `b`")] == ["3"]  # not across paragraphs
    assert [q.text for q in quoted_numbers("ratio 1.25x, 40 % of it, 10^4 steps")] == [
        "1.25x",
        "40 %",
    ]


def test_a_number_in_scientific_notation_is_checked_to_its_digits():
    text = "an error of 2.1e-4<!-- bench_overlap.json#/forward/error -->"
    FAKE_ERROR = {"forward": {"error": 2.14e-4}}
    assert [(q.text, q.value) for q in quoted_numbers(text)] == [("2.1e-4", 2.1e-4)]
    found = problems(text)  # the fake file has no such key yet
    assert found and "no key" in found[0]
    (RESULTS / "bench_overlap.json").write_text(json.dumps(FAKE_ERROR))
    _FILES.clear()
    assert problems(text) == []
    assert problems(text.replace("2.1e-4", "2.2e-4")) and problems(text.replace("e-4", "e-5"))


def test_every_figure_exists_and_names_the_command_that_made_it(paper):
    figures = list(FIGURE.finditer(paper))
    assert figures, "the paper shows no figure"
    for figure in figures:
        path = (PAPER.parent / figure["path"]).resolve()
        assert path.is_file(), f"paper/paper.md links {figure['path']}, which does not exist"
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
        assert path.parent == RESULTS.resolve(), f"{path}: figures come from benchmarks/results/"
        assert re.search(r"`python benchmarks/\w+\.py[^`]*`", figure["caption"]), (
            f"the caption of {figure['path']} does not name the command that made it"
        )


def test_every_citation_is_in_the_bibliography(paper):
    keys = set(re.findall(r"@(?:\w+)\{([^,\s]+),", BIB.read_text()))
    cited = set(re.findall(r"\[?-?@([\w:.-]*\w)", COMMENT.sub(" ", _strip_front_matter(paper))))
    cited -= {"fig"}
    assert cited, "the paper cites nothing"
    assert not cited - keys, f"cited but not in paper/paper.bib: {sorted(cited - keys)}"
