"""Claims as data: what the README and the paper say about a result, as a
record in the results file of the benchmark that measured it.

A results file ``benchmarks/results/bench_<name>.json`` may hold, beside
what its benchmark measured, an object ``"claims"`` that maps a claim's id
(lower case, digits and ``_``) to its record::

    "claims": {
      "rnn_vs_reentrant": {
        "says": "Revolve over blocks against checkpoint_sequential(use_reentrant=True)",
        "set": {"name": "the four equal-memory points",
                "of": [{"ours": "/a/rows/3/extra", "peer": "/a/rows/2/extra"}, ...]},
        "formula": "peer / ours",
        "unit": "x",
        "comparison": {"ours": "vlcc Revolve over blocks",
                       "peer": "torch checkpoint_sequential, use_reentrant=True",
                       "peer_setup": "as shipped", "better": "higher"},
        "goal": {"at_least": 1.0, "why": "..."},
        "setting": {"n": "/a/n", "threads": 1, "durability": "in memory"}
      }
    }

**Fields:**

- ``says``: one line, what is claimed (required).
- ``of``: the quantity's inputs, a map from a name to a JSON pointer
  (RFC 6901) into this file, or ``FILE#POINTER`` into another results file;
  or ``set``: ``{"name": ..., "of": [bindings, ...]}``, the set of points a
  range quotes, one binding (such a map) per point.  Exactly one of the two.
- ``formula``: an arithmetic expression over those names (``+ - * /``,
  parentheses, numbers, ``abs``, ``min``, ``max``); by default the only
  name.  For a set it is evaluated at each point.
- ``unit``: ``x`` (a ratio), ``fraction`` (quoted as a percentage: 0.51 is
  written 51%), ``percent`` (already in percent), ``s``, ``bytes``,
  ``GB/s``, ``count``.
- ``comparison`` (for a claim against a peer): ``ours``, ``peer`` (which
  tool, which setup: ``peer_setup``, e.g. "shipped", "untaped", "fsync on
  every file"), and ``better``: ``lower`` or ``higher`` (of the value).  The
  value is *even* at ``even`` (default 1 for ``x``, 0 otherwise).  Where the
  inputs are named ``ours`` and ``peer`` they must be different pointers.
- ``goal``: one of ``at_most``, ``below``, ``at_least``, ``above`` (a number
  or a pointer to one) or ``between`` (two), and ``why`` (where the goal
  comes from).  For a set, the goal holds only if it holds at every point.
- ``setting``: free-form facts of the run the claim depends on (size,
  threads, durability); a string that starts with ``/`` is a pointer.

**Computed, never written:** the value (the set's values, its minimum and
maximum), the *direction* of a comparison (``better``, ``worse``, ``even``,
or ``mixed`` when a set has points on both sides) and the goal's *verdict*
(``met`` or ``missed``).  `tests/project/test_paper.py` checks the README
and the paper against them (see there for the text's markers).
"""

from __future__ import annotations

import ast
import json
import math
import operator
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"

UNITS = ("x", "fraction", "percent", "s", "bytes", "GB/s", "count")
GOALS = ("at_most", "below", "at_least", "above", "between")
ID = re.compile(r"[a-z][a-z0-9_]*")


class ClaimError(ValueError):
    """A claim record that cannot be read or evaluated; the message names
    the file, the claim and the field."""


def resolve(document: Any, pointer: str) -> Any:
    """The value at JSON pointer `pointer` (RFC 6901) of `document`.

    **Arguments:**

    - `document`: a parsed JSON document.
    - `pointer`: ``""`` (the whole document) or ``/``-separated keys and list
      indices, ``~1`` for a ``/`` and ``~0`` for a ``~`` inside a key.

    **Returns:** the value; raises `ClaimError` naming the missing key.
    """
    if pointer and not pointer.startswith("/"):
        raise ClaimError(f"JSON pointer {pointer!r} must start with '/'")
    node = document
    for raw in pointer.split("/")[1:]:
        key = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and key in node:
            node = node[key]
        elif isinstance(node, list) and re.fullmatch(r"0|[1-9]\d*", key) and int(key) < len(node):
            node = node[int(key)]
        else:
            raise ClaimError(f"#{pointer}: no key {key!r} there")
    return node


