"""C programs run adjoints through ``vlcc.h``: the answers, the examples, bad calls, threads."""

from __future__ import annotations

import json

import pytest
from capi_support import EXAMPLES, PROGRAMS, SCHEDULES, run_program


@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_every_answer_finds_the_regions_holding_the_state_it_names(name, c_program, tmp_path):
    config, steps = SCHEDULES[name]
    exe = c_program(PROGRAMS / "answers.c")
    out = run_program(exe, json.dumps(config), str(steps), cwd=tmp_path).stdout
    assert out.startswith("ok:"), out
    assert f"1 turn, {steps} adjoint steps" in out


def test_the_answers_check_catches_a_wrong_step_count(c_program, tmp_path):
    """The checker fails when the run's answers do not match its rules (here:
    it is told a step count the schedule does not have)."""
    exe = c_program(PROGRAMS / "answers.c")
    config = json.dumps(SCHEDULES["revolve"][0])
    proc = run_program(exe, config, "41", cwd=tmp_path, check=False)
    assert proc.returncode == 1
    assert "violation" in proc.stdout


def test_the_c_example_gradients_are_bitwise_those_of_store_all_and_pass_taylor(
    c_program, tmp_path
):
    exe = c_program(EXAMPLES / "c" / "heat_adjoint.c")
    out = run_program(exe, str(tmp_path), cwd=tmp_path).stdout
    assert "Revolve(500, 10) gradient bitwise equal to store-all: yes" in out
    assert "Multistage(memory 3 + zarr disk 12) gradient bitwise equal to store-all: yes" in out
    assert "Taylor test passed: yes" in out


def _results(stdout: str) -> dict[str, tuple[int, str]]:
    rows = {}
    for line in stdout.splitlines():
        if line.count("|") >= 2:
            name, code, message = line.split("|", 2)
            rows[name] = (int(code), message)
    return rows


#: name -> (code, a part of the message); 1 argument, 2 handle, 3 state, 4 storage.
BAD_CALLS = {
    "next_null_before_start": (2, "run is NULL"),
    "close_garbage_before_start": (2, "not an open run handle"),
    "open_null_out": (1, "run is NULL"),
    "open_null_config": (1, "config_json is NULL"),
    "open_bad_json": (1, "config_json is not valid JSON"),
    "open_unknown_kind": (1, "kind of ['multistage', 'online', 'periodic', 'revolve', 'storeall']"),
    "open_missing_argument": (1, "snapshots"),
    "open_unknown_key": (1, "unknown keys ['stor']"),
    "open_bad_tier": (1, "store.tiers[0]"),
    "open_null_left": (0, ""),
    "next_before_protect": (3, "before any region is protected"),
    "protect_unknown_dtype": (1, "unknown dtype 'double'"),
    "protect_null_name": (1, "name is NULL"),
    "protect_null_dtype": (1, "dtype is NULL"),
    "protect_bad_ndim": (1, "ndim is -2"),
    "protect_null_shape": (1, "shape is NULL"),
    "protect_negative_extent": (1, "every extent must be an integer >= 0"),
    "protect_null_data": (1, "address NULL"),
    "protect_empty_name": (1, "not empty"),
    "protect_twice_same_name": (1, "'u' is already protected"),
    "protect_twice_same_memory": (1, "overlaps region 'u'"),
    "next_null_action": (1, "action is NULL"),
    "protect_after_start": (3, "after the run started"),
    "run_to_done": (0, ""),
    "next_after_done": (3, "the run is over"),
    "next_after_done_again": (3, "the run is over"),
    "close": (0, ""),
    "close_closed": (2, "not an open run handle"),
    "next_closed": (2, "not an open run handle"),
    "protect_closed": (2, "not an open run handle"),
    "close_null": (2, "run is NULL"),
    "next_garbage": (2, "not an open run handle"),
    "next_store_full": (4, "does not fit on level 0"),
    "next_after_failure": (3, "an earlier vlcc_run_next of this run failed"),
    "close_failed_run": (0, ""),
    "history_open_bad_mode": (1, "mode must be 'r'"),
    "history_open_null_path": (1, "path is NULL"),
    "history_open_w_refuses": (1, "holds no history"),
    "history_open": (0, ""),
    "history_commit_before_protect": (3, "before any region is protected"),
    "history_protect_twice": (1, "already protected"),
    "history_commit_small_buffer": (1, "needs 13"),
    "history_commit": (0, ""),
    "history_checkout_unknown": (1, "'no-such-ref' names no branch"),
    "history_checkout_null": (1, "ref is NULL"),
    "history_as_run": (2, "not an open run handle"),
    "history_close": (0, ""),
    "history_close_closed": (2, "not an open history handle"),
    "history_commit_closed": (2, "not an open history handle"),
    "history_open_read_only": (0, ""),
    "history_commit_read_only": (4, "read-only"),
}


def test_bad_calls_get_a_code_and_a_message_never_a_crash(c_program, tmp_path):
    (tmp_path / "not-a-history").mkdir()
    (tmp_path / "not-a-history" / "data.txt").write_text("someone's data")
    exe = c_program(PROGRAMS / "errors.c")
    proc = run_program(exe, str(tmp_path), cwd=tmp_path)
    assert proc.stdout.rstrip().endswith("the end"), proc.stdout
    got = _results(proc.stdout)
    for name, (code, part) in BAD_CALLS.items():
        assert name in got, f"{name} did not run:\n{proc.stdout}"
        assert got[name][0] == code, f"{name}: {got[name]}"
        assert part in got[name][1], f"{name}: {got[name]}"
        if code:  # every message names the function that failed
            assert got[name][1].startswith("vlcc_"), f"{name}: {got[name]}"
    # mode 'w' never empties a directory that is not a history
    assert (tmp_path / "not-a-history" / "data.txt").read_text() == "someone's data"


def test_runs_from_several_threads_at_once(c_program, tmp_path):
    exe = c_program(PROGRAMS / "threads.c")
    assert "ok: 4 threads" in run_program(exe, cwd=tmp_path, timeout=120).stdout


def test_the_store_writes_a_slow_level_while_the_program_computes(c_program, tmp_path):
    """libvlcc releases the GIL between calls: the zarr level's write, queued
    by the save before the first answer, completes while the program waits
    without calling the library (with the GIL held it never would)."""
    exe = c_program(PROGRAMS / "background.c")
    out = run_program(exe, str(tmp_path / "bg.zarr"), cwd=tmp_path, timeout=120).stdout
    assert "written while the program waited" in out
