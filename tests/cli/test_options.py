"""Every numeric option of ``vlcc`` and of every example refuses bad values, in one line.

The options are found by walking each parser (``vlcc_adjoint.cli.build_parser``
and each example's ``build_parser()``), so an option added later is checked
too: one whose default is a number must have a validating type
(:class:`~vlcc_adjoint.cli.Integer`, :class:`~vlcc_adjoint.cli.Number` or a
function of the command's own), which refuses a word, a non-number or a
non-integer, and a value below its lower bound, with one line on standard
error naming the option, and exit status 2, before any work.
"""

from __future__ import annotations

import argparse
import importlib.util
import pathlib

import pytest

from vlcc_adjoint.cli import Integer, Number, build_parser, main

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"

#: The examples and the modules each needs (skipped, with the reason, without them).
NEEDS = {
    "devito_fwi.py": "devito",
    "jax_neural_ode.py": "jax",
    "jax_wave.py": "jax",
    "lineage_lm.py": "torch",
    "mpi_seismic.py": "mpi4py",
    "torch_deepspeed_checkpoint.py": "torch",
    "torch_offload.py": "torch",
    "torch_rnn_checkpoint.py": "torch",
}


def _numeric_options(parser):
    """``(flag, type)`` of every option of `parser` that takes a number."""
    for action in parser._actions:
        default = action.default
        numeric = isinstance(default, (int, float)) and not isinstance(default, bool)
        numeric = numeric or isinstance(action.type, (Integer, Number))
        if action.option_strings and action.nargs is None and numeric:
            yield action.option_strings[-1], action.type


def _bad_values(kind):
    """Values an option of this type must refuse: a word, a non-finite number
    or a non-integer, and one below its lower bound."""
    yield "abc"
    yield "1e400" if isinstance(kind, Number) else "1.5"
    least, above = getattr(kind, "least", None), getattr(kind, "above", None)
    if least is not None:
        yield str(least - 1)
    elif above is not None:
        yield str(above)
    elif not isinstance(kind, (Integer, Number)):
        yield "-1"


def _refuses(parse, prefix, flag, value, capsys):
    with pytest.raises(SystemExit) as stop:
        parse([f"{flag}={value}"])
    assert stop.value.code == 2, (flag, value)
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{prefix}: error: argument {flag}: "), (
        flag,
        value,
        captured.err,
    )
    assert "--help)" in lines[0]
    assert captured.out == ""


def _check_every_option(parser, parse, prefix, capsys) -> int:
    checked = 0
    for flag, kind in _numeric_options(parser):
        assert kind not in (int, float, None), f"{flag} accepts any {kind}: give it a bound"
        for value in _bad_values(kind):
            _refuses(parse, prefix, flag, value, capsys)
            checked += 1
    return checked


@pytest.mark.parametrize(
    "command, options", [("plan", 5), ("demo", 5), ("log", 1), ("diff", 2), ("gc", 1)]
)
def test_every_numeric_option_of_vlcc_refuses_bad_values(command, options, capsys):
    parser, _ = build_parser()
    sub = parser.commands[command]
    checked = _check_every_option(sub, lambda argv: main([command, *argv]), "vlcc", capsys)
    assert checked >= options * 3


def _example(script: str):
    need = NEEDS.get(script)
    if need and importlib.util.find_spec(need) is None:
        pytest.skip(f"{script} needs {need}")
    spec = importlib.util.spec_from_file_location(f"example_{script[:-3]}", EXAMPLES / script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("script", sorted(p.name for p in EXAMPLES.glob("*.py")))
def test_every_numeric_option_of_every_example_refuses_bad_values(script, capsys):
    parser = _example(script).build_parser()
    assert isinstance(parser, argparse.ArgumentParser)
    prog = parser.prog
    checked = _check_every_option(parser, parser.parse_args, prog, capsys)
    assert checked >= 3, f"{script} has no numeric option"


def test_the_option_types_accept_what_they_promise():
    assert Integer(1)("3") == 3 and Integer(0, 5)("5") == 5
    assert Number(0.0)("0") == 0.0 and Number(above=0.0)("1e-300") == 1e-300
    for kind, text in [
        (Integer(1), "0"),
        (Integer(0, 5), "6"),
        (Integer(), "2.0"),
        (Number(0.0), "-1e-9"),
        (Number(above=0.0), "0"),
        (Number(most=1.0), "1.5"),
        (Number(), "inf"),
        (Number(), "nan"),
    ]:
        with pytest.raises(argparse.ArgumentTypeError, match="must be"):
            kind(text)
    with pytest.raises(argparse.ArgumentTypeError, match=r">= 17 \(why\), got 3"):
        Integer(17, why="why")("3")


def test_the_walk_finds_an_option_left_without_a_bound(capsys):
    # The walk above also finds an option that was left a bare int.
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=3)
    with pytest.raises(AssertionError, match="--steps accepts any"):
        _check_every_option(parser, parser.parse_args, "x", capsys)
