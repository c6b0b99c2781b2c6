"""vlcc_adjoint.torch: checkpoint_sequence, saved-tensor offload, state providers,
the checkpoint engine's interface (without DeepSpeed) and loading hostile files."""

import collections
import json
import os
import pickle
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")

from vlcc_adjoint import Level, Multistage, Revolve, StoreAll, io_plan, simulate  # noqa: E402
from vlcc_adjoint import state as vstate  # noqa: E402
from vlcc_adjoint.storage import (  # noqa: E402
    CorruptCheckpointError,
    DeviceTier,
    MemoryTier,
    TieredStore,
    ZarrTier,
)
from vlcc_adjoint.torch import (  # noqa: E402
    VlccCheckpointEngine,
    checkpoint_sequence,
    offload_saved_tensors,
    plan_sequence,
    restore_training_state,
    training_state,
)

torch.set_num_threads(1)
RTOL = 1e-10


def _close(a, b):
    return torch.allclose(a, b, rtol=RTOL, atol=1e-14)


class Residual(torch.nn.Module):
    """u + h * MLP(u): one block of a residual stack (a neural-ODE Euler step)."""

    def __init__(self, width=12):
        super().__init__()
        self.mlp = torch.nn.Sequential(
            torch.nn.Linear(width, 2 * width), torch.nn.Tanh(), torch.nn.Linear(2 * width, width)
        )

    def forward(self, u):
        return u + 0.2 * self.mlp(u)


class Counted:
    def __init__(self, f):
        self.f, self.calls = f, 0

    def __call__(self, *args):
        self.calls += 1
        return self.f(*args)


def _rnn_problem(n=37, seed=0):
    torch.manual_seed(seed)
    cell = torch.nn.RNNCell(5, 9).double()
    xs = torch.randn(n, 3, 5, dtype=torch.double, requires_grad=True)
    h0 = torch.randn(3, 9, dtype=torch.double, requires_grad=True)
    return cell, xs, h0


def _plain_rnn(cell, xs, h0, n):
    h = h0
    for i in range(n):
        h = cell(xs[i], h)
    return h


def _multilevel(n, tmp_path):
    """A three-level schedule and its store: the tensors' device slots, memory, disk."""
    schedule = Multistage(n, [Level(2, 0, 0), Level(2, 0.5, 0.5), Level(3, 2.0, 2.0)])
    peaks = simulate(schedule).peak_slots
    assert peaks[1] > 0 and peaks[2] > 0  # all three levels are used
    plan = io_plan(schedule)
    store = TieredStore([DeviceTier(), MemoryTier(), ZarrTier(tmp_path / "zarr")], plan=plan)
    return schedule, store


# -- checkpoint_sequence ----------------------------------------------------------------


@pytest.mark.parametrize("kind", ["revolve", "multistage"])
def test_checkpoint_sequence_rnn_gradients_equal_autograd(kind, tmp_path):
    n = 37
    cell, xs, h0 = _rnn_problem(n)
    loss = _plain_rnn(cell, xs, h0, n).square().sum()
    loss.backward()
    want = [h0.grad.clone(), xs.grad.clone()] + [p.grad.clone() for p in cell.parameters()]
    for t in [h0, xs, *cell.parameters()]:
        t.grad = None
    store = None
    schedule = Revolve(n, 5)
    if kind == "multistage":
        schedule, store = _multilevel(n, tmp_path)
    out = checkpoint_sequence(cell, h0, n, inputs=xs, schedule=schedule, store=store)
    out.square().sum().backward()  # module parameters get .grad through loss.backward()
    got = [h0.grad, xs.grad] + [p.grad for p in cell.parameters()]
    assert all(_close(a, b) for a, b in zip(got, want))
    if store is not None:
        # Every level's Saves and Loads went through the store (device, memory, disk;
        # restores may be served by its read-ahead instead of the tier).  The disk
        # level is written in the background: a record deleted before the writer
        # reaches it is never put (its loads were served from the staged copy), so
        # a loaded machine may put fewer there than the schedule writes.
        stats, want_io = store.stats(), simulate(schedule)
        assert stats.saves == sum(want_io.writes)
        assert [t.puts for t in stats.tiers[:2]] == list(want_io.writes[:2])
        assert stats.tiers[2].puts <= want_io.writes[2]
        assert stats.loads == sum(want_io.reads) and stats.tiers[0].gets == want_io.reads[0]
        assert store.steps(0) == store.steps(1) == store.steps(2) == []  # the run cleaned up
        store.close()


