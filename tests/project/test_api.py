"""The public surface: one error base, deprecated aliases that still work."""

from __future__ import annotations

import builtins
import importlib
import math
import re
import warnings

import pytest

import vlcc_adjoint
from vlcc_adjoint import VlccError

#: Public modules whose exported exceptions must share :class:`VlccError`.
#: Optional integrations are imported only when their dependency is present.
PUBLIC = [
    "vlcc_adjoint",
    "vlcc_adjoint.schedules",
    "vlcc_adjoint.storage",
    "vlcc_adjoint.storage.format",
    "vlcc_adjoint.storage.codecs",
    "vlcc_adjoint.state",
    "vlcc_adjoint.execute",
    "vlcc_adjoint.solver",
    "vlcc_adjoint.budget",
    "vlcc_adjoint.lineage",
    "vlcc_adjoint.errors",
    "vlcc_adjoint.plot",
    "vlcc_adjoint.mpi",
    "vlcc_adjoint.jax",
    "vlcc_adjoint.torch",
    "vlcc_adjoint.devito",
]

#: The builtin base each exception had before VlccError existed; users'
#: ``except`` clauses name these, so they must keep matching.
BUILTIN_BASE = {
    "VlccError": Exception,
    "InvalidScheduleError": ValueError,
    "UnknownStateTypeError": TypeError,
    "StateMismatchError": ValueError,
    "NonFiniteError": FloatingPointError,
    "StorageError": RuntimeError,
    "TierFullError": RuntimeError,
    "CorruptCheckpointError": RuntimeError,
    "StoreLockedError": RuntimeError,
    "PlanMismatchError": RuntimeError,
    "CollectiveTimeoutError": TimeoutError,
    "RankFailedError": RuntimeError,
    "AgreedError": RuntimeError,
    "ScheduleMismatchError": ValueError,
    "VlccValueError": ValueError,
    "VlccTypeError": TypeError,
    "VlccRuntimeError": RuntimeError,
    "VlccKeyError": KeyError,
    "VlccIndexError": IndexError,
    "VlccImportError": ImportError,
    "VlccFileNotFoundError": FileNotFoundError,
    "CallOrderError": RuntimeError,
}


def _module(name):
    try:
        return importlib.import_module(name)
    except ImportError as e:  # an optional integration whose dependency is absent
        pytest.skip(f"{name}: {e}")


def _exported(mod):
    names = getattr(mod, "__all__", None)
    if names is None:
        names = [n for n in vars(mod) if not n.startswith("_")]
    return {n: getattr(mod, n) for n in names}


@pytest.mark.parametrize("name", PUBLIC)
def test_every_exported_exception_derives_from_vlcc_error_and_its_old_builtin(name):
    mod = _module(name)
    errors = {
        n: obj
        for n, obj in _exported(mod).items()
        if isinstance(obj, type)
        and issubclass(obj, BaseException)
        and obj.__module__.startswith("vlcc_adjoint")
    }
    for n, cls in errors.items():
        assert issubclass(cls, VlccError), f"{name}.{n} does not derive from VlccError"
        assert n in BUILTIN_BASE, f"{name}.{n}: add its builtin base to BUILTIN_BASE"
        assert issubclass(cls, BUILTIN_BASE[n]), (
            f"{name}.{n} lost its builtin base {BUILTIN_BASE[n]}"
        )


def test_every_public_error_class_in_the_source_derives_from_vlcc_error():
    """Every ``class <Name>Error`` in the package (found in the source, so a
    new one cannot be missed by forgetting to export it) is a VlccError."""
    import ast
    from pathlib import Path

    pkg = Path(vlcc_adjoint.__file__).parent
    found = []
    for path in sorted(pkg.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.ClassDef)
                and node.name.endswith("Error")
                and not node.name.startswith("_")
            ):
                rel = path.relative_to(pkg.parent).with_suffix("")
                name = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
                found.append(
                    (_module(name) if "mpi" in name else importlib.import_module(name), node.name)
                )
    assert len(found) >= len(BUILTIN_BASE)
    for mod, name in found:
        cls = getattr(mod, name)
        assert issubclass(cls, VlccError), f"{mod.__name__}.{name} does not derive from VlccError"
        assert issubclass(cls, BUILTIN_BASE[name]), (
            f"{mod.__name__}.{name} lost {BUILTIN_BASE[name]}"
        )


def test_vlcc_error_catches_an_invalid_schedule_that_old_code_catches_as_value_error():
    from vlcc_adjoint import Advance, Schedule, simulate
    from vlcc_adjoint.schedules import actions_to_table

    bad = Schedule(actions_to_table([Advance(0, 5)]), 3)  # advances past the last step
    with pytest.raises(VlccError) as e:
        simulate(bad)
    assert isinstance(e.value, ValueError)
    assert isinstance(e.value, vlcc_adjoint.InvalidScheduleError)