_BINARY: dict[type, Callable[[float, float], float]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
}
_CALLS: dict[str, Callable[..., float]] = {"abs": abs, "min": min, "max": max}


def evaluate(formula: str, values: Mapping[str, float]) -> float:
    """`formula` (arithmetic over the names of `values`) evaluated; nothing
    but numbers, names, ``+ - * /``, unary minus and ``abs/min/max``."""
    try:
        tree = ast.parse(formula, mode="eval")
    except SyntaxError as error:
        raise ClaimError(f"formula {formula!r} is not an expression: {error.msg}") from None

    def walk(node: ast.AST) -> float:
        if isinstance(node, ast.Expression):
            return walk(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return float(node.value)
        if isinstance(node, ast.Name):
            if node.id not in values:
                raise ClaimError(f"formula {formula!r} names {node.id!r}, not an input")
            return values[node.id]
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            return _BINARY[type(node.op)](walk(node.left), walk(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -walk(node.operand)
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in _CALLS
            and not node.keywords
        ):
            return float(_CALLS[node.func.id](*(walk(a) for a in node.args)))
        raise ClaimError(f"formula {formula!r}: {ast.dump(node)[:40]} is not allowed")

    try:
        return walk(tree)
    except ZeroDivisionError:
        raise ClaimError(f"formula {formula!r} divides by zero") from None


@dataclass
class Claim:
    """One record, evaluated against the results it points into."""

    file: str
    id: str
    says: str
    unit: str
    values: list[float]  # one per point (one for a single quantity)
    inputs: list[dict[str, float]]  # the named inputs at each point
    set_name: str | None = None
    comparison: dict[str, Any] | None = None
    goal: dict[str, Any] | None = None
    bounds: tuple[float, float] = (-math.inf, math.inf)  # the goal's as numbers
    setting: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return f"{self.file}#{self.id}"

    @property
    def value(self) -> float:
        if len(self.values) != 1:
            raise ClaimError(f"{self.name} is a set ({self.set_name}): quote its min or max")
        return self.values[0]

    @property
    def low(self) -> float:
        return min(self.values)

    @property
    def high(self) -> float:
        return max(self.values)

    def direction(self) -> str | None:
        """``better``, ``worse``, ``even`` or ``mixed`` (a set with points on
        both sides): ours against the peer; None without a comparison."""
        if self.comparison is None:
            return None
        even = float(self.comparison.get("even", 1.0 if self.unit == "x" else 0.0))
        sign = 1.0 if self.comparison["better"] == "higher" else -1.0
        sides = {
            "better" if sign * (v - even) > 0 else "worse" if sign * (v - even) < 0 else "even"
            for v in self.values
        }
        return sides.pop() if len(sides) == 1 else "mixed"

    def verdict(self) -> str | None:
        """``met`` or ``missed``: the goal at every point; None without a goal."""
        if self.goal is None:
            return None
        kind = next(k for k in GOALS if k in self.goal)
        low, high = self.bounds
        checks = {
            "at_most": lambda v: v <= high,
            "below": lambda v: v < high,
            "at_least": lambda v: v >= low,
            "above": lambda v: v > low,
            "between": lambda v: low <= v <= high,
        }
        return "met" if all(checks[kind](v) for v in self.values) else "missed"

    def goal_value(self) -> float:
        """The goal's bound, as a number (the only one, or for ``between``
        the farther from one)."""
        low, high = self.bounds
        if math.isinf(low):
            return high
        if math.isinf(high):
            return low
        return high if abs(high - 1) >= abs(low - 1) else low


def _number(document: Any, ref: Any, where: str, root: Path) -> float:
    value = _pointed(document, ref, where, root) if isinstance(ref, str) else ref
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ClaimError(f"{where}: {ref!r} is {type(value).__name__}, not a number")
    return float(value)


def _pointed(document: Any, ref: str, where: str, root: Path) -> Any:
    file, hash_, pointer = ref.partition("#")
    if hash_:
        document = load_results(file, root)
    else:
        pointer = ref
    try:
        return resolve(document, pointer)
    except ClaimError as error:
        raise ClaimError(f"{where}: {ref!r}: {error}") from None


_DOCUMENTS: dict[tuple[Path, str], Any] = {}


def load_results(name: str, root: Path = RESULTS) -> Any:
    """The parsed results file `name` of folder `root` (cached)."""
    if not re.fullmatch(r"[\w.-]+\.json", name):
        raise ClaimError(f"{name!r} is not the name of a results file (bench_<name>.json)")
    key = (root, name)
    if key not in _DOCUMENTS:
        path = root / name
        if not path.is_file():
            raise ClaimError(f"{path} does not exist")
        _DOCUMENTS[key] = json.loads(path.read_text())
    return _DOCUMENTS[key]


def forget() -> None:
    """Drop the cache of parsed results files (after one was rewritten)."""
    _DOCUMENTS.clear()


def claim(file: str, id: str, root: Path = RESULTS) -> Claim:
    """The record `id` of results file `file`, checked and evaluated.

    **Arguments:**

    - `file`: ``bench_<name>.json``.
    - `id`: the claim's key in the file's ``"claims"``.
    - `root`: the results folder (``benchmarks/results/`` by default).

    **Returns:** a `Claim`; raises `ClaimError` naming what is wrong.
    """
    document = load_results(file, root)
    records = document.get("claims", {}) if isinstance(document, dict) else {}
    if id not in records:
        raise ClaimError(f"{file} has no claim {id!r} (its claims: {sorted(records)})")
    return _evaluate(file, id, records[id], document, root)


def claims(file: str, root: Path = RESULTS) -> list[Claim]:
    """Every claim of results file `file`."""
    document = load_results(file, root)
    records = document.get("claims", {}) if isinstance(document, dict) else {}
    return [_evaluate(file, id, record, document, root) for id, record in records.items()]


def all_claims(root: Path = RESULTS) -> list[Claim]:
    """Every claim of every results file of `root`."""
    return [c for path in sorted(root.glob("*.json")) for c in claims(path.name, root)]


def _evaluate(file: str, id: str, record: Any, document: Any, root: Path) -> Claim:
    where = f"{file}#{id}"
    if not ID.fullmatch(id):
        raise ClaimError(f"{where}: a claim's id is lower case letters, digits and '_'")
    if not isinstance(record, dict):
        raise ClaimError(f"{where}: a claim is an object")
    unknown = set(record) - {
        "says",
        "of",
        "set",
        "formula",
        "unit",
        "comparison",
        "goal",
        "setting",
    }
    if unknown:
        raise ClaimError(f"{where}: unknown fields {sorted(unknown)}")
    if not isinstance(record.get("says"), str) or not record["says"].strip():
        raise ClaimError(f"{where}: 'says' (one line: what is claimed) is required")
    unit = record.get("unit")
    if unit not in UNITS:
        raise ClaimError(f"{where}: unit {unit!r} is not one of {list(UNITS)}")
    if ("of" in record) == ("set" in record):
        raise ClaimError(f"{where}: give either 'of' (one quantity) or 'set' (a range's points)")
    set_name = None
    if "set" in record:
        spec = record["set"]
        if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
            raise ClaimError(f"{where}: 'set' is {{'name': ..., 'of': [bindings]}}")
        bindings = spec.get("of")
        set_name = spec["name"]
        if not isinstance(bindings, list) or len(bindings) < 2:
            raise ClaimError(f"{where}: a set has two or more points")
    else:
        bindings = [record["of"]]
    inputs: list[dict[str, float]] = []
    for binding in bindings:
        if not isinstance(binding, dict) or not binding:
            raise ClaimError(f"{where}: a binding maps names to pointers")
        if "ours" in binding and "peer" in binding and binding["ours"] == binding["peer"]:
            raise ClaimError(f"{where}: 'ours' and 'peer' point at the same field")
        inputs.append({k: _number(document, v, f"{where} ({k})", root) for k, v in binding.items()})
    formula = record.get("formula")
    if formula is None:
        if len(inputs[0]) != 1:
            raise ClaimError(f"{where}: several inputs need a 'formula'")
        formula = next(iter(inputs[0]))
    values = [evaluate(formula, point) for point in inputs]
    comparison = record.get("comparison")
    if comparison is not None:
        if not isinstance(comparison, dict) or comparison.get("better") not in ("lower", "higher"):
            raise ClaimError(f"{where}: comparison.better is 'lower' or 'higher'")
        for key in ("ours", "peer"):
            if not isinstance(comparison.get(key), str):
                raise ClaimError(f"{where}: comparison.{key} names the contender")
    goal = record.get("goal")
    bounds = (-math.inf, math.inf)
    if goal is not None:
        kinds = [k for k in GOALS if isinstance(goal, dict) and k in goal]
        if len(kinds) != 1 or not isinstance(goal.get("why"), str):
            raise ClaimError(f"{where}: a goal is one of {list(GOALS)} and 'why'")
        bound = goal[kinds[0]]
        if kinds[0] == "between":
            if not isinstance(bound, list) or len(bound) != 2:
                raise ClaimError(f"{where}: goal.between is [low, high]")
            bounds = (
                _number(document, bound[0], f"{where} goal", root),
                _number(document, bound[1], f"{where} goal", root),
            )
        elif kinds[0] in ("at_most", "below"):
            bounds = (-math.inf, _number(document, bound, f"{where} goal", root))
        else:
            bounds = (_number(document, bound, f"{where} goal", root), math.inf)
    setting = record.get("setting", {})
    if not isinstance(setting, dict):
        raise ClaimError(f"{where}: 'setting' is an object")
    setting = {
        k: _pointed(document, v, f"{where} setting", root)
        if isinstance(v, str) and v.startswith("/")
        else v
        for k, v in setting.items()
    }
    return Claim(
        file=file,
        id=id,
        says=record["says"],
        unit=unit,
        values=values,
        inputs=inputs,
        set_name=set_name,
        comparison=comparison,
        goal=goal,
        bounds=bounds,
        setting=setting,
    )


def tracked(root: Path = RESULTS) -> dict[str, Any]:
    """The ``"claims"`` of every results file in `root`, by file name: read
    before a run rewrites those files."""
    found = {}
    for path in sorted(root.glob("*.json")):
        document = json.loads(path.read_text())
        if isinstance(document, dict) and "claims" in document:
            found[path.name] = document["claims"]
    return found


def attach(folder: Path, names: list[str], records: Mapping[str, Any]) -> list[str]:
    """Give the results files `names` that a run just wrote into `folder`
    the claims `records` (from :func:`tracked`) of the files of the same
    name: a rerun rewrites the measurements, the claims stay, and their
    values and verdicts follow the new measurements.

    **Returns:** the names of the files that received claims."""
    done = []
    for name in names:
        path = folder / name
        if name not in records or not path.is_file() or path.is_symlink():
            continue
        document = json.loads(path.read_text())
        if isinstance(document, dict) and "claims" not in document:
            document["claims"] = records[name]
            path.write_text(json.dumps(document, indent=1))
            done.append(name)
    return done


def main() -> None:
    """``python benchmarks/claims.py``: every claim, its value and verdict."""
    for c in all_claims():
        shown = (
            f"{c.value:.4g}"
            if len(c.values) == 1
            else f"{c.low:.4g} .. {c.high:.4g} over {c.set_name}"
        )
        print(f"{c.name:52s} {shown:40s} {c.unit:8s} {c.direction() or '':7s} {c.verdict() or ''}")


if __name__ == "__main__":
    main()