@pytest.mark.parametrize("kind", ["revolve", "multistage"])
def test_checkpoint_sequence_residual_stack_under_autograd_grad(kind, tmp_path):
    n = 29
    torch.manual_seed(1)
    block = Residual().double()
    x = torch.randn(4, 12, dtype=torch.double, requires_grad=True)
    u = x
    for _ in range(n):
        u = block(u)
    params = list(block.parameters())
    want = torch.autograd.grad(u.sum() + u.square().mean(), [x, *params])
    schedule, store = (Revolve(n, 4), None) if kind == "revolve" else _multilevel(n, tmp_path)
    out = checkpoint_sequence(block, x, n, schedule=schedule, store=store)
    got = torch.autograd.grad(out.sum() + out.square().mean(), [x, *params])
    assert all(_close(a, b) for a, b in zip(got, want))
    assert all(p.grad is None for p in params)  # autograd.grad does not accumulate
    if store is not None:
        store.close()


@pytest.mark.parametrize("schedule", [Revolve(41, 6), Revolve(41, 2), StoreAll(41), "multi"])
def test_step_evaluations_are_the_schedules_forward_count_plus_n(schedule, tmp_path):
    n = 41
    store = None
    if schedule == "multi":
        schedule, store = _multilevel(n, tmp_path)
    torch.manual_seed(2)
    block = Residual(6).double()
    step = Counted(block)
    x = torch.randn(2, 6, dtype=torch.double, requires_grad=True)
    checkpoint_sequence(step, x, n, schedule=schedule, store=store).sum().backward()
    # The schedule's recomputations, plus each step once with grad (Reverse).
    assert step.calls == simulate(schedule).forward_count + n
    if store is not None:
        store.close()