def test_vlcc_error_is_an_exception_and_not_a_builtin_alias():
    assert issubclass(VlccError, Exception)
    assert VlccError.__name__ not in vars(builtins)
    with pytest.raises(VlccError):
        raise vlcc_adjoint.StateMismatchError("x")


#: (module, old name, the object it must still return, a word the warning names).
ALIASES = [
    ("vlcc_adjoint.storage", "LeafTable", "vlcc_adjoint.storage._dedup:LeafTable", "dedup=True"),
    ("vlcc_adjoint.jax", "Trace", "vlcc_adjoint.schedules:Trace", "vlcc_adjoint.schedules.Trace"),
    (
        "vlcc_adjoint.jax",
        "table_trace",
        "vlcc_adjoint.schedules:table_trace",
        "vlcc_adjoint.schedules.table_trace",
    ),
    (
        "vlcc_adjoint.jax",
        "default_snapshots",
        "vlcc_adjoint.jax:_scan_default_snapshots",
        "vlcc_adjoint.schedules.default_snapshots(n, repetitions=2)",
    ),
]


@pytest.mark.parametrize("module, name, target, replacement", ALIASES)
def test_a_retired_name_still_imports_warns_and_is_the_same_object(
    module, name, target, replacement
):
    mod = _module(module)
    where, attr = target.split(":")
    expected = getattr(importlib.import_module(where), attr)
    with pytest.warns(DeprecationWarning, match=re.escape(replacement)) as record:
        got = getattr(mod, name)
    assert got is expected
    assert record[0].filename == __file__  # the warning points at the caller
    assert name not in getattr(mod, "__all__", ())
    with pytest.warns(DeprecationWarning):
        exec(f"from {module} import {name} as alias", {})  # the from-import form warns too


@pytest.mark.parametrize("module", ["vlcc_adjoint.storage", "vlcc_adjoint.jax"])
def test_an_unknown_name_is_still_an_attribute_error(module):
    mod = _module(module)
    with pytest.raises(AttributeError, match="no_such_name"):
        mod.no_such_name  # noqa: B018


@pytest.mark.parametrize("module", ["vlcc_adjoint.storage", "vlcc_adjoint.jax"])
def test_every_name_in_all_imports_without_a_warning(module):
    mod = _module(module)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        for name in mod.__all__:
            getattr(mod, name)


def test_the_tier_protocol_helpers_stay_public():
    from vlcc_adjoint import storage

    for name in ("Tier", "Record", "make_record", "check_key"):
        assert name in storage.__all__
        assert getattr(storage, name).__doc__


def _least_c(steps, r):
    """Independent reading of the binomial bound: scan c upwards."""
    return next(
        c for c in range(1, steps + 1) if math.comb(c + (c if r is None else r), c) >= steps
    )


@pytest.mark.parametrize("repetitions", [None, 1, 2, 3])
def test_default_snapshots_is_the_least_count_within_the_binomial_bound(repetitions):
    from vlcc_adjoint.schedules import binomial_forward_count, default_snapshots

    for steps in range(1, 400):
        c = default_snapshots(steps, repetitions)
        assert c == _least_c(steps, repetitions)
        if repetitions is not None:
            # Revolve's own count of forward steps: at most r repetitions each
            assert binomial_forward_count(steps, c) <= repetitions * steps


def test_default_snapshots_balanced_is_pyrevolves_and_devitos_default():
    from vlcc_adjoint.schedules import default_snapshots

    assert [default_snapshots(n) for n in (1, 2, 3, 6, 7, 20, 21, 70, 71, 1000)] == [
        1,
        1,
        2,
        2,
        3,
        3,
        4,
        4,
        5,
        7,
    ]
    try:
        from vlcc_adjoint import devito
    except ImportError:
        return
    assert devito.default_snapshots is default_snapshots


def test_default_snapshots_refuses_bad_input():
    from vlcc_adjoint.schedules import default_snapshots

    for bad in (0, -3, 2.5):
        with pytest.raises(ValueError, match="steps"):
            default_snapshots(bad)
    with pytest.raises(ValueError, match="repetitions"):
        default_snapshots(10, 0)


def test_the_package_ships_a_pep561_marker():
    import importlib.resources
    import tomllib
    from pathlib import Path

    assert importlib.resources.files("vlcc_adjoint").joinpath("py.typed").is_file()
    pyproject = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    assert "py.typed" in pyproject["tool"]["setuptools"]["package-data"]["vlcc_adjoint"]


