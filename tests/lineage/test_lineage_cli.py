"""The lineage commands of `vlcc` on bad input: one line naming the problem, exit status 2,
never a traceback, and nothing created."""

from __future__ import annotations

import os
import tarfile

import numpy as np
import pytest

from vlcc_adjoint.cli import main as vlcc
from vlcc_adjoint.lineage import History


@pytest.fixture
def repo(tmp_path):
    path = tmp_path / "h"
    with History(path) as h:
        h.commit({"x": np.arange(4.0)}, message="one")
        h.commit({"x": np.arange(4.0) + 1}, message="two")
    return str(path)


def fails(argv, capsys, *needles):
    rc = vlcc([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert rc == 2, (argv, rc, out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("vlcc: error: "), err
    assert "Traceback" not in err + out
    for needle in needles:
        assert str(needle) in lines[0], (needle, lines[0])
    return lines[0]


def test_import_of_something_that_is_not_an_archive(tmp_path, capsys):
    txt = tmp_path / "notastore.txt"
    txt.write_text("hello, not a tar file\n" * 20)
    fails(["import", txt, tmp_path / "dir"], capsys, txt, "not a history archive")
    fails(["import", tmp_path / "missing.tar", tmp_path / "dir2"], capsys, "missing.tar")
    fails(["import", tmp_path, tmp_path / "dir3"], capsys, "directory")
    (tmp_path / "empty.tar").write_bytes(b"")
    fails(["import", tmp_path / "empty.tar", tmp_path / "dir4"], capsys, "empty.tar")
    with tarfile.open(tmp_path / "cut.tar", "w") as tar:
        tar.add(txt, arcname="zarr.json")
    data = (tmp_path / "cut.tar").read_bytes()
    (tmp_path / "cut.tar").write_bytes(data[:700])  # a truncated archive
    fails(["import", tmp_path / "cut.tar", tmp_path / "dir5"], capsys, "cut.tar")
    assert not any((tmp_path / d).exists() for d in ("dir", "dir2", "dir3", "dir4"))


@pytest.mark.parametrize(
    "command", [["log"], ["show"], ["diff", "main", "main~1"], ["gc"], ["export", "OUT"]]
)
def test_commands_on_a_missing_path_a_file_or_a_plain_directory(tmp_path, capsys, command):
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "notes.txt").write_text("x")
    for target in (tmp_path / "missing", a_file, plain):
        argv = [command[0], target] + [
            tmp_path / "out.tar" if a == "OUT" else a for a in command[1:]
        ]
        fails(argv, capsys, target)
    assert not (tmp_path / "missing").exists()  # gc does not create a repository
    assert not (tmp_path / "out.tar").exists()


def test_inspect_of_a_missing_path_or_a_file(tmp_path, capsys):
    fails(["inspect", tmp_path / "missing"], capsys, tmp_path / "missing")
    (tmp_path / "a_file").write_text("x")
    fails(["inspect", tmp_path / "a_file"], capsys, tmp_path / "a_file")


@pytest.mark.parametrize(
    "command",
    [
        ["show", "nosuchref"],
        ["diff", "main", "nosuchref"],
        ["diff", "nosuchref", "main"],
        ["log", "--branch", "nope"],
        ["gc", "--keep", "nosuchref"],
        ["show", "main~9"],
        ["gc", "--keep-best", "loss"],
    ],
)
def test_unknown_refs_are_one_line_errors(repo, capsys, command):
    fails([command[0], repo] + command[1:], capsys)


def test_a_damaged_repository_is_a_one_line_error_naming_the_file(repo, capsys):
    graph = os.path.join(repo, "graph", "zarr.json")
    with open(graph, "r+b") as f:
        f.seek(40)
        f.write(b"#")
    for command in (
        ["log", repo],
        ["show", repo],
        ["inspect", repo],
        ["gc", repo],
        ["export", repo, os.path.join(os.path.dirname(repo), "o.tar")],
    ):
        fails(command, capsys, graph)


def test_export_into_a_missing_directory(repo, tmp_path, capsys):
    fails(["export", repo, tmp_path / "no" / "such" / "dir" / "out.tar"], capsys, "out.tar")


def test_inspect_of_a_history_with_a_damaged_root_names_the_file(repo, capsys):
    root = os.path.join(repo, "zarr.json")
    with open(root, "r+b") as f:
        f.seek(30)
        f.write(b"#")
    fails(["inspect", repo], capsys, root)
