"""The paper and the README quote only what the benchmarks measured, every
quoted number says where it was measured, and every sentence that states a
result says what its claim record says.

Every measured number in ``paper/paper.md`` and in README.md carries its source in an HTML comment written
right after it (no space between), which renders invisibly::

    0.857x<!-- claim: bench_seismic.json#equal_snapshots -->
    52.0x<!-- claim: bench_schedules.json#revolve_generation min --> to 131.5x<!-- claim: ... max -->
    12.5x<!-- bench_schedules.json#rows/0/peer_s / #/rows/0/ours_s -->

A source is one of:

``claim: FILE#ID [PART]``
    the claim record ``ID`` of results file ``FILE`` (its ``"claims"``; the
    schema and the evaluation are in ``benchmarks/claims.py``).  ``PART`` is
    nothing (the claim's value), ``min`` or ``max`` (the extremes of the set a
    range quotes; a clause that quotes one quotes the other), ``goal`` (the
    goal's bound; the clause must say met or missed) or the name of one input.
    The number must be the value rounded to the precision quoted, in the
    claim's unit: a ``fraction`` is quoted as a percentage (0.51 is 51%, never
    0.51%), a ratio ``x`` with an x.
``FILE#POINTER``
    ``FILE`` is a results file in ``benchmarks/results/``; ``POINTER`` is a
    JSON pointer (RFC 6901: ``/``-separated keys and list indices, ``~1``
    for a ``/`` and ``~0`` for a ``~`` inside a key).  If the value there is
    a number, the quoted number must equal it rounded to the precision
    quoted (``0.96x`` matches 0.9637, not 0.9651); a percentage quotes a
    fraction (``9.9%`` matches 0.099).  If it is a string (a benchmark's own
    summary line), one number written in that string must.
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
    description (at least five words) must say what was measured and how,
    and cite where (``[@key]`` of ``paper/paper.bib`` or a https address).
``given: DESCRIPTION``
    a setting or a count the text states, not a measurement (the demo's
    grid, a convergence rate a test demands); the description says what it
    is.

A goal is never written in the text alone (``target:`` is refused): it is
part of a claim record, whose verdict (met or missed) is computed.

**Meaning.** The text is cut into clauses (at the end of a sentence, a
semicolon, a table cell, a list item).  In a clause that quotes a claim:
a direction word (faster, cheaper, beats / slower, costlier) must agree with
the claim's comparison at every point of its set; a size word (less, lower,
below, fewer / more, higher, above, longer) with the side of even (one for a
ratio) the value is on; met / missed with the goal's verdict.  A clause that
uses such a word or names a goal or target, and quotes a ratio or a
percentage, must quote a claim.  The paper's list of missed targets must
quote every claim whose verdict is missed.

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
sys.path.insert(0, str(ROOT / "benchmarks"))
import claims  # noqa: E402  (benchmarks/claims.py: the claim records and their verdicts)

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
    start: int = 0  # where it stands in the prose (see `prose`)
    unit: str = ""  # "x", "%" or ""


def prose(text: str) -> str:
    """The prose the numbers are read from (comments masked)."""
    return _body(_mask_comments(text)[0])


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
                match.start(),
                "%" if match["pct"] else "x" if match["unit"] else "",
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
            Written(s.replace(",", ""))
            for s in re.findall(r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?", values[0])
        ]
    return [float(values[0]) / scale]


class Written(float):
    """A number as a benchmark's summary line writes it (a percentage there
    is already in percent)."""


def _rounds_to(value: float, quote: Quote) -> bool:
    """`quote` is `value` rounded; a percentage quotes a fraction (0.099 is
    9.9%), unless the value is written in a summary line as it is quoted."""
    if quote.percent and not isinstance(value, Written):
        value = 100.0 * value
    return _rounds_exactly(value, quote)


def _rounds_exactly(value: float, quote: Quote) -> bool:
    half = 0.5 * 10.0**-quote.decimals
    return abs(value - quote.value) <= half * (1 + 1e-9)


#: ``claim: FILE#ID`` and what of it the number quotes: nothing (its value),
#: ``min`` / ``max`` (the extremes of its set), ``goal`` or an input's name.
CLAIM = re.compile(r"claim:\s*(?P<file>[\w.-]+\.json)#(?P<id>\w+)(?:\s+(?P<part>\w+))?\s*$")
#: Words that say which side of a comparison ours is on (direction), which
#: side of even the value is (size), and whether a goal was met (verdict).
BETTER = {"faster", "cheaper", "beats", "beat", "quicker", "outperforms"}
WORSE = {"slower", "costlier", "behind", "trails"}
LESS = {"less", "fewer", "lower", "below", "smaller", "shorter"}
MORE = {"more", "higher", "above", "larger", "longer"}
MET = {"met", "meets", "meeting"}
MISSED = {"missed", "misses", "missing"}
#: A clause with one of these words and a ratio or percentage states a result.
RESULT_WORDS = BETTER | WORSE | LESS | MORE | MET | MISSED | {"goal", "goals", "target", "targets"}
#: Clause boundaries: the end of a sentence, a semicolon, a table cell, a
#: paragraph, a list item.
CLAUSE = re.compile(r"(?<=[.;!?])\s|\||\n\s*\n|\n\s*[-*] ")


def _claim_of(source: str) -> tuple[claims.Claim, str | None]:
    match = CLAIM.match(source)
    if not match:
        raise SourceError(
            f"{source!r} is not 'claim: FILE#ID' with an optional min, max, goal or input name"
        )
    try:
        return claims.claim(match["file"], match["id"], RESULTS), match["part"]
    except claims.ClaimError as error:
        raise SourceError(str(error)) from None


def _claim_problem(quote: Quote, record: claims.Claim, part: str | None) -> str | None:
    """What is wrong with `quote` as a quotation of `record` (its `part`)."""
    unit = record.unit
    if part is None:
        if len(record.values) != 1:
            return f"{record.name} is a range over {record.set_name}: quote its min and max"
        value = record.value
    elif part in ("min", "max"):
        if len(record.values) == 1:
            return f"{record.name} is one value, not a range"
        value = record.low if part == "min" else record.high
    elif part == "goal":
        if record.goal is None:
            return f"{record.name} has no goal"
        value = record.goal_value()
        low, high = record.bounds
        if "between" in record.goal and quote.percent and abs((low + high) / 2 - 1) < 1e-9:
            value, unit = (high - low) / 2, "fraction"  # "within 20%" of a prediction
    else:
        names = set(record.inputs[0])
        if part not in names or len(record.inputs) != 1:
            return f"{record.name} has no single input {part!r} (inputs: {sorted(names)})"
        value, unit = record.inputs[0][part], "raw"
    if unit == "fraction":
        if not quote.percent:
            return f"{record.name} is a fraction: quote it as a percentage ({100 * value:.3g}%)"
        ok = _rounds_exactly(100.0 * value, quote)
    elif unit == "percent":
        ok = quote.percent and _rounds_exactly(value, quote)
        if not quote.percent:
            return f"{record.name} is in percent: write the % sign"
    elif unit == "x":
        if quote.unit != "x":
            return f"{record.name} is a ratio: write it with an x ({value:.4g}x)"
        ok = _rounds_exactly(value, quote)
    else:
        if quote.unit:
            return f"{record.name} is in {unit}, not a ratio or a percentage"
        ok = _rounds_exactly(value, quote)
    if not ok:
        return f"{record.name}{' ' + part if part else ''} is {value:.6g} ({record.says})"
    return None


def _citation_problem(description: str) -> str | None:
    keys = set(re.findall(r"@([\w:.-]*\w)", description))
    known = set(re.findall(r"@(?:\w+)\{([^,\s]+),", BIB.read_text()))
    if not keys and "https://" not in description:
        return "a source outside the results files needs a citation ([@key] or a https:// address)"
    if keys - known:
        return f"cites {sorted(keys - known)}, not in paper/paper.bib"
    return None


def problems(text: str) -> list[str]:
    """Every quoted number of `text` that has no source, a source that
    cannot be read, or a source that does not hold it; and every clause
    whose words say what its claim records contradict."""
    found = []
    quoted: list[tuple[Quote, claims.Claim, str | None]] = []
    results_without_claim: list[Quote] = []
    for quote in quoted_numbers(text):
        where = f"{quote.text!r} in '...{quote.context}...'"
        if quote.source is None:
            found.append(
                f"{where}: no source; write <!-- bench_<name>.json#/json/pointer --> right after it"
            )
            continue
        kind, colon, description = quote.source.partition(":")
        kind = kind.strip()
        if colon and kind == "claim":
            try:
                record, part = _claim_of(quote.source)
            except SourceError as error:
                found.append(f"{where}: {error}")
                continue
            problem = _claim_problem(quote, record, part)
            if problem:
                found.append(f"{where}: {problem}")
            quoted.append((quote, record, part))
            continue
        if colon and kind == "target":
            found.append(
                f"{where}: a goal lives in a claim record of the results file, not in the "
                "text: write <!-- claim: bench_<name>.json#ID goal -->"
            )
            continue
        if colon and kind in ("external", "given"):
            if len(description.split()) < 5:
                found.append(
                    f"{where}: '{kind}:' needs a description of at least "
                    "five words (what, where, how)"
                )
            elif kind == "external" and (problem := _citation_problem(description)):
                found.append(f"{where}: {problem}")
            continue
        try:
            values = source_values(quote.source)
        except SourceError as error:
            found.append(f"{where}: {error}")
            continue
        if not any(_rounds_to(v, quote) for v in values):
            shown = ", ".join(f"{v:.6g}" for v in values[:5])
            found.append(f"{where}: the source <!-- {quote.source} --> holds {shown}")
        elif quote.unit:
            results_without_claim.append(quote)
    return found + _meaning_problems(prose(text), quoted, results_without_claim)


def clauses(body: str) -> list[tuple[int, int]]:
    """The clauses of `body` as (start, stop) offsets."""
    cuts = [0] + [m.end() for m in CLAUSE.finditer(body)] + [len(body)]
    return [(a, b) for a, b in zip(cuts, cuts[1:]) if b > a]


def _words(clause: str) -> set[str]:
    return set(re.findall(r"[a-z]+", re.sub(rf"{_MARK}.", " ", clause).lower()))


def _meaning_problems(
    body: str,
    quoted: list[tuple[Quote, claims.Claim, str | None]],
    unclaimed: list[Quote],
) -> list[str]:
    """The direction words, the verdicts and the ranges of each clause
    against the claims it quotes; a result stated without a claim."""
    found = []
    for start, stop in clauses(body):
        inside = [(q, c, p) for q, c, p in quoted if start <= q.start < stop]
        words = _words(body[start:stop])
        shown = re.sub(rf"{_MARK}.", "", body[start:stop]).strip().replace("\n", " ")[:160]
        where = f"'{shown}'"
        if not inside:
            bare = [q for q in unclaimed if start <= q.start < stop]
            if bare and words & RESULT_WORDS:
                found.append(
                    f"{where}: states a result ({', '.join(sorted(words & RESULT_WORDS))}) "
                    f"with {bare[0].text} but names no claim record; write "
                    "<!-- claim: bench_<name>.json#ID --> after the number"
                )
            continue
        records = {c.name: c for _, c, _ in inside}
        for record in records.values():
            direction = record.direction()
            if direction is not None:
                said_better, said_worse = words & BETTER, words & WORSE
                if said_better and direction != "better":
                    found.append(
                        f"{where}: says {sorted(said_better)[0]!r}, but {record.name} is "
                        f"{direction} for ours ({record.says})"
                    )
                if said_worse and direction != "worse":
                    found.append(
                        f"{where}: says {sorted(said_worse)[0]!r}, but {record.name} is "
                        f"{direction} for ours ({record.says})"
                    )
                even = float(
                    record.comparison.get("even", 1.0 if record.unit == "x" else 0.0)
                    if record.comparison
                    else 1.0
                )
                if words & LESS and not all(v < even for v in record.values):
                    found.append(
                        f"{where}: says {sorted(words & LESS)[0]!r}, but {record.name} "
                        f"is not below {even:g} everywhere ({record.says})"
                    )
                if words & MORE and not all(v > even for v in record.values):
                    found.append(
                        f"{where}: says {sorted(words & MORE)[0]!r}, but {record.name} "
                        f"is not above {even:g} everywhere ({record.says})"
                    )
            verdict = record.verdict()
            if verdict is not None:
                if words & MET and words & MISSED:
                    found.append(f"{where}: says both met and missed; give each its clause")
                elif words & MET and verdict != "met":
                    found.append(f"{where}: says met, but {record.name} missed its goal")
                elif words & MISSED and verdict != "missed":
                    found.append(f"{where}: says missed, but {record.name} met its goal")
                elif not words & (MET | MISSED) and any(
                    c is record and p == "goal" for _, c, p in inside
                ):
                    found.append(
                        f"{where}: quotes the goal of {record.name} without saying whether "
                        f"it was met ({verdict})"
                    )
        parts = {(c.name, p) for _, c, p in inside}
        for name, part in parts:
            other = {"min": "max", "max": "min"}.get(part or "")
            if other and (name, other) not in parts:
                found.append(
                    f"{where}: quotes the {part} of {name} without its {other}: a range is "
                    f"quoted by the extremes of {records[name].set_name}"
                )
    return found


def missed_problems(section: str) -> list[str]:
    """Every claim of the results files whose goal was missed must be
    quoted in `section` (the paper's list of missed targets)."""
    named = {
        f"{m['file']}#{m['id']}"
        for q in quoted_numbers(section)
        if q.source and (m := CLAIM.match(q.source))
    }
    return [
        f"{c.name} missed its goal ({c.says}) but the list of missed targets does not quote it"
        for c in claims.all_claims(RESULTS)
        if c.verdict() == "missed" and c.name not in named
    ]


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


def _missed_section(paper: str) -> str:
    match = re.search(r"^# Limitations and missed targets\n(.*?)(?=^# |\Z)", paper, re.S | re.M)
    assert match, "paper/paper.md has no '# Limitations and missed targets' section"
    return match[1]


def test_the_list_of_missed_targets_is_complete(paper):
    found = missed_problems(_missed_section(paper))
    assert not found, "paper/paper.md:\n  " + "\n  ".join(found)


def test_every_claim_record_reads():
    records = claims.all_claims(RESULTS)
    assert len(records) > 40
    assert {c.verdict() for c in records} >= {"met", "missed"}


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
    claims.forget()


SELF_TESTS = (
    "test_the_self_test",
    "test_a_",
    "test_external_",
    "test_numbers_that",
    "test_claims_",
)

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
    cited = "0.86x<!-- external: an independent run at another size [@mohan2021] -->"
    assert problems(cited) == []
    assert "citation" in problems(cited.replace(" [@mohan2021]", ""))[0]
    assert "not in paper/paper.bib" in problems(cited.replace("mohan2021", "nonesuch2099"))[0]
    assert "five words" in problems("0.86x<!-- external: elsewhere -->")[0]
    assert (
        "claim record" in problems("2x<!-- target: the executor's goal, twice a bare loop -->")[0]
    )
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


# The meaning of a sentence against its claim record: each mutation the
# digit check let pass (issue 31) fails.  The records are written here, in
# the fake results files, so that they pin the check, not today's numbers.

CLAIMED = {
    "bench_torch.json": {
        "a": {
            "rows": [
                {"name": "ours M=504", "extra": 0.130},
                {"name": "reentrant M=504", "extra": 0.149},
                {"name": "non-reentrant M=504", "extra": 0.463},
                {"name": "ours M=210", "extra": 0.174},
                {"name": "reentrant M=210", "extra": 0.162},
                {"name": "non-reentrant M=210", "extra": 0.492},
            ]
        },
        "claims": {
            "vs_reentrant": {
                "says": "the reentrant mode's recomputation time over ours",
                "set": {
                    "name": "the two equal-memory points",
                    "of": [
                        {"ours": "/a/rows/0/extra", "peer": "/a/rows/1/extra"},
                        {"ours": "/a/rows/3/extra", "peer": "/a/rows/4/extra"},
                    ],
                },
                "formula": "peer / ours",
                "unit": "x",
                "comparison": {"ours": "Revolve", "peer": "reentrant", "better": "higher"},
            },
            "vs_nonreentrant": {
                "says": "the non-reentrant mode's recomputation time over ours",
                "set": {
                    "name": "the two equal-memory points",
                    "of": [
                        {"ours": "/a/rows/0/extra", "peer": "/a/rows/2/extra"},
                        {"ours": "/a/rows/3/extra", "peer": "/a/rows/5/extra"},
                    ],
                },
                "formula": "peer / ours",
                "unit": "x",
                "comparison": {"ours": "Revolve", "peer": "non-reentrant", "better": "higher"},
            },
        },
    },
    "bench_executor.json": {
        "summary": {"ours_s": 3.369, "bare_s": 1.673},
        "claims": {
            "overhead": {
                "says": "run_adjoint over a bare loop",
                "of": {"ours": "/summary/ours_s", "peer": "/summary/bare_s"},
                "formula": "ours / peer",
                "unit": "x",
                "comparison": {"ours": "run_adjoint", "peer": "a bare loop", "better": "lower"},
                "goal": {"at_most": 2.0, "why": "executor goal"},
            }
        },
    },
    "bench_tiers.json": {
        "read": {"store": 1.045},
        "claims": {
            "read": {
                "says": "reads over dd",
                "of": {"ratio": "/read/store"},
                "unit": "x",
                "goal": {"at_least": 0.8, "why": "tiers goal"},
            }
        },
    },
    "bench_error_budget.json": {
        "equal_accuracy": [{"memory_saved": 0.5128}],
        "claims": {
            "saved": {
                "says": "memory the controller saves",
                "of": {"saved": "/equal_accuracy/0/memory_saved"},
                "unit": "fraction",
            }
        },
    },
}

#: A text that says what the records say; each test below changes one thing.
CLAIMED_TEXT = (
    "Ours is 2.8x<!-- claim: bench_torch.json#vs_nonreentrant min --> to "
    "3.6x<!-- claim: bench_torch.json#vs_nonreentrant max --> faster than the non-reentrant "
    "mode. Against the reentrant mode the ratio is 0.93x<!-- claim: bench_torch.json"
    "#vs_reentrant min --> to 1.15x<!-- claim: bench_torch.json#vs_reentrant max -->. "
    "run_adjoint takes 2.01x<!-- claim: bench_executor.json#overhead --> a bare loop "
    "(goal 2x<!-- claim: bench_executor.json#overhead goal -->: missed). Reads reach "
    "1.04x<!-- claim: bench_tiers.json#read --> dd's rate, meeting the "
    "0.8x<!-- claim: bench_tiers.json#read goal --> goal. The controller saves "
    "51%<!-- claim: bench_error_budget.json#saved --> of the memory."
)


@pytest.fixture
def claimed():
    for name, content in CLAIMED.items():
        (RESULTS / name).write_text(json.dumps(content))
    _FILES.clear()
    claims.forget()
    return CLAIMED_TEXT


def _rewrite(name: str, change) -> None:
    content = json.loads(json.dumps(CLAIMED[name]))
    change(content)
    (RESULTS / name).write_text(json.dumps(content))
    _FILES.clear()
    claims.forget()


def test_claims_text_that_says_what_the_records_say_passes(claimed):
    assert problems(claimed) == []


def test_claims_faster_changed_to_slower_fails(claimed):
    found = problems(claimed.replace("faster than", "slower than"))
    assert len(found) == 1 and "says 'slower'" in found[0] and "is better for ours" in found[0]


def test_claims_beats_on_a_set_where_the_peer_wins_at_one_point_fails(claimed):
    text = claimed.replace(
        "Against the reentrant mode the ratio is", "Ours beats the reentrant mode:"
    )
    found = problems(text)
    assert len(found) == 1 and "says 'beats'" in found[0] and "mixed" in found[0]


def test_claims_met_changed_to_missed_and_back_fails(claimed):
    found = problems(claimed.replace(": missed)", ": met)"))
    assert len(found) == 1 and "says met" in found[0] and "overhead missed" in found[0]
    found = problems(claimed.replace("meeting the", "missing the"))
    assert len(found) == 1 and "says missed" in found[0] and "read met" in found[0]
    found = problems(claimed.replace(": missed)", ")"))
    assert len(found) == 1 and "without saying whether it was met" in found[0]


def test_claims_a_percentage_read_as_a_fraction_fails(claimed):
    found = problems(claimed.replace("51%<", "0.51%<"))
    assert len(found) == 1 and "is 0.5128" in found[0]
    found = problems(claimed.replace("51%<", "0.51x<"))
    assert len(found) == 1 and "quote it as a percentage" in found[0]
    # The same mutation against a plain pointer fails too.
    plain = "saves 51%<!-- bench_error_budget.json#/equal_accuracy/0/memory_saved -->"
    assert problems(plain) == [] and "holds 0.5128" in problems(plain.replace("51%", "0.51%"))[0]


def test_claims_a_range_by_endpoints_that_are_not_the_extremes_fails(claimed):
    found = problems(claimed.replace("0.93x<", "1.15x<", 1).replace("to 1.15x<", "to 1.15x<", 1))
    assert len(found) == 1 and "vs_reentrant min is 0.931" in found[0]
    # One endpoint alone is not a range.
    text = claimed.replace(" to 1.15x<!-- claim: bench_torch.json#vs_reentrant max -->", "")
    found = problems(text)
    assert len(found) == 1 and "without its max" in found[0]
    # A set is quoted by its extremes, not as one value.
    found = problems(claimed.replace("#vs_reentrant min", "#vs_reentrant"))
    assert "is a range over the two equal-memory points" in found[0]


def test_claims_a_pointer_moved_to_the_peers_field_fails(claimed):
    def move(content):
        content["claims"]["overhead"]["of"]["ours"] = "/summary/bare_s"

    _rewrite("bench_executor.json", move)
    found = problems(claimed)
    assert found and all("same field" in f for f in found)

    def move_one_point(content):
        content["claims"]["vs_nonreentrant"]["set"]["of"][1]["ours"] = "/a/rows/4/extra"

    _rewrite("bench_executor.json", lambda content: None)
    _rewrite("bench_torch.json", move_one_point)
    found = problems(claimed)
    assert len(found) == 1 and "vs_nonreentrant min is" in found[0]


def test_claims_a_source_relabelled_external_fails(claimed):
    text = claimed.replace(
        "claim: bench_executor.json#overhead -->",
        "external: run_adjoint over a bare loop, measured by hand -->",
        1,
    )
    found = problems(text)
    assert len(found) == 1 and "needs a citation" in found[0]


def test_claims_a_result_stated_without_its_record_fails(claimed):
    text = claimed.replace(
        "claim: bench_executor.json#overhead -->",
        "bench_executor.json#/summary/ours_s / #/summary/bare_s -->",
        1,
    ).replace("(goal 2x<!-- claim: bench_executor.json#overhead goal -->: missed)", "(goal missed)")
    found = problems(text)
    assert len(found) == 1 and "names no claim record" in found[0]


def test_claims_the_list_of_missed_targets_must_name_every_miss(claimed):
    assert missed_problems(claimed) == []
    found = missed_problems(claimed.replace("claim: bench_executor.json#overhead", "given:"))
    assert len(found) == 1 and "bench_executor.json#overhead missed its goal" in found[0]


def test_claims_a_record_is_checked(claimed):
    def bad(field, value):
        def change(content):
            content["claims"]["overhead"][field] = value

        return change

    for change, said in (
        (bad("unit", "furlongs"), "unit 'furlongs'"),
        (bad("goal", {"at_most": 2.0}), "'why'"),
        (bad("formula", "ours / nonesuch"), "names 'nonesuch'"),
        (bad("formula", "__import__('os')"), "is not allowed"),
        (bad("comparison", {"ours": "a", "peer": "b", "better": "sideways"}), "better"),
        (bad("of", {"ours": "/summary/nonesuch", "peer": "/summary/bare_s"}), "no key"),
    ):
        _rewrite("bench_executor.json", change)
        found = problems(claimed)
        assert found and any(said in f for f in found), (said, found)