def test_a_budget_plan_given_to_tiered_store_is_refused_with_the_remedy():
    from vlcc_adjoint import io_plan, plan
    from vlcc_adjoint.storage import MemoryTier, TieredStore

    budget_plan = plan(
        20, memory_bytes=5 * 800, state_bytes=800, step_seconds=1e-3, copy_seconds=1e-5
    )
    with pytest.raises(TypeError, match=r"BudgetPlan.*make_store\(\).*io_plan"):
        TieredStore([MemoryTier()], plan=budget_plan)
    # the two remedies the message names both work
    budget_plan.make_store().close()
    TieredStore([MemoryTier()], plan=io_plan(budget_plan.schedule)).close()


#: The most used public callables: every parameter and the return annotated.
ANNOTATED = [
    "vlcc_adjoint:run_adjoint",
    "vlcc_adjoint:plan",
    "vlcc_adjoint:timestep",
    "vlcc_adjoint:BudgetPlan.make_store",
    "vlcc_adjoint:Schedule.stats",
    "vlcc_adjoint.schedules:default_snapshots",
    "vlcc_adjoint.schedules:actions_to_table",
    "vlcc_adjoint.storage:TieredStore.__init__",
    "vlcc_adjoint.storage:TieredStore.save",
    "vlcc_adjoint.storage:TieredStore.load",
    "vlcc_adjoint.storage:TieredStore.reserve",
    "vlcc_adjoint.storage:ZarrTier.__init__",
    "vlcc_adjoint.storage:CompressedMemoryTier.__init__",
    "vlcc_adjoint.storage:make_record",
    "vlcc_adjoint.state:flatten",
    "vlcc_adjoint.state:unflatten",
    "vlcc_adjoint.lineage:History.__init__",
    "vlcc_adjoint.lineage:History.checkout",
    "vlcc_adjoint.lineage:History.load",
    "vlcc_adjoint.lineage:History.log",
    "vlcc_adjoint.lineage:History.diff",
    "vlcc_adjoint.lineage:History.compare",
    "vlcc_adjoint.lineage:export_history",
    "vlcc_adjoint.lineage:import_history",
    "vlcc_adjoint.mpi:run_adjoint",
    "vlcc_adjoint.mpi:write_checkpoint",
    "vlcc_adjoint.mpi:read_checkpoint",
    "vlcc_adjoint.mpi:list_checkpoints",
    "vlcc_adjoint.mpi:SharedZarrTier.__init__",
    "vlcc_adjoint.jax:checkpointed_scan",
    "vlcc_adjoint.torch:checkpoint_sequential",
    "vlcc_adjoint.torch:checkpoint_sequence",
    "vlcc_adjoint.jax:checkpointed",
    "vlcc_adjoint.jax:checkpointed_fori_loop",
    "vlcc_adjoint.jax:CheckpointedStep.scan",
    "vlcc_adjoint.devito:Revolver.__init__",
    "vlcc_adjoint.devito:DevitoSolver.__init__",
    "vlcc_adjoint.devito:DevitoSolver.run",
    "vlcc_adjoint.devito:DevitoSolver.forward_many",
    "vlcc_adjoint.devito:DevitoSolver.adjoint",
]


@pytest.mark.parametrize("target", ANNOTATED)
def test_the_most_used_public_signatures_are_annotated(target):
    import inspect

    module, path = target.split(":")
    obj = _module(module)
    for part in path.split("."):
        obj = getattr(obj, part)
    sig = inspect.signature(obj)
    params = list(sig.parameters.values())
    if params and params[0].name == "self":
        params = params[1:]
    missing = [p.name for p in params if p.annotation is inspect.Parameter.empty]
    if obj.__name__ != "__init__" and sig.return_annotation is inspect.Signature.empty:
        missing.append("return")
    assert not missing, f"{target}: no annotation on {missing}"


# ---------------------------------------------------------------------------
# Every public callable is fully annotated
# ---------------------------------------------------------------------------


def _public_modules() -> list[str]:
    """``vlcc_adjoint`` and every submodule with no ``_`` component in its dotted name."""
    import pkgutil

    names = [
        m.name
        for m in pkgutil.walk_packages(vlcc_adjoint.__path__, "vlcc_adjoint.")
        if not any(part.startswith("_") for part in m.name.split("."))
    ]
    return ["vlcc_adjoint"] + sorted(names)


def _ours(obj) -> bool:
    return isinstance(getattr(obj, "__module__", None), str) and obj.__module__.startswith(
        "vlcc_adjoint"
    )


def _unannotated(func, bound: bool, init: bool) -> list[str] | None:
    """The parameters (and ``"return"``) of `func` without an annotation; ``None``
    when `func` has no signature or is not defined in this package's source."""
    import inspect
    from pathlib import Path

    try:
        source = inspect.getsourcefile(inspect.unwrap(func))
        sig = inspect.signature(func)
    except (TypeError, ValueError):
        return None
    if source is None or Path(vlcc_adjoint.__file__).parent not in Path(source).resolve().parents:
        return None
    params = list(sig.parameters.values())[1 if bound else 0 :]
    missing = [p.name for p in params if p.annotation is inspect.Parameter.empty]
    if not init and sig.return_annotation is inspect.Signature.empty:
        missing.append("return")
    return missing