def test_blocks_of_steps_reproduce_checkpoint_sequential_cost():
    n, block = 40, 8
    torch.manual_seed(3)
    layer = Residual(6).double()
    step = Counted(layer)
    x = torch.randn(2, 6, dtype=torch.double, requires_grad=True)
    u = x
    for _ in range(n):
        u = layer(u)
    want = torch.autograd.grad(u.sum(), [x, *layer.parameters()])
    out = checkpoint_sequence(step, x, n, schedule=StoreAll(n // block), block=block)
    got = torch.autograd.grad(out.sum(), [x, *layer.parameters()])
    assert all(_close(a, b) for a, b in zip(got, want))
    # checkpoint_sequential with 5 segments: n untaped-or-taped evaluations in the
    # forward pass and one recomputation of every segment but the last.
    assert step.calls == n + (n - block)


def test_plan_sequence_never_recomputes_more_than_checkpoint_sequential():
    n = 2000
    for s in [2, 4, 10, 45, 100, 400]:
        k = -(-n // s)  # checkpoint_sequential's segment length; it re-tapes all but one
        plan = plan_sequence(n, s + k)
        assert plan.memory <= s + k
        assert plan.recomputed <= k * (-(-n // k) - 1)
    below = plan_sequence(n, 10)  # checkpoint_sequential needs >= 2 sqrt(n) ~ 90 states
    assert below.memory <= 10 and below.snapshots + below.block <= 10
    with pytest.raises(ValueError, match="cannot hold"):
        plan_sequence(n, 1.5)


def test_lstm_tuple_state_and_a_module_found_through_a_closure():
    n = 23
    torch.manual_seed(4)
    cell = torch.nn.LSTMCell(4, 6).double()
    xs = torch.randn(n, 2, 4, dtype=torch.double)
    h0 = torch.zeros(2, 6, dtype=torch.double, requires_grad=True)
    c0 = torch.zeros(2, 6, dtype=torch.double)

    def plain():
        h, c = h0, c0
        for i in range(n):
            h, c = cell(xs[i], (h, c))
        return h.sum() + c.square().sum()

    want = torch.autograd.grad(plain(), [h0, *cell.parameters()])

    def step(x, hc):  # closes over `cell`: its parameters are found
        return cell(x, hc)

    h, c = checkpoint_sequence(step, (h0, c0), n, inputs=xs, snapshots=3)
    got = torch.autograd.grad(h.sum() + c.square().sum(), [h0, *cell.parameters()])
    assert all(_close(a, b) for a, b in zip(got, want))


def test_unlisted_tensor_that_requires_grad_is_reported():
    class Holder:
        def __init__(self):
            self.w = torch.randn(3, 3, dtype=torch.double, requires_grad=True)

        def step(self, u):
            return torch.tanh(u @ self.w)

    holder = Holder()
    x = torch.randn(2, 3, dtype=torch.double, requires_grad=True)
    out = checkpoint_sequence(holder.step, x, 6)
    with pytest.raises(ValueError, match=r"shape \(3, 3\).*params="):
        out.sum().backward()
    # ... and listing it works.
    u = x
    for _ in range(6):
        u = holder.step(u)
    want = torch.autograd.grad(u.sum(), [x, holder.w])
    out = checkpoint_sequence(holder.step, x, 6, params=[holder.w])
    got = torch.autograd.grad(out.sum(), [x, holder.w])
    assert all(_close(a, b) for a, b in zip(got, want))


def test_dropout_is_replayed_and_the_generator_ends_where_plain_leaves_it():
    n = 17
    torch.manual_seed(5)
    block = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Dropout(0.3)).double()
    x = torch.randn(4, 8, dtype=torch.double, requires_grad=True)
    torch.manual_seed(123)
    u = x
    for _ in range(n):
        u = u + block(u)
    want = torch.autograd.grad(u.sum(), [x, *block.parameters()])
    after_plain = torch.rand(3)
    torch.manual_seed(123)
    out = checkpoint_sequence(lambda v: v + block(v), x, n, snapshots=3)
    after_ours = torch.rand(3)
    got = torch.autograd.grad(out.sum(), [x, *block.parameters()])
    assert torch.equal(after_plain, after_ours)
    assert all(_close(a, b) for a, b in zip(got, want))


def test_without_grad_it_is_the_plain_loop_and_backward_runs_once():
    cell, xs, h0 = _rnn_problem(9)
    with torch.no_grad():
        assert torch.equal(checkpoint_sequence(cell, h0, 9, inputs=xs), _plain_rnn(cell, xs, h0, 9))
    out = checkpoint_sequence(cell, h0, 9, inputs=xs)
    loss = out.sum()
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="once per forward"):
        loss.backward()


def test_bad_arguments_say_what_to_do():
    x = torch.ones(2, requires_grad=True)
    with pytest.raises(ValueError, match="schedule is for 5 steps"):
        checkpoint_sequence(torch.tanh, x, 7, schedule=Revolve(5, 2))
    with pytest.raises(TypeError, match="tensor or a tuple/list of tensors"):
        checkpoint_sequence(torch.tanh, {"u": x}, 3)
    with pytest.raises(ValueError, match="same shapes and dtypes"):
        checkpoint_sequence(lambda u: u.sum(), x, 3)
    three = Multistage(6, [Level(1), Level(1, 1, 1), Level(2, 2, 2)])
    two = Multistage(6, [Level(1), Level(3, 1, 1)])
    with TieredStore([DeviceTier(), MemoryTier()], plan=io_plan(two)) as store:
        with pytest.raises(ValueError, match=r"levels 0..2.*give it 3 tiers"):
            checkpoint_sequence(torch.tanh, x, 6, store=store, schedule=three)
    with TieredStore([DeviceTier(), MemoryTier(), MemoryTier()], plan=io_plan(three)) as store:
        with pytest.raises(ValueError, match="plan is for"):
            checkpoint_sequence(torch.tanh, x, 6, store=store, schedule=Revolve(6, 2))
    with TieredStore([DeviceTier(), MemoryTier()]) as store:
        with pytest.raises(ValueError, match=r"runs the schedule's plan.*io_plan\(schedule\)"):
            checkpoint_sequence(torch.tanh, x, 6, store=store)
    with TieredStore([MemoryTier()], plan=io_plan(Revolve(6, 2))) as store:
        with pytest.raises(ValueError, match="no DeviceTier for level 0"):
            checkpoint_sequence(torch.tanh, x, 6, store=store, schedule=Revolve(6, 2))
    with pytest.raises(TypeError, match="must be a vlcc_adjoint.storage.TieredStore"):
        checkpoint_sequence(torch.tanh, x, 6, store=[MemoryTier()])
    # The earlier form (host tiers, no plan, tier k - 1 = level k) with too few tiers.
    store = TieredStore([MemoryTier()], plan=None)
    with pytest.warns(DeprecationWarning), pytest.raises(ValueError, match="levels 1..2"):
        checkpoint_sequence(torch.tanh, x, 6, store=store, schedule=three)
    store.close()


def test_the_earlier_store_form_warns_and_its_tiers_hold_the_host_levels(tmp_path):
    n = 31
    cell, xs, h0 = _rnn_problem(n)
    want = torch.autograd.grad(_plain_rnn(cell, xs, h0, n).sum(), [h0, *cell.parameters()])
    schedule = Multistage(n, [Level(2, 0, 0), Level(3, 1.0, 1.0)])
    assert simulate(schedule).writes[1] > 0
    disk = ZarrTier(tmp_path / "zarr")
    puts = []
    real_put = disk.put

    def put(key, record):
        puts.append(key)
        return real_put(key, record)

    disk.put = put
    store = TieredStore([disk])  # tier k - 1 holds level k, no plan
    with pytest.warns(DeprecationWarning, match=r"deprecated.*plan=io_plan\(schedule\)"):
        out = checkpoint_sequence(cell, h0, n, inputs=xs, schedule=schedule, store=store)
    got = torch.autograd.grad(out.sum(), [h0, *cell.parameters()])
    assert all(_close(a, b) for a, b in zip(got, want))
    assert len(puts) == simulate(schedule).writes[1]  # level 1 went to the caller's tier
    assert list(disk.keys()) == []  # ... and the run deleted what it wrote there
    store.save(0, {"still": torch.ones(2)}, 0)  # the caller's store is still open
    store.close()


def test_one_planned_store_serves_run_after_run_and_reads_restores_ahead(tmp_path):
    n = 40
    cell, xs, h0 = _rnn_problem(n)
    want = torch.autograd.grad(_plain_rnn(cell, xs, h0, n).sum(), [h0, *cell.parameters()])
    schedule = Multistage(n, [Level(2, 0, 0), Level(6, 2.0, 2.0)])
    reads = simulate(schedule).reads[1]
    assert reads > 0
    with TieredStore(
        [DeviceTier(), ZarrTier(tmp_path / "disk")], plan=io_plan(schedule), workers=2
    ) as store:
        # A forward pass whose backward never runs leaves records behind ...
        checkpoint_sequence(cell, h0, n, inputs=xs, schedule=schedule, store=store)
        assert store.steps(0) or store.steps(1)
        for _ in range(2):  # ... which the next run's restart of the plan deletes.
            out = checkpoint_sequence(cell, h0, n, inputs=xs, schedule=schedule, store=store)
            got = torch.autograd.grad(out.sum(), [h0, *cell.parameters()])
            assert all(_close(a, b) for a, b in zip(got, want))
            assert store.steps(0) == store.steps(1) == []
        stats = store.stats()
    assert stats.prefetch_hits + stats.staged_hits > 0  # the plan read restores ahead


def test_a_kept_state_changed_in_place_is_refused_at_its_load():
    armed = [False]

    def step(u):
        if armed[0] and not torch.is_grad_enabled():
            u.mul_(1.0)  # changes its argument in place, during a recomputation
        return torch.tanh(u)

    x = torch.randn(3, dtype=torch.double, requires_grad=True)
    out = checkpoint_sequence(step, x, 10, schedule=Revolve(10, 2))
    armed[0] = True
    with pytest.raises(RuntimeError, match=r"snapshot of step \d+ was modified in place"):
        out.sum().backward()


# -- saved-tensor offload ---------------------------------------------------------------


def _mlp(depth=12, width=256):
    torch.manual_seed(6)
    return torch.nn.Sequential(
        *[torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.Tanh()) for _ in range(depth)]
    )


def _grads(model, x, ctx=None):
    model.zero_grad()
    x.grad = None
    if ctx is None:
        loss = model(x).square().sum()
    else:
        with ctx:
            loss = model(x).square().sum()
    loss.backward()
    return [x.grad.clone()] + [p.grad.clone() for p in model.parameters()]


def test_offload_gives_identical_gradients_within_the_budget(tmp_path):
    model = _mlp()
    x = torch.randn(512, 256, requires_grad=True)
    want = _grads(model, x)
    budget = 2 << 20  # 4 of the 12 saved 512 KiB activations
    off = offload_saved_tensors(budget, threshold_bytes=64 << 10, directory=tmp_path)
    for _ in range(2):  # the context serves many iterations
        got = _grads(model, x, off)
        assert all(torch.equal(a, b) for a, b in zip(got, want))
    s = off.stats()
    assert s.offloaded > 0 and s.kept > 0
    assert s.peak_bytes <= budget
    assert s.peak_kept_bytes <= s.keep_bytes and s.peak_prefetch_bytes <= s.prefetch_bytes
    assert s.prefetch_hits > 0
    off.close()
    assert os.listdir(tmp_path) == []  # the temporary zarr store is gone


def test_offload_restores_transposed_saved_tensors_exactly(tmp_path):
    torch.manual_seed(7)
    w = torch.randn(300, 200, dtype=torch.double, requires_grad=True)
    x = torch.randn(400, 300, dtype=torch.double, requires_grad=True)

    def f():
        h = torch.tanh(x @ w)  # mm saves x and w
        return (h.t() @ h.t().t()).sum()  # and transposed views of h

    want = torch.autograd.grad(f(), [x, w])
    off = offload_saved_tensors(0, threshold_bytes=1, directory=tmp_path)
    with off:
        loss = f()
    got = torch.autograd.grad(loss, [x, w])
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert off.stats().offloaded > 0
    off.close()


_RSS_SCRIPT = textwrap.dedent("""
    import re, sys, tempfile, json, torch
    LAYERS = 24
    from vlcc_adjoint.torch import offload_saved_tensors
    torch.set_num_threads(1)
    def hwm():
        return int(re.search(r"VmHWM:\\s+(\\d+)", open("/proc/self/status").read()).group(1)) << 10
    def rss():
        return int(re.search(r"VmRSS:\\s+(\\d+)", open("/proc/self/status").read()).group(1)) << 10
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(128, 128), torch.nn.Tanh())
                                  for _ in range(LAYERS)])
    x = torch.randn(2048, 128)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    def peak(ctx):
        import contextlib
        open("/proc/self/clear_refs", "w").write("5")
        base = rss()
        with (ctx or contextlib.nullcontext()):
            loss = model(x).square().sum()
        loss.backward()
        del loss
        return hwm() - base
    budget = 4 << 20
    off = offload_saved_tensors(budget, threshold_bytes=512 << 10, directory=sys.argv[1])
    peak(None); peak(off)  # warm up (allocator, threads, zarr)
    plain = peak(None)
    ours = peak(off)
    s = off.stats()
    off.close()
    print(json.dumps({"plain": plain, "ours": ours, "saved": s.packed_bytes // s.packed * LAYERS,
                      "budget": budget, "peak": s.peak_bytes}))
""")


@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="needs Linux /proc")
def test_offload_peak_resident_memory_drops_by_the_offloaded_bytes(tmp_path):
    """Independent of the context's own accounting: the process's peak RSS.
    glibc's mmap threshold is pinned so freed tensors leave the RSS at once."""
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="131072", OMP_NUM_THREADS="1")
    out = subprocess.run(
        [sys.executable, "-c", _RSS_SCRIPT, str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout.strip().splitlines()[-1])
    mib = 1 << 20
    # 24 saved activations of 1 MiB: plain keeps all of them, we keep <= budget.
    assert r["peak"] <= r["budget"]
    assert r["ours"] <= r["plain"] - r["saved"] + r["budget"] + 4 * mib, r


# -- state providers --------------------------------------------------------------------


def _exotic_state():
    torch.manual_seed(8)
    model = torch.nn.Sequential(
        torch.nn.Linear(5, 7), torch.nn.BatchNorm1d(7), torch.nn.Linear(7, 3)
    )
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    model(torch.randn(4, 5)).sum().backward()
    opt.step()
    extra = {
        "bf16": torch.randn(3, 4).to(torch.bfloat16),
        "f16": torch.randn(5).half(),
        "f8": torch.randn(6).to(torch.float8_e4m3fn),
        "i64": torch.arange(-3, 3),
        "u8": torch.arange(5, dtype=torch.uint8),
        "mask": torch.tensor([True, False]),
        "c64": torch.randn(2, dtype=torch.complex64),
        "scalar": torch.tensor(3.5, dtype=torch.bfloat16),
        "transposed": torch.randn(3, 4).t(),
        "param": torch.nn.Parameter(torch.randn(2)),
        "meta": {
            "size": torch.Size([2, 3]),
            "dtype": torch.bfloat16,
            "dev": torch.device("cpu"),
            "name": "run-1",
            "none": None,
            "lr": 1e-3,
            "betas": (0.9, 0.999),
        },
    }
    return model, opt, training_state(model, opt, rng=True, extra=extra)


def _same(a, b, path="state"):
    assert type(a) is type(b), path
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape, path
        assert a.requires_grad == b.requires_grad, path
        a, b = a.detach().reshape(-1).contiguous(), b.detach().reshape(-1).contiguous()
        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8)), path  # bit-exact
    elif isinstance(a, dict):
        assert list(a) == list(b), path
        for k in a:
            _same(a[k], b[k], f"{path}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            _same(x, y, f"{path}[{i}]")
    else:
        assert a == b, path


def test_state_dict_round_trips_bit_exactly_through_a_store_and_a_history(tmp_path):
    from vlcc_adjoint.lineage import History

    model, opt, state = _exotic_state()
    with TieredStore([ZarrTier(tmp_path / "z")]) as store:
        store.save(0, state, 0)
        back = store.load(0, 0)
    _same(state, back)
    assert back["model"]._metadata == state["model"]._metadata
    with History(tmp_path / "h") as h:
        vid = h.commit(state, message="exotic")
    with History(tmp_path / "h", mode="r") as h:  # a fresh reader
        back = h.load(vid)
    _same(state, back)
    # ... and it loads back into live objects.
    model2 = torch.nn.Sequential(
        torch.nn.Linear(5, 7), torch.nn.BatchNorm1d(7), torch.nn.Linear(7, 3)
    )
    opt2 = torch.optim.Adam(model2.parameters(), lr=1e-3)
    rest = restore_training_state(back, model2, opt2)
    assert set(rest) == {"extra"}
    for a, b in zip(model.state_dict().values(), model2.state_dict().values()):
        assert torch.equal(a, b)


def test_unrepresentable_objects_are_refused_with_their_path():
    sparse = torch.eye(3).to_sparse()
    with pytest.raises(TypeError, match=r"state\['w'\].*to_dense"):
        vstate.flatten({"w": sparse})

    class Sub(torch.Tensor):
        pass

    with pytest.raises(TypeError, match=r"state\['s'\].*no state provider"):
        vstate.flatten({"s": torch.ones(2).as_subclass(Sub)})
    with pytest.raises(TypeError, match=r"state\['f'\]"):
        vstate.flatten({"f": torch.nn.Linear(2, 2)})  # a module, not its state_dict


def test_tensors_are_leaves_described_without_a_copy(monkeypatch):
    import vlcc_adjoint.torch._state as tstate

    state = {"w": torch.arange(6.0).reshape(2, 3), "b": torch.ones(4, dtype=torch.bfloat16)}
    leaves, spec = vstate.flatten(state)
    assert spec["tree"]["items"][1] == {"leaf": 1, "torch": "bfloat16", "device": "cpu"}

    def no_copy(t):
        raise AssertionError("the structure of a tensor state brought a tensor to the host")

    monkeypatch.setattr(tstate, "tensor_to_numpy", no_copy)
    structure = vstate.Structure.of(state)
    assert vstate.state_nbytes(state) == 6 * 4 + 4 * 2 == structure.nbytes
    assert structure.matches({"w": torch.zeros(2, 3), "b": torch.zeros(4, dtype=torch.bfloat16)})
    assert not structure.matches({"w": torch.zeros(2, 3), "b": torch.zeros(4)})
    assert "state['b']" in structure.mismatch({"w": torch.zeros(2, 3), "b": torch.zeros(5)})


def test_checkpoints_written_when_tensors_were_containers_still_read():
    import numpy as np

    old = {
        "format": "vlcc-state/1",
        "tree": {
            "dict": ["b", "p"],
            "items": [
                {
                    "type": "torch.Tensor",
                    "aux": {"dtype": "bfloat16", "device": "cpu"},
                    "items": [{"leaf": 0}],
                },
                {
                    "type": "torch.nn.Parameter",
                    "aux": {"dtype": "float32", "device": "cpu", "requires_grad": True},
                    "items": [{"leaf": 1}],
                },
            ],
        },
        "leaves": [{"dtype": "<i2", "shape": [2]}, {"dtype": "<f4", "shape": [3]}],
    }
    ones = torch.ones(2, dtype=torch.bfloat16).view(torch.int16).numpy()
    back = vstate.unflatten(old, [ones, np.arange(3, dtype="<f4")])
    assert torch.equal(back["b"], torch.ones(2, dtype=torch.bfloat16))
    assert type(back["p"]) is torch.nn.Parameter and back["p"].requires_grad
    assert torch.equal(back["p"].detach(), torch.arange(3.0))


# -- files from elsewhere never execute ----------------------------------------------------

MARKER = "vlcc_pwned_marker"


class _Exploit:
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


def _edit_json(path, fn):
    with open(path) as f:
        doc = json.load(f)
    fn(doc)
    with open(path, "w") as f:
        json.dump(doc, f)


def _craft_type(node, name):
    """Turn every torch tensor leaf node of a spec into a registered-type node
    named `name` around the same leaf (a crafted spec naming a dangerous type)."""
    if isinstance(node, dict):
        for key, value in list(node.items()):
            if isinstance(value, dict) and "leaf" in value and "torch" in value:
                node[key] = {"type": name, "aux": None, "items": [{"leaf": value["leaf"]}]}
            else:
                _craft_type(value, name)
    elif isinstance(node, list):
        for i, value in enumerate(node):
            if isinstance(value, dict) and "leaf" in value and "torch" in value:
                node[i] = {"type": name, "aux": None, "items": [{"leaf": value["leaf"]}]}
            else:
                _craft_type(value, name)


def _reseal(doc):
    """Recompute a record document's digest, as a crafter who knows the format can."""
    from vlcc_adjoint.storage import format as F

    attrs = doc["attributes"]["vlcc_adjoint"]
    attrs.pop("digest")
    doc.clear()
    doc.update(json.loads(F.sealed_group("vlcc_adjoint", attrs)[0]))


def test_crafted_files_never_execute_code(tmp_path):
    from vlcc_adjoint.lineage import History

    marker = tmp_path / MARKER
    payload = pickle.dumps(_Exploit(str(marker)))
    state = {"w": torch.arange(4.0), "b": torch.ones(2, dtype=torch.bfloat16)}

    # 1. A ZarrTier record whose spec names os.system instead of torch's leaves.
    z = tmp_path / "z"
    with TieredStore([ZarrTier(z)]) as store:
        store.save(0, state, 0)
    (key,) = [d for d in os.listdir(z) if not d.startswith(".") and d != "zarr.json"]
    # Edited without resealing: the record's digest refuses it.
    original = (z / key / "zarr.json").read_bytes()
    _edit_json(z / key / "zarr.json", lambda doc: _craft_type(doc, "posix:system"))
    with pytest.raises(CorruptCheckpointError, match="zarr.json"):
        with ZarrTier(z, mode="r") as tier:
            tier.get(key)
    # Resealed (a deliberately crafted store): read, but never executed.
    (z / key / "zarr.json").write_bytes(original)
    _edit_json(
        z / key / "zarr.json",
        lambda doc: (_craft_type(doc, "posix:system"), _reseal(doc)),
    )
    with TieredStore([ZarrTier(z)]) as store:
        tier = store.tiers[0]
        rec = tier.get(key)
        with pytest.raises(vstate.UnknownStateTypeError, match="posix:system"):
            vstate.unflatten(rec.spec, list(rec.leaves))

    # 2. A History whose chunk files were replaced by a pickle payload.
    hp = tmp_path / "h"
    with History(hp) as h:
        vid = h.commit(state)
    for root, _, files in os.walk(hp / "chunks"):
        for name in files:
            p = os.path.join(root, name)
            os.chmod(p, 0o644)
            with open(p, "wb") as f:
                f.write(payload)
    with History(hp, mode="r") as h, pytest.raises(CorruptCheckpointError):
        h.load(vid)

    # 3. A History manifest naming a dangerous type.
    hq = tmp_path / "h2"
    with History(hq) as h:
        vid = h.commit(state)
    _edit_json(
        hq / "versions" / vid / "zarr.json",
        lambda doc: _craft_type(doc, "builtins:eval"),
    )
    with (
        History(hq, mode="r") as h,
        pytest.raises((vstate.UnknownStateTypeError, CorruptCheckpointError)),
    ):
        h.load(vid)

    # 4. A DeepSpeed checkpoint file that is a (malicious) pickle: refused.
    evil = tmp_path / "mp_rank_00_model_states.pt"
    evil.write_bytes(payload)
    engine = VlccCheckpointEngine(tmp_path / "h3")
    with pytest.raises(ValueError, match="never unpickles"):
        engine.load(str(evil))
    # 5. A pointer that names a missing version, and a torch.save zip.
    zipped = tmp_path / "zipped.pt"
    torch.save({"w": torch.ones(2)}, zipped)
    with pytest.raises(ValueError, match="not a checkpoint pointer"):
        engine.load(str(zipped))
    engine.close()
    assert not marker.exists()


# -- the checkpoint engine without DeepSpeed --------------------------------------------------


class _Info:  # DeepSpeed's CheckpointCommitInfo, as far as the engine reads it
    def __init__(self, tag, save_dir, save_latest=True):
        self.tag, self.save_dir, self.save_latest = tag, save_dir, save_latest


@pytest.mark.parametrize("defer", [False, True])
def test_engine_saves_pointers_and_loads_the_state_back(tmp_path, defer):
    torch.manual_seed(9)
    model = torch.nn.Sequential(torch.nn.Linear(6, 6), torch.nn.BatchNorm1d(6))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    kw = dict(model=model, optimizer=opt) if defer else {}
    engine = VlccCheckpointEngine(**kw)
    engine.guard(opt)  # commit before every optimizer step, as DeepSpeed does
    assert engine.is_decoupled() and not engine.preserves_storage_sharing()
    assert engine.is_data_parallel_writer(0) and not engine.is_data_parallel_writer(1)
    snapshots = {}
    for it in range(4):
        model(torch.randn(8, 6)).square().sum().backward()
        opt.step()
        opt.zero_grad()
        if it % 2 == 1:
            tag = f"global_step{it}"
            info = _Info(tag, str(tmp_path))
            engine.create(info)
            engine.makedirs(tmp_path / tag, exist_ok=True)
            path = str(tmp_path / tag / "mp_rank_00_model_states.pt")
            state = {
                "module": model.state_dict(),
                "optimizer": opt.state_dict(),
                "global_steps": it,
            }
            engine.save(state, path)
            snapshots[path] = {
                "module": collections.OrderedDict(
                    (k, v.clone()) for k, v in model.state_dict().items()
                ),
                "optimizer": opt.state_dict(),
            }
            snapshots[path]["optimizer"]["state"] = {
                k: {kk: vv.clone() for kk, vv in v.items()}
                for k, v in opt.state_dict()["state"].items()
            }
    # The last checkpoint is committed by close (no optimizer step after it).
    engine.close()
    assert (tmp_path / "latest").read_text() == "global_step3"
    pointer = VlccCheckpointEngine.read_pointer(path)
    assert pointer["history"] == os.path.join("..", "vlcc-history") and pointer["tag"] == tag
    reader = VlccCheckpointEngine()
    for path, want in snapshots.items():
        got = reader.load(path, map_location=lambda storage, loc: storage)
        _same(want["module"], got["module"])
        _same(want["optimizer"]["state"], got["optimizer"]["state"])
        assert got["global_steps"] in (1, 3)
    reader.close()


def test_a_pointer_is_read_only_from_a_small_regular_file(tmp_path):
    good = tmp_path / "good.pt"
    doc = {"format": "vlcc-deepspeed-pointer/1", "history": "h", "version": "v1"}
    good.write_text(json.dumps(doc))
    assert VlccCheckpointEngine.read_pointer(str(good)) == doc
    link = tmp_path / "link.pt"
    link.symlink_to(good)
    with pytest.raises(CorruptCheckpointError, match=r"link\.pt.*symbolic link") as info:
        VlccCheckpointEngine.read_pointer(str(link))
    assert info.value.path == str(link)
    big = tmp_path / "big.pt"
    big.write_text(json.dumps(dict(doc, note="x" * (64 << 10))))
    with pytest.raises(ValueError, match=r"big\.pt is not a checkpoint pointer"):
        VlccCheckpointEngine.read_pointer(str(big))
    duplicated = tmp_path / "dup.pt"
    duplicated.write_text(json.dumps(doc)[:-1] + ', "version": "v2"}')
    with pytest.raises(ValueError, match=r"dup\.pt is not a checkpoint pointer"):
        VlccCheckpointEngine.read_pointer(str(duplicated))


def test_pointers_and_latest_are_written_atomically_without_following_links(tmp_path):
    target = tmp_path / "elsewhere"
    target.write_text("untouched")
    (tmp_path / "latest").symlink_to(target)
    engine = VlccCheckpointEngine(tmp_path / "h")
    engine.create(_Info("global_step1", str(tmp_path)))
    path = str(tmp_path / "global_step1" / "mp_rank_00_model_states.pt")
    engine.makedirs(tmp_path / "global_step1", exist_ok=True)
    engine.save({"w": torch.ones(2)}, path)
    engine.close()
    assert target.read_text() == "untouched"  # the link was replaced, not written through
    assert not (tmp_path / "latest").is_symlink()
    assert (tmp_path / "latest").read_text() == "global_step1"
    assert VlccCheckpointEngine.read_pointer(path)["format"] == "vlcc-deepspeed-pointer/1"


def test_a_torch_state_saves_and_loads_without_importing_the_torch_integration():
    """The package registers a lazy hook for torch, as for JAX: a state of
    tensors is checkpointed, and a spec with torch leaves loads, in processes
    that never import vlcc_adjoint.torch themselves."""
    import subprocess

    code = """
import sys, numpy as np
import vlcc_adjoint
from vlcc_adjoint.storage import MemoryTier, TieredStore
from vlcc_adjoint.state import flatten
assert "vlcc_adjoint.torch" not in sys.modules and "torch" not in sys.modules
import torch
x = torch.arange(6.0).reshape(2, 3)
with TieredStore([MemoryTier()]) as store:
    store.save(0, {"x": x})
    got = store.load(0)
assert isinstance(got["x"], torch.Tensor) and torch.equal(got["x"], x)
leaves, spec = flatten({"x": x})
assert "torch" in spec["tree"]["items"][0], spec
print("ok", "vlcc_adjoint.torch._state" in sys.modules)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["ok", "True"]
    load = """
import json, sys, numpy as np
from vlcc_adjoint.state import unflatten
spec = json.loads(sys.argv[1])
assert "torch" not in sys.modules
out = unflatten(spec, [np.arange(6.0).reshape(2, 3)])
import torch
assert isinstance(out["x"], torch.Tensor) and out["x"].shape == (2, 3)
print("ok")
"""
    import json

    from vlcc_adjoint.state import flatten

    _, spec = flatten({"x": torch.arange(6.0, dtype=torch.float64).reshape(2, 3)})
    out = subprocess.run(
        [sys.executable, "-c", load, json.dumps(spec)], capture_output=True, text=True, timeout=180
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "ok"
