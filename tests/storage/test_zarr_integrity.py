"""ZarrTier format 2: one digest over the whole record, damaged records stay listed,
format-1 stores still load, zarr's modes, one writer, resuming a failed run."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from vlcc_adjoint.execute import run_adjoint
from vlcc_adjoint.schedules import Level, Multistage, Revolve, io_plan
from vlcc_adjoint.solver import timestep
from vlcc_adjoint.state import flatten, unflatten
from vlcc_adjoint.storage import (
    CorruptCheckpointError,
    MemoryTier,
    StorageError,
    TieredStore,
    ZarrTier,
    make_record,
)
from vlcc_adjoint.storage.format import StoreLockedError


def _state():
    return {"lr": 0.25, "name": "adam", "w": np.arange(5.0), "n": np.array([1, -2, 3], np.int16)}


def _record(state=None, step=3):
    leaves, spec = flatten(_state() if state is None else state)
    spec["step"] = step
    return make_record(spec, leaves)


def _same(a, b) -> bool:
    return (
        a.spec == b.spec
        and a.checksums == b.checksums
        and len(a.leaves) == len(b.leaves)
        and all(
            x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes()
            for x, y in zip(a.leaves, b.leaves)
        )
    )


def _store(path, state=None):
    with ZarrTier(path) as tier:
        tier.put("r", _record(state))
    return os.path.join(path, "r", "zarr.json")


def _edit(path, old: bytes, new: bytes):
    with open(path, "rb") as f:
        data = f.read()
    assert old in data, (old, data)
    with open(path, "wb") as f:
        f.write(data.replace(old, new, 1))


@pytest.mark.parametrize(
    "old,new",
    [
        (b"0.25", b"0.35"),
        (b'{"leaf":0}', b'{"leaf":1}'),
        (b'"adam"', b'"sgd!"'),
        (b'"<i2"', b'">i2"'),
    ],
)
def test_an_edited_value_in_a_record_description_is_reported_naming_the_file(tmp_path, old, new):
    group = _store(str(tmp_path / "s"))
    _edit(group, old, new)
    tier = ZarrTier(tmp_path / "s", mode="r")
    assert list(tier.keys()) == ["r"] and list(tier.damaged()) == ["r"]  # listed, not vanished
    with pytest.raises(CorruptCheckpointError, match="digest") as info:
        tier.get("r")
    assert info.value.path == group and info.value.key == "r" and "'r'" in str(info.value)


def test_the_root_says_format_2_and_records_carry_their_digest(tmp_path):
    group = _store(str(tmp_path / "s"))
    root = json.loads((tmp_path / "s" / "zarr.json").read_text())
    assert root["attributes"]["vlcc_adjoint"]["format"] == 2
    attrs = json.loads(open(group).read())["attributes"]["vlcc_adjoint"]
    assert attrs["format"] == 2 and len(attrs["digest"]) == 32


def _metadata_files(root):
    out = []
    for dirpath, _, files in os.walk(root):
        out += [os.path.join(dirpath, f) for f in files if f in ("zarr.json", "holder")]
    return sorted(out)


def test_flipping_any_byte_of_any_metadata_file_never_returns_wrong_data(tmp_path):
    path = str(tmp_path / "s")
    _store(path)
    want = _record()
    files = _metadata_files(path)
    assert len(files) == 7  # root, lock group and file, scratch, record group, 2 leaf arrays
    outcomes = {"equal": 0, "corrupt": 0}
    for name in files:
        with open(name, "rb") as f:
            original = f.read()
        for pos in range(len(original)):
            # every position with one xor; the record's own description with a second
            for mask in (0x01, 0x22) if name.endswith("r/zarr.json") else (0x01,):
                damaged = bytearray(original)
                damaged[pos] ^= mask
                with open(name, "wb") as f:
                    f.write(damaged)
                try:
                    tier = ZarrTier(path, mode="r")
                except CorruptCheckpointError as err:
                    assert err.path == name, (name, pos, err)
                    outcomes["corrupt"] += 1
                    continue
                except StorageError as err:
                    assert name in str(err), (name, pos, err)
                    outcomes["corrupt"] += 1
                    continue
                assert list(tier.keys()) == ["r"], (name, pos)  # never vanishes
                try:
                    got = tier.get("r")
                except CorruptCheckpointError as err:
                    assert err.path == name and err.key == "r", (name, pos, err)
                    outcomes["corrupt"] += 1
                else:
                    assert _same(got, want), (name, pos)
                    outcomes["equal"] += 1
        with open(name, "wb") as f:
            f.write(original)
    # both outcomes occur: whitespace and files get() does not read are harmless
    assert outcomes["equal"] > 0 and outcomes["corrupt"] > 0
    assert _same(ZarrTier(path, mode="r").get("r"), want)


# -- format 1: stores written before the digest ----------------------------------

_FORMAT_1 = {
    "zarr.json": b'{"zarr_format": 3, "node_type": "group", "attributes": {"vlcc_adjoint": '
    b'{"format": 1, "layout": "one group per checkpoint record"}}}',
    "s3/zarr.json": (
        b'{"zarr_format":3,"node_type":"group","attributes":{"vlcc_adjoint":{"format":1,'
        b'"key":"s3","spec":{"format":"vlcc-state/1","tree":{"dict":["lr","name","w","n"],'
        b'"items":[{"value":0.25},{"value":"adam"},{"leaf":0},{"leaf":1}]},"leaves":[{"dtype":'
        b'"<f8","shape":[3]},{"dtype":"<i2","shape":[2]}],"step":3},"leaves":[{"dtype":"<f8",'
        b'"shape":[3],"nbytes":24,"chunk":"c.0","checksum":"3d53d0cf995c07ac"},{"dtype":"<i2",'
        b'"shape":[2],"nbytes":4,"chunk":"c.0","checksum":"706d9387ba3bbeb3"}]}}}' + b" " * 32
    ),
    "s3/0/zarr.json": b'{"zarr_format":3,"node_type":"array","shape":[3],"data_type":"float64"}',
    "s3/0/c.0": np.arange(3.0).astype("<f8").tobytes(),
    "s3/1/zarr.json": b'{"zarr_format":3,"node_type":"array","shape":[2],"data_type":"int16"}',
    "s3/1/c.0": np.array([1, 2], "<i2").tobytes(),
}


def _write_format_1(path):
    """A store as the format-1 writer left it (one record, two leaves)."""
    for name, data in _FORMAT_1.items():
        os.makedirs(os.path.dirname(os.path.join(path, name)), exist_ok=True)
        with open(os.path.join(path, name), "wb") as f:
            f.write(data)


def test_a_format_1_store_still_loads_and_takes_new_records(tmp_path):
    path = str(tmp_path / "old")
    _write_format_1(path)
    state = {"lr": 0.25, "name": "adam", "w": np.arange(3.0), "n": np.array([1, 2], np.int16)}
    with ZarrTier(path) as tier:
        rec = tier.get("s3")
        got = unflatten(rec.spec, list(rec.leaves))
        assert got["lr"] == 0.25 and got["name"] == "adam" and rec.spec["step"] == 3
        np.testing.assert_array_equal(got["w"], state["w"])
        assert got["n"].dtype == np.int16 and list(got["n"]) == [1, 2]
        tier.put("s4", _record(step=4))
    again = ZarrTier(path, mode="r")
    assert sorted(again.keys()) == ["s3", "s4"] and again.damaged() == {}
    assert _same(again.get("s4"), _record(step=4))
    assert again.format == 1  # the root keeps its format; each record says its own


def test_a_format_2_record_relabelled_format_1_is_refused(tmp_path):
    group = _store(str(tmp_path / "s"))
    _edit(group, b'"format":2', b'"format":1')
    tier = ZarrTier(tmp_path / "s", mode="r")
    with pytest.raises(CorruptCheckpointError, match="format-1 record") as info:
        tier.get("r")
    assert info.value.path == group


# -- modes and the writer lock -----------------------------------------------------


def test_mode_r_reads_and_refuses_writes_with_the_remedy(tmp_path):
    _store(str(tmp_path / "s"))
    tier = ZarrTier(tmp_path / "s", mode="r")
    assert _same(tier.get("r"), _record())
    with pytest.raises(StorageError, match="mode='r'.*mode='a'"):
        tier.put("x", _record())
    with pytest.raises(StorageError, match="mode='r'"):
        tier.delete("r")
    assert list(ZarrTier(tmp_path / "s", mode="r").keys()) == ["r"]


@pytest.mark.parametrize("mode", ["r", "r+"])
def test_reading_modes_need_an_existing_store(tmp_path, mode):
    with pytest.raises(StorageError, match="no zarr store.*mode='a'"):
        ZarrTier(tmp_path / "missing", mode=mode)
    assert not (tmp_path / "missing").exists()


def test_mode_w_empties_a_store_and_w_minus_refuses_one(tmp_path):
    _store(str(tmp_path / "s"))
    with pytest.raises(StorageError, match="mode='w-'"):
        ZarrTier(tmp_path / "s", mode="w-")
    with ZarrTier(tmp_path / "s", mode="w") as tier:
        assert list(tier.keys()) == [] and tier.used_bytes == 0
        tier.put("q", _record())
    assert list(ZarrTier(tmp_path / "s", mode="r+").keys()) == ["q"]
    with ZarrTier(tmp_path / "new", mode="w-") as tier:
        tier.put("a", _record())
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "thesis.tex").write_text("years of work")
    with pytest.raises(StorageError, match="not a zarr v3 group"):
        ZarrTier(tmp_path / "mine", mode="w")
    assert (tmp_path / "mine" / "thesis.tex").read_text() == "years of work"
    with pytest.raises(ValueError, match="'w-'"):
        ZarrTier(tmp_path / "s", mode="rw")


def test_a_second_writer_is_refused_at_open_naming_the_holder_and_leaves_its_scratch(tmp_path):
    first = ZarrTier(tmp_path / "s")
    first.put("a", _record())
    inflight = tmp_path / "s" / ".vlcc-scratch" / "w-inflight"
    inflight.write_bytes(b"a write in flight")
    with pytest.raises(StoreLockedError, match=f"process {os.getpid()} on host"):
        ZarrTier(tmp_path / "s")
    assert inflight.read_bytes() == b"a write in flight"  # the refused opener cleaned nothing
    assert _same(ZarrTier(tmp_path / "s", mode="r").get("a"), _record())  # readers are welcome
    first.put("b", _record(step=4))  # the holder is undisturbed
    first.close()
    with pytest.raises(StorageError, match="closed"):
        first.put("c", _record())
    with ZarrTier(tmp_path / "s") as second:  # free once closed; the holder's leftovers go
        assert sorted(second.keys()) == ["a", "b"] and not inflight.exists()


def test_a_writer_in_another_process_is_named(tmp_path):
    code = (
        "import sys, time; from vlcc_adjoint.storage import ZarrTier; "
        "t = ZarrTier(sys.argv[1]); print('open', flush=True); time.sleep(60)"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    proc = subprocess.Popen(
        [sys.executable, "-c", code, str(tmp_path / "s")],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert proc.stdout.readline().strip() == "open"
        with pytest.raises(StoreLockedError, match=f"process {proc.pid}.*mode='r'"):
            ZarrTier(tmp_path / "s")
    finally:
        proc.kill()
        proc.wait()
    ZarrTier(tmp_path / "s").close()  # a dead holder's lock is free


# -- resuming: a put of a key found at open --------------------------------------


def test_a_put_of_a_key_found_at_open_keeps_an_identical_record_and_replaces_another(tmp_path):
    _store(str(tmp_path / "s"))
    chunk = tmp_path / "s" / "r" / "0" / "c.0"
    inode = os.stat(chunk).st_ino
    with ZarrTier(tmp_path / "s") as tier:
        tier.put("r", _record())  # the same record: kept, nothing written
        assert os.stat(chunk).st_ino == inode
        with pytest.raises(KeyError, match="already"):  # once per opening, as for any key
            tier.put("r", _record())
    other = dict(_state(), lr=0.5, w=np.ones(5))
    with ZarrTier(tmp_path / "s") as tier:
        used = tier.used_bytes
        tier.put("r", _record(other))
        assert _same(tier.get("r"), _record(other)) and tier.used_bytes == used
    again = ZarrTier(tmp_path / "s", mode="r")
    assert _same(again.get("r"), _record(other)) and again.used_bytes == used


def test_a_put_of_an_identical_record_whose_data_was_damaged_writes_it_anew(tmp_path):
    _store(str(tmp_path / "s"))
    chunk = tmp_path / "s" / "r" / "0" / "c.0"
    data = bytearray(chunk.read_bytes())
    data[3] ^= 0x10
    chunk.write_bytes(data)
    with ZarrTier(tmp_path / "s") as tier:
        tier.put("r", _record())  # same digest, but the data no longer matches it
        assert _same(tier.get("r"), _record())
    assert _same(ZarrTier(tmp_path / "s", mode="r").get("r"), _record())


def test_a_damaged_record_is_not_overwritten_until_deleted(tmp_path):
    group = _store(str(tmp_path / "s"))
    _edit(group, b"0.25", b"0.35")
    with ZarrTier(tmp_path / "s") as tier:
        with pytest.raises(StorageError, match=r"delete it first.*tier.delete\('r'\)"):
            tier.put("r", _record())
        tier.delete("r")
        tier.put("r", _record())
        assert _same(tier.get("r"), _record())


DT = 0.05


def _solver(fail_at=None):
    rng = np.random.default_rng(5)
    B = rng.standard_normal((6, 6)) * 0.5

    @timestep
    def step(u, i):
        if i == fail_at:
            raise FloatingPointError(f"blew up at step {i}")
        return u + DT * (-(u**3) + B @ u)

    @step.adjoint
    def step_adjoint(u, lam, i):
        return lam + DT * (-3 * u**2 * lam + B.T @ lam)

    return step, rng.standard_normal(6) * 0.5


def _reference(step, u0, n):
    states = [u0]
    for i in range(n):
        states.append(step(states[-1], i))
    lam = states[-1].copy()
    for i in range(n - 1, -1, -1):
        lam = step.adjoint(states[i], lam, i)
    return lam


@pytest.mark.parametrize("levels", ["disk", "memory+disk"])
@pytest.mark.parametrize("same_start", [True, False])
def test_rerunning_a_failed_run_on_the_same_zarr_path_gives_the_right_gradient(
    tmp_path, levels, same_start
):
    n = 30

    def store():
        if levels == "disk":  # every state on disk: the rerun saves u_0 first, under its old key
            return TieredStore([ZarrTier(tmp_path / "disk")], plan=io_plan(schedule))
        return TieredStore([MemoryTier(), ZarrTier(tmp_path / "disk")], plan=io_plan(schedule))

    schedule = Revolve(n, 4) if levels == "disk" else Multistage(n, [Level(2), Level(4, 5.0, 5.0)])
    failing, u0 = _solver(fail_at=21)
    with pytest.raises(FloatingPointError, match="step 21"):
        run_adjoint(failing, schedule, u0, lambda u: u, store=store())
    assert len(list(ZarrTier(tmp_path / "disk", mode="r").keys())) > 0  # records were left
    step, _ = _solver()
    if not same_start:
        u0 = u0 * 0.9  # every stored state differs: each is replaced
    result = run_adjoint(step, schedule, u0, lambda u: u, store=store())
    np.testing.assert_allclose(result.adjoint, _reference(step, u0, n), rtol=1e-13)


def test_plain_zarr_lists_the_store_without_unknown_objects_while_a_writer_holds_it(tmp_path):
    import warnings

    zarr = pytest.importorskip("zarr")
    with ZarrTier(tmp_path / "s") as tier:
        tier.put("r", _record())
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # zarr warns about objects that are not nodes
            group = zarr.open_group(str(tmp_path / "s"), mode="r")
            assert "r" in set(group.group_keys())
            np.testing.assert_array_equal(group["r"]["0"][...], _record().leaves[0])


# -- ZarrTier.verify and vlcc verify -------------------------------------------------------


def _flip(path, at=None) -> None:
    data = bytearray(open(path, "rb").read())
    data[len(data) // 2 if at is None else at] ^= 1
    with open(path, "r+b") as f:
        f.write(bytes(data))


def _three(path):
    with ZarrTier(path) as tier:
        for k in range(3):
            tier.put(f"r{k}", _record(step=k))


@pytest.mark.parametrize(
    "file", ["r1/0/c.0", "r1/zarr.json", "r1/0/zarr.json", "r1/1/c.0", "r1/1/zarr.json"]
)
def test_verify_names_a_flipped_byte_in_any_record_file_and_its_record(tmp_path, capsys, file):
    from vlcc_adjoint.cli import main as vlcc

    path = tmp_path / "s"
    _three(path)
    with ZarrTier(path, mode="r") as tier:
        assert tier.verify() == []
        _flip(path / file)
        found = tier.verify()
    assert [(e.path, e.key) for e in found] == [(str(path / file), "r1")]
    assert vlcc(["verify", str(path)]) == 1
    out, err = capsys.readouterr()
    lines = out.strip().splitlines()
    assert err == "" and len(lines) == 2
    assert lines[0].startswith(f"damaged: {path / file}: breaks record r1 (")
    assert "1 damaged file breaks 1 of 3 records" in lines[1]


def test_verify_of_a_clean_store_and_of_a_damaged_root(tmp_path, capsys):
    from vlcc_adjoint.cli import main as vlcc

    path = tmp_path / "s"
    _three(path)
    assert vlcc(["verify", str(path)]) == 0
    out, _ = capsys.readouterr()
    assert out.strip().splitlines() == [
        f"verified ZarrTier store {path}: 3 records ({out.split('(')[1].split(')')[0]}), no damage"
    ]
    with ZarrTier(path, mode="r") as tier:
        root = (path / "zarr.json").read_bytes()
        _flip(path / "zarr.json", root.index(b'"format":2') + 9)  # the one value read
        found = tier.verify()
    assert [e.path for e in found] == [str(path / "zarr.json")]
    assert vlcc(["verify", str(path)]) == 1
    out, _ = capsys.readouterr()
    assert out.startswith(f"damaged: {path / 'zarr.json'}: breaks every record")


def test_verify_names_a_missing_chunk_file_and_several_damaged_records(tmp_path):
    path = tmp_path / "s"
    _three(path)
    os.unlink(path / "r0" / "1" / "c.0")
    _flip(path / "r2" / "zarr.json")
    with ZarrTier(path, mode="r") as tier:
        found = tier.verify()
    assert sorted((e.key, os.path.relpath(e.path, path)) for e in found) == [
        ("r0", "r0/1/c.0"),
        ("r2", "r2/zarr.json"),
    ]
    assert "missing" in str(found[0])