def annotation_gaps(modules) -> dict[str, list[str]]:
    """``public.path.name[.method]`` -> its unannotated parameters, for every
    callable a public module exports (``__all__``, or its public names of this
    package when it has none): functions, and classes' ``__init__``,
    ``__call__``, public methods, class/static methods and properties,
    inherited ones from this package's bases included."""
    import inspect
    import types

    gaps: dict[str, list[str]] = {}
    seen: set[int] = set()

    def check(func, label, bound, init=False):
        missing = _unannotated(func, bound, init)
        if missing:
            gaps[label] = missing

    for module in modules:
        names = getattr(module, "__all__", None)
        if names is None:
            names = [n for n, v in vars(module).items() if not n.startswith("_") and _ours(v)]
        for name in names:
            obj = getattr(module, name)
            if id(obj) in seen or isinstance(obj, types.ModuleType) or not _ours(obj):
                continue
            seen.add(id(obj))
            label = f"{module.__name__}.{name}"
            if inspect.isclass(obj):
                done = set()
                for klass in obj.__mro__:
                    if not _ours(klass):
                        continue
                    for attr_name, attr in vars(klass).items():
                        if attr_name in done or (
                            attr_name.startswith("_") and attr_name not in ("__init__", "__call__")
                        ):
                            continue
                        if attr_name == "__init__" and klass is not obj:
                            continue  # a base's __init__ is checked where it is exported
                        done.add(attr_name)
                        where = f"{label}.{attr_name}"
                        if isinstance(attr, staticmethod):
                            check(attr.__func__, where, False)
                        elif isinstance(attr, classmethod):
                            check(attr.__func__, where, True)
                        elif isinstance(attr, property):
                            if attr.fget is not None:
                                check(attr.fget, where, True)
                        elif inspect.isfunction(attr):
                            check(attr, where, True, init=attr_name == "__init__")
            elif callable(obj):
                check(obj, label, False)
    return gaps


def _importable(names):
    out = []
    for name in names:
        try:
            out.append(importlib.import_module(name))
        except ImportError:  # an optional integration whose dependency is absent
            pass
    return out


def test_every_public_callable_has_complete_annotations():
    gaps = annotation_gaps(_importable(_public_modules()))
    assert not gaps, "public callables without full annotations (parameters, return): " + "; ".join(
        f"{k}: {v}" for k, v in sorted(gaps.items())
    )


def test_the_annotation_check_reports_what_is_missing():
    import types

    mod = types.ModuleType("vlcc_adjoint.fake")
    exec(
        """
__all__ = ["full", "bare", "Thing"]
def full(a: int, *args: int, b: str = "", **kw: float) -> None: ...
def bare(a, b: int = 1): ...
class Thing:
    def __init__(self, x, y: int) -> None: ...
    def method(self, z: int): ...
    def _private(self, w): ...
    @property
    def size(self): ...
    @classmethod
    def make(cls, v: int) -> "Thing": ...
""",
        vars(mod),
    )
    # the check only trusts source files of this package: pretend these are
    import inspect

    real = inspect.getsourcefile
    try:
        inspect.getsourcefile = lambda obj: vlcc_adjoint.__file__
        gaps = annotation_gaps([mod])
    finally:
        inspect.getsourcefile = real
    assert gaps == {
        "vlcc_adjoint.fake.bare": ["a", "return"],
        "vlcc_adjoint.fake.Thing.__init__": ["x"],
        "vlcc_adjoint.fake.Thing.method": ["return"],
        "vlcc_adjoint.fake.Thing.size": ["return"],
    }


def test_the_package_raises_no_bare_builtin_error():
    """Every error raised on purpose is a VlccError (``except VlccError``
    catches argument errors too): no ``raise ValueError(...)`` and the like
    in the source; the VlccError subclasses keep the builtin base."""
    import ast
    from pathlib import Path

    builtin = {
        "ValueError",
        "TypeError",
        "RuntimeError",
        "KeyError",
        "IndexError",
        "ImportError",
        "FileNotFoundError",
        "OSError",
        "Exception",
    }
    pkg = Path(vlcc_adjoint.__file__).parent
    bare = []
    for path in sorted(pkg.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
                func = node.exc.func
                if isinstance(func, ast.Name) and func.id in builtin:
                    bare.append(f"{path.relative_to(pkg)}:{node.lineno}: raise {func.id}")
    assert not bare, "raise a VlccError subclass (vlcc_adjoint.errors) instead:\n" + "\n".join(bare)
