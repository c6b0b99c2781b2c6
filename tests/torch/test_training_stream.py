"""VlccCheckpointEngine, wait_on_commit="captured" with deferred capture: the live
leaves are written straight from the training's tensors; the commit writes what is
not written by then alongside the capture thread (or, with copy_on_commit, copies
it), and the version holds the state as saved."""

import threading
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from vlcc_adjoint.errors import VlccRuntimeError  # noqa: E402
from vlcc_adjoint.lineage import History  # noqa: E402
from vlcc_adjoint.torch import VlccCheckpointEngine  # noqa: E402


def _setup(tmp_path, **kw):
    torch.manual_seed(5)
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 64), torch.nn.BatchNorm1d(64), torch.nn.Linear(64, 8)
    )
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    engine = VlccCheckpointEngine(tmp_path / "h", model=model, optimizer=opt, **kw)
    engine.guard(opt)
    return model, opt, engine


def _train(model, opt):
    model(torch.randn(16, 64)).square().mean().backward()
    opt.step()
    opt.zero_grad()


def _snapshot(model, opt):
    return {
        "module": {k: v.clone() for k, v in model.state_dict().items()},
        "optimizer": {
            k: {kk: vv.clone() for kk, vv in v.items()}
            for k, v in opt.state_dict()["state"].items()
        },
    }


def _check(got, want):
    for k, v in want["module"].items():
        np.testing.assert_array_equal(got["module"][k].numpy(), v.numpy(), err_msg=k)
    for k, st in want["optimizer"].items():
        for kk, vv in st.items():
            np.testing.assert_array_equal(got["optimizer"]["state"][k][kk].numpy(), vv.numpy())


@pytest.mark.parametrize("commit_early", [True, False])
def test_streamed_capture_copies_only_what_is_not_written_at_the_commit(
    tmp_path, monkeypatch, commit_early
):
    model, opt, engine = _setup(tmp_path, copy_on_commit=True)
    _train(model, opt)
    history = engine.history()
    slow = threading.Event()
    real_stage = History.stage

    def stage(self, arrays, **kw):  # the write of a leaf, slowed when asked
        if slow.is_set():
            time.sleep(0.05)
        return real_stage(self, arrays, **kw)

    monkeypatch.setattr(History, "stage", stage)
    if commit_early:
        slow.set()  # the optimizer step comes while leaves are still unwritten
    want = _snapshot(model, opt)
    state = {"module": model.state_dict(), "optimizer": opt.state_dict()}
    engine.save(state, str(tmp_path / "ckpt.pt"))
    job = engine._pending[-1]
    assert job.streamed
    if not commit_early:  # the forward and backward passes outlast the write
        deadline = time.monotonic() + 60
        while job.position < len(job.order) and time.monotonic() < deadline:
            time.sleep(0.01)
    _train(model, opt)  # guard: commit before the step changes the weights
    copies = engine._copies.allocated + engine._copies.reused
    if commit_early:
        assert copies > 0
    else:
        assert copies == 0  # nothing copied: every leaf was written from the live tensors
    for _ in range(3):  # later steps change the weights the version must not see
        _train(model, opt)
    engine.close()
    assert history.path
    got = VlccCheckpointEngine().load(str(tmp_path / "ckpt.pt"))
    _check(got, want)


def test_streamed_capture_reuses_the_commit_copies_and_keeps_every_version(tmp_path, monkeypatch):
    model, opt, engine = _setup(tmp_path, copy_on_commit=True)
    real_stage = History.stage

    def stage(self, arrays, **kw):  # slow writes: each commit finds leaves unwritten
        time.sleep(0.02)
        return real_stage(self, arrays, **kw)

    monkeypatch.setattr(History, "stage", stage)
    wants = []
    for i in range(4):
        _train(model, opt)
        wants.append(_snapshot(model, opt))
        state = {"module": model.state_dict(), "optimizer": opt.state_dict()}
        engine.save(state, str(tmp_path / f"c{i}.pt"))
        engine.commit()  # at once: live leaves are still unwritten
        engine.wait()  # their copies written: back in the pool for the next commit
    engine.close()
    assert engine._copies.reused > 0 and engine._copies.free_bytes <= engine._copies.max_free_bytes
    reader = VlccCheckpointEngine()
    for i, want in enumerate(wants):
        _check(reader.load(str(tmp_path / f"c{i}.pt")), want)
    reader.close()


def test_a_commit_that_cannot_copy_publishes_no_torn_version(tmp_path, monkeypatch):
    torch.manual_seed(6)
    model = torch.nn.Linear(64, 64)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    _train(model, opt)
    engine = VlccCheckpointEngine(tmp_path / "h", model=model, optimizer=opt, copy_on_commit=True)
    real_stage = History.stage

    def stage(self, arrays, **kw):  # slow writes: the commit finds leaves unwritten
        time.sleep(0.05)
        return real_stage(self, arrays, **kw)

    def take(dtype, shape):
        raise MemoryError("no room for the copy")

    monkeypatch.setattr(History, "stage", stage)
    monkeypatch.setattr(engine._copies, "take", take)
    state = {"module": model.state_dict(), "optimizer": opt.state_dict()}
    engine.save(state, str(tmp_path / "torn.pt"))
    with pytest.raises(MemoryError):
        engine.commit()
    with pytest.raises(VlccRuntimeError, match="could not write or copy"):
        engine.wait()
    assert not (tmp_path / "torn.pt").exists()
    with History(tmp_path / "h", mode="r") as h:
        assert len(h.log()) == 0
    engine.close()


def test_an_early_commit_writes_the_live_leaves_left_itself_without_a_copy(tmp_path, monkeypatch):
    model, opt, engine = _setup(tmp_path)
    _train(model, opt)
    history = engine.history()
    writers: list[str] = []
    real_stage = History.stage

    def stage(self, arrays, **kw):  # slow writes: the commit finds leaves unwritten
        writers.append(threading.current_thread().name)
        time.sleep(0.05)
        return real_stage(self, arrays, **kw)

    monkeypatch.setattr(History, "stage", stage)
    want = _snapshot(model, opt)
    state = {"module": model.state_dict(), "optimizer": opt.state_dict()}
    engine.save(state, str(tmp_path / "ckpt.pt"))
    job = engine._pending[-1]
    live = sum(job.state[2])
    assert job.streamed and live > 2
    _train(model, opt)  # guard: commit at once, before the step changes the weights
    assert job.captured.is_set()
    with engine._lock:
        assert job.inflight == 0
        assert all(job.entries[k] is not None for k in job.order[:live])  # every live leaf
    assert engine._copies.allocated + engine._copies.reused == 0  # and no copy
    assert threading.current_thread().name in writers  # the commit wrote some of them
    assert "vlcc-ds-capture" in writers  # and the capture thread others
    for _ in range(3):  # later steps change the weights the version must not see
        _train(model, opt)
    engine.close()
    assert history.path
    got = VlccCheckpointEngine().load(str(tmp_path / "ckpt.pt"))
    _check(got, want)


def test_a_commit_that_cannot_write_publishes_no_torn_version(tmp_path, monkeypatch):
    torch.manual_seed(6)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 64))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    _train(model, opt)
    engine = VlccCheckpointEngine(tmp_path / "h", model=model, optimizer=opt)
    committer = threading.current_thread()
    real_stage = History.stage

    def stage(self, arrays, **kw):  # the capture thread is slow, the commit's writes fail
        if threading.current_thread() is committer:
            raise OSError(28, "No space left on device")
        time.sleep(0.05)
        return real_stage(self, arrays, **kw)

    monkeypatch.setattr(History, "stage", stage)
    state = {"module": model.state_dict(), "optimizer": opt.state_dict()}
    engine.save(state, str(tmp_path / "torn.pt"))
    with pytest.raises(OSError, match="No space"):
        engine.commit()
    with pytest.raises(VlccRuntimeError, match="could not write or copy"):
        engine.wait()
    assert not (tmp_path / "torn.pt").exists()
    with History(tmp_path / "h", mode="r") as h:
        assert len(h.log()) == 0
    engine.close()
