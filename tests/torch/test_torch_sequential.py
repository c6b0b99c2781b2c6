"""checkpoint_sequential against torch.utils.checkpoint.checkpoint_sequential.

The scenarios of torch's own ``test/test_utils.py::TestCheckpoint`` that
concern ``checkpoint_sequential`` (outputs, input and parameter gradients
against the unchekpointed model, for a list, an ``nn.Sequential`` and an
``nn.ModuleList``; how often each layer runs; ``.grad`` with
``create_graph=True``; the deprecated call forms; dropout), plus what a
drop-in meets in practice: shapes changing from layer to layer, non-tensor
values in the state, inputs that do not require grad, keyword arguments,
and ``schedule=`` beyond torch's segments.  Comparisons are bitwise
(``torch.equal``): CPU float32 kernels are deterministic.
"""

import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

from torch.utils.checkpoint import checkpoint_sequential as torch_cs  # noqa: E402

from vlcc_adjoint.schedules import (  # noqa: E402
    Level,
    Multistage,
    Online,
    Periodic,
    Revolve,
    StoreAll,
    Trace,
    simulate,
    table_trace,
)
from vlcc_adjoint.torch import checkpoint_sequential  # noqa: E402

MODES = [True, False]


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(100, 50), nn.ReLU(), nn.Linear(50, 20), nn.ReLU(), nn.Linear(20, 5), nn.ReLU()
    )


def _grads(model, x, fn):
    """Output, input gradient and parameter gradients of ``fn(x)``."""
    model.zero_grad(set_to_none=True)
    x = x.detach().requires_grad_(x.requires_grad)
    out = fn(x)
    out.sum().backward()
    return (
        out.detach(),
        None if x.grad is None else x.grad.clone(),
        {n: None if p.grad is None else p.grad.clone() for n, p in model.named_parameters()},
    )


def _assert_equal(a, b):
    out_a, gx_a, gp_a = a
    out_b, gx_b, gp_b = b
    assert torch.equal(out_a, out_b)
    assert (gx_a is None) == (gx_b is None) and (gx_a is None or torch.equal(gx_a, gx_b))
    assert gp_a.keys() == gp_b.keys()
    for k in gp_a:
        assert gp_a[k] is not None and gp_b[k] is not None, k
        assert torch.equal(gp_a[k], gp_b[k]), k


@pytest.mark.parametrize("use_reentrant", MODES)
def test_outputs_and_gradients_equal_torchs_for_a_list_a_sequential_and_a_module_list(
    use_reentrant,
):
    model = _mlp()
    x = torch.randn(1, 100, requires_grad=True)
    plain = _grads(model, x, model)
    ref = _grads(model, x, lambda v: torch_cs(model, 2, v, use_reentrant=use_reentrant))
    _assert_equal(ref, plain)
    for layers in (list(model.children()), model, nn.ModuleList(model.children())):
        for segments in (1, 2, 3, 6):
            got = _grads(
                model,
                x,
                lambda v: checkpoint_sequential(layers, segments, v, use_reentrant=use_reentrant),
            )
            _assert_equal(got, plain)


@pytest.mark.parametrize("use_reentrant", MODES)
def test_layers_of_checkpointed_segments_run_twice_the_last_segment_once(use_reentrant):
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.counter = 0

        def forward(self, x):
            self.counter += 1
            return x * torch.tensor(2.0)

    modules = [Net() for _ in range(10)]
    x = torch.randn(3, 4, requires_grad=True)
    out = checkpoint_sequential(modules, 2, x, use_reentrant=use_reentrant)
    assert [m.counter for m in modules] == [1] * 10
    out.sum().backward()
    assert [m.counter for m in modules] == [2] * 5 + [1] * 5
    assert torch.equal(x.grad, torch.full((3, 4), 2.0**10))


def test_create_graph_raises_torchs_error_when_reentrant_and_is_exact_otherwise():
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(10, 8), nn.Tanh(), nn.Linear(8, 6), nn.Tanh(), nn.Linear(6, 3), nn.Tanh()
    )
    modules = list(model.children())
    x = torch.randn(2, 10, requires_grad=True)
    out = checkpoint_sequential(modules, 2, x, use_reentrant=True)
    with pytest.raises(RuntimeError, match="torch.utils.checkpoint is incompatible"):
        torch.autograd.grad(out, x, torch.ones(2, 3), create_graph=True)

    params = list(model.parameters())
    v = torch.randn(2, 3)
    (gx_plain,) = torch.autograd.grad(model(x), x, v, create_graph=True)
    hvp_plain = torch.autograd.grad(gx_plain.square().sum(), [x, *params])
    for schedule in (None, Revolve(6, 2)):
        segments = 2 if schedule is None else 6
        out = checkpoint_sequential(modules, segments, x, use_reentrant=False, schedule=schedule)
        assert torch.equal(out, model(x))
        (gx,) = torch.autograd.grad(out, x, v, create_graph=True)
        assert gx.requires_grad and torch.equal(gx, gx_plain)
        hvp = torch.autograd.grad(gx.square().sum(), [x, *params])
        for a, b in zip(hvp, hvp_plain):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
            assert a.abs().sum() > 0


def test_deprecated_call_forms_raise_type_error():
    class Two(nn.Module):
        def forward(self, a, b):
            return a, b

    class Noop(nn.Module):
        def forward(self):
            pass

    a = torch.randn(1, 100, requires_grad=True)
    b = torch.randn(1, 100, requires_grad=True)
    with pytest.raises(TypeError):
        checkpoint_sequential(nn.Sequential(Two()), 1, a, b)
    with pytest.raises(TypeError):
        checkpoint_sequential(nn.Sequential(Noop()), 1)


@pytest.mark.parametrize("use_reentrant", MODES)
def test_dropout_masks_and_the_generator_match_torch(use_reentrant):
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(64, 64),
        nn.Dropout(0.5),
        nn.Tanh(),
        nn.Linear(64, 64),
        nn.Dropout(0.3),
        nn.Tanh(),
        nn.Linear(64, 8),
        nn.Dropout(0.2),
    )
    x = torch.randn(16, 64, requires_grad=True)

    def seeded(fn):
        def run(v):
            torch.manual_seed(123)
            return fn(v)

        return run

    ref = _grads(model, x, seeded(lambda v: torch_cs(model, 3, v, use_reentrant=use_reentrant)))
    ref_rng = torch.get_rng_state()
    plain = _grads(model, x, seeded(model))
    _assert_equal(ref, plain)
    for segments, schedule in ((3, None), (8, Revolve(8, 2)), (4, Revolve(4, 1))):
        got = _grads(
            model,
            x,
            seeded(
                lambda v: checkpoint_sequential(
                    model, segments, v, use_reentrant=use_reentrant, schedule=schedule
                )
            ),
        )
        _assert_equal(got, plain)
        assert torch.equal(torch.get_rng_state(), ref_rng)
    # Without preserve_rng_state the recomputed masks differ: the gradient is wrong.
    got = _grads(
        model,
        x,
        seeded(
            lambda v: checkpoint_sequential(
                model, 3, v, use_reentrant=use_reentrant, preserve_rng_state=False
            )
        ),
    )
    assert not torch.equal(got[1], plain[1])


@pytest.mark.parametrize("use_reentrant", MODES)
def test_shapes_change_from_layer_to_layer(use_reentrant):
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 4, 3),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(4 * 3 * 3, 10),
        nn.Tanh(),
        nn.Linear(10, 2),
    )
    x = torch.randn(2, 3, 8, 8, requires_grad=True)
    plain = _grads(model, x, model)
    for segments, schedule in ((3, None), (7, Revolve(7, 2)), (7, None)):
        _assert_equal(
            _grads(
                model,
                x,
                lambda v: checkpoint_sequential(
                    model, segments, v, use_reentrant=use_reentrant, schedule=schedule
                ),
            ),
            plain,
        )
    _assert_equal(_grads(model, x, lambda v: torch_cs(model, 3, v, use_reentrant=False)), plain)


class _Masked(nn.Module):
    """A layer whose state is a dict of a tensor, an int mask, a tuple and constants."""

    def __init__(self, n_in, n_out):
        super().__init__()
        self.lin = nn.Linear(n_in, n_out)

    def forward(self, s):
        assert s["mode"] == "train" and s["skip"] is None
        h = torch.tanh(self.lin(s["h"])) * s["mask"]
        a, b = s["pair"]
        return {
            "h": h + a.sum(),
            "mask": s["mask"],
            "mode": s["mode"],
            "skip": None,
            "pair": (a * 2, b),
        }


class _Head(nn.Module):
    def __init__(self, n_in):
        super().__init__()
        self.lin = nn.Linear(n_in, 1)

    def forward(self, s):
        return self.lin(s["h"]) + s["pair"][0].sum() * 0.5


@pytest.mark.parametrize("use_reentrant", MODES)
def test_non_tensor_values_in_the_state_pass_through_and_tensors_in_it_get_gradients(use_reentrant):
    torch.manual_seed(0)
    model = nn.Sequential(_Masked(6, 6), _Masked(6, 6), _Masked(6, 6), _Head(6))
    h = torch.randn(4, 6, requires_grad=True)
    a = torch.randn(3, requires_grad=True)
    mask = torch.tensor([[1], [0], [1], [1]], dtype=torch.int64)

    def state():
        return {"h": h, "mask": mask, "mode": "train", "skip": None, "pair": (a, 7)}

    def run(fn):
        model.zero_grad(set_to_none=True)
        h.grad = a.grad = None
        out = fn(state())
        out.sum().backward()
        return (
            out.detach(),
            h.grad.clone(),
            a.grad.clone(),
            [p.grad.clone() for p in model.parameters()],
        )

    plain = run(model)
    theirs = run(lambda s: torch_cs(model, 2, s, use_reentrant=False))
    for fn in (
        lambda s: checkpoint_sequential(model, 2, s, use_reentrant=use_reentrant),
        lambda s: checkpoint_sequential(
            model, 4, s, use_reentrant=use_reentrant, schedule=Revolve(4, 1)
        ),
    ):
        got = run(fn)
        for ref in (plain, theirs):
            assert torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1])
            assert torch.equal(got[2], ref[2])
            assert all(torch.equal(x, y) for x, y in zip(got[3], ref[3]))


@pytest.mark.parametrize("use_reentrant", MODES)
def test_an_input_without_grad_still_gives_every_parameter_its_gradient(use_reentrant):
    model = _mlp()
    x = torch.randn(3, 100)  # requires_grad=False
    plain = _grads(model, x, model)
    theirs = _grads(model, x, lambda v: torch_cs(model, 2, v, use_reentrant=False))
    _assert_equal(theirs, plain)
    got = _grads(
        model, x, lambda v: checkpoint_sequential(model, 2, v, use_reentrant=use_reentrant)
    )
    _assert_equal(got, plain)
    assert got[1] is None
    if use_reentrant:
        # torch's reentrant variant warns and leaves the checkpointed segment's
        # parameters without gradient; the last segment agrees with it.
        with pytest.warns(UserWarning, match="None of the inputs have requires_grad"):
            reent = _grads(model, x, lambda v: torch_cs(model, 2, v, use_reentrant=True))
        assert reent[2]["0.weight"] is None
        assert torch.equal(reent[2]["4.weight"], got[2]["4.weight"])


def test_use_reentrant_is_warned_when_missing_and_unknown_keywords_raise():
    model = _mlp()
    x = torch.randn(1, 100, requires_grad=True)
    with pytest.warns(UserWarning, match="use_reentrant parameter should be passed"):
        out = checkpoint_sequential(model, 2, x)
    assert torch.equal(out, model(x))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        checkpoint_sequential(model, 2, x, use_reentrant=False, preserve_rng_state=False)
    with pytest.raises(ValueError, match="Unexpected keyword arguments: foo"):
        checkpoint_sequential(model, 2, x, use_reentrant=False, foo=1)
    with pytest.raises(ValueError, match="segments must be an int between 1 and"):
        checkpoint_sequential(model, 7, x, use_reentrant=False)
    with pytest.raises(ValueError, match="segments=6"):
        checkpoint_sequential(model, 2, x, use_reentrant=False, schedule=Revolve(6, 2))
    with pytest.raises(TypeError, match="functions must be"):
        checkpoint_sequential(model[0], 1, x, use_reentrant=False)


def test_a_revolve_schedule_over_the_layers_runs_its_forward_count_plus_one_per_layer():
    calls = []

    class Layer(nn.Module):
        def __init__(self, i):
            super().__init__()
            self.i = i
            self.lin = nn.Linear(8, 8)

        def forward(self, x):
            calls.append(self.i)
            return torch.tanh(self.lin(x))

    torch.manual_seed(0)
    n = 12
    model = nn.Sequential(*[Layer(i) for i in range(n)])
    x = torch.randn(4, 8, requires_grad=True)
    plain = _grads(model, x, model)
    for snapshots in (1, 2, 3, 12):
        schedule = Revolve(n, snapshots)
        calls.clear()
        got = _grads(
            model,
            x,
            lambda v: checkpoint_sequential(model, n, v, use_reentrant=False, schedule=schedule),
        )
        _assert_equal(got, plain)
        assert len(calls) == simulate(schedule).forward_count + n
    # Two levels: kept inputs beyond one memory slot go to a store tier.
    schedule = Multistage(n, levels=[Level(1, 0.0, 0.0), Level(3, 1.0, 1.0)])
    _assert_equal(
        _grads(
            model,
            x,
            lambda v: checkpoint_sequential(model, n, v, use_reentrant=True, schedule=schedule),
        ),
        plain,
    )


def test_backward_twice_with_retain_graph_and_once_without():
    model = _mlp()
    x = torch.randn(2, 100, requires_grad=True)
    plain = _grads(model, x, model)
    model.zero_grad(set_to_none=True)
    out = checkpoint_sequential(model, 3, x, use_reentrant=False, schedule=Revolve(3, 1))
    out.sum().backward(retain_graph=True)
    out.sum().backward()
    for n, p in model.named_parameters():
        assert torch.equal(p.grad, 2 * plain[2][n]), n
    out = checkpoint_sequential(model, 3, x, use_reentrant=False)
    out.sum().backward()
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        out.sum().backward()


def test_without_grad_it_is_the_plain_loop():
    model = _mlp()
    x = torch.randn(2, 100, requires_grad=True)
    with torch.no_grad():
        out = checkpoint_sequential(model, 2, x, use_reentrant=False)
    assert not out.requires_grad and torch.equal(out, model(x).detach())
    frozen = _mlp().requires_grad_(False)
    out = checkpoint_sequential(frozen, 2, x.detach(), use_reentrant=True)
    assert out.grad_fn is None


@pytest.mark.parametrize("with_inputs", [False, True])
def test_checkpoint_sequence_gives_a_differentiable_gradient_under_create_graph(with_inputs):
    from vlcc_adjoint.torch import checkpoint_sequence

    torch.manual_seed(0)
    cell = nn.RNNCell(3, 5) if with_inputs else nn.Sequential(nn.Linear(5, 5), nn.Tanh())
    x = torch.randn(2, 5, requires_grad=True)
    xs = torch.randn(6, 2, 3, requires_grad=True) if with_inputs else None
    params = list(cell.parameters())
    wrt = [x, *([xs] if with_inputs else []), *params]

    def plain():
        h = x
        for i in range(6):
            h = cell(xs[i], h) if with_inputs else cell(h)
        return h

    v = torch.randn(2, 5)
    g_plain = torch.autograd.grad(plain(), wrt, v, create_graph=True)
    h_plain = torch.autograd.grad(sum(g.square().sum() for g in g_plain), wrt)
    y = checkpoint_sequence(cell, x, 6, inputs=xs, schedule=Revolve(6, 2))
    g = torch.autograd.grad(y, wrt, v, create_graph=True)
    for a, b in zip(g, g_plain):
        assert a.requires_grad
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
    h = torch.autograd.grad(sum(t.square().sum() for t in g), wrt)
    for a, b in zip(h, h_plain):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_plain_functions_and_closures_as_layers_and_an_unreachable_tensor_is_reported():
    torch.manual_seed(0)
    w = torch.randn(6, 4, requires_grad=True)
    layers = [nn.Linear(3, 6), torch.tanh, lambda h: h @ w, torch.sigmoid]
    x = torch.randn(5, 3, requires_grad=True)

    def grads(fn):
        for t in (x, w, *layers[0].parameters()):
            t.grad = None
        fn(x).sum().backward()
        return [t.grad.clone() for t in (x, w, *layers[0].parameters())]

    def plain(v):
        for f in layers:
            v = f(v)
        return v

    ref = grads(plain)
    for use_reentrant in MODES:
        got = grads(
            lambda v: checkpoint_sequential(
                layers, 4, v, use_reentrant=use_reentrant, schedule=Revolve(4, 1)
            )
        )
        assert all(torch.equal(a, b) for a, b in zip(got, ref))

    class Hidden(nn.Module):  # a tensor that requires grad but is not a Parameter
        def __init__(self):
            super().__init__()
            self.w = torch.randn(4, 4, requires_grad=True)

        def forward(self, h):
            return h @ self.w

    model = nn.Sequential(nn.Linear(4, 4), Hidden(), nn.Tanh())
    out = checkpoint_sequential(model, 3, torch.randn(2, 4), use_reentrant=False)
    with pytest.raises(ValueError, match=r"shape \(4, 4\) that requires grad"):
        out.sum().backward()


@pytest.mark.parametrize("use_reentrant", MODES)
def test_in_place_layers_at_block_boundaries_work_where_torchs_fail(use_reentrant):
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(6, 6),
        nn.ReLU(inplace=True),
        nn.Linear(6, 6),
        nn.ReLU(inplace=True),
        nn.Linear(6, 2),
        nn.ReLU(inplace=True),
    )
    x = torch.randn(3, 6, requires_grad=True)
    plain = _grads(model, x, model)
    with pytest.raises(RuntimeError, match="in-place|inplace"):
        _grads(model, x, lambda v: torch_cs(model, 6, v, use_reentrant=use_reentrant))
    for segments, schedule in ((6, None), (6, Revolve(6, 2)), (3, Revolve(3, 1))):
        _assert_equal(
            _grads(
                model,
                x,
                lambda v: checkpoint_sequential(
                    model, segments, v, use_reentrant=use_reentrant, schedule=schedule
                ),
            ),
            plain,
        )
    # An in-place first layer leaves the caller's input alone.
    relu_first = nn.Sequential(nn.ReLU(inplace=True), *list(model.children())[:2])
    h = torch.randn(3, 6) - 0.5
    h0 = h.clone()
    out = checkpoint_sequential(relu_first, 3, h, use_reentrant=use_reentrant)
    assert torch.equal(h, h0)
    out.sum().backward()
    assert torch.equal(out, relu_first(h0.clone()))


@pytest.mark.parametrize(
    "make",
    [
        lambda: Revolve(9, 1),
        lambda: Revolve(12, 3),
        lambda: StoreAll(7),
        lambda: Periodic(10, 3),
        lambda: Online(11, snapshots=3),
        lambda: Multistage(12, [Level(1), Level(2, 1.0, 1.0)]),
    ],
)
def test_the_schedule_table_is_followed_action_by_action(make):
    """The trace test of the other interpreters (tests/execute/test_interpreters.py): each
    layer checks and records the state it was given (its own step counter rides
    in the state), without grad (forward steps) or with grad (adjoint steps)."""
    schedule = make()
    n = schedule.n_steps
    forward, reverse, states = [], [], []

    def layer(i, w):
        def f(s):
            x, step = s
            (reverse if torch.is_grad_enabled() else forward).append(i)
            if torch.is_grad_enabled():
                states.append(int(step))
            return torch.tanh(x * w), step + 1

        return f

    torch.manual_seed(0)
    ws = [torch.randn(3, requires_grad=True) for _ in range(n)]
    x = torch.randn(2, 3, requires_grad=True)
    out, steps = checkpoint_sequential(
        [layer(i, ws[i]) for i in range(n)],
        n,
        (x, torch.tensor(0)),
        use_reentrant=False,
        schedule=schedule,
    )
    assert int(steps) == n
    out.sum().backward()
    want = table_trace(schedule)
    Trace(
        np.array(forward),
        np.array(reverse),
        want.reads,
        want.writes,
        reverse_states=np.array(states),
    ).assert_equal(want)
    h = x
    for w in ws:
        h = torch.tanh(h * w)
    assert torch.equal(ws[0].grad, torch.autograd.grad(h.sum(), ws[0])[0])


def test_both_drop_ins_follow_moves_between_every_pair_of_levels():
    """A hand-written three-level table with a Move 0->1, 1->2, 2->0 and 1->0:
    both torch interpreters give plain autograd's gradients."""
    from vlcc_adjoint.schedules import Level, Schedule, actions_to_table, simulate
    from vlcc_adjoint.schedules.actions import Advance, Delete, Load, Move, Reverse, Save
    from vlcc_adjoint.torch import checkpoint_sequence

    n = 4
    acts = [
        Save(0, 0),
        Advance(0, 1),
        Save(1, 0),
        Move(1, 0, 1),
        Advance(1, 2),
        Save(2, 1),
        Move(2, 1, 2),
        Advance(2, 3),
        Reverse(3),
        Move(2, 2, 0),
        Load(2, 0),
        Reverse(2),
        Delete(2, 0),
        Move(1, 1, 0),
        Load(1, 0),
        Reverse(1),
        Delete(1, 0),
        Load(0, 0),
        Reverse(0),
        Delete(0, 0),
    ]
    schedule = Schedule(actions_to_table(acts), n, [Level(None), Level(None), Level(None)])
    simulate(schedule)  # a valid schedule by the written semantics
    torch.manual_seed(0)
    lin = torch.nn.Linear(5, 5)
    x = torch.randn(3, 5, requires_grad=True)

    def step(u):
        return torch.tanh(lin(u))

    u = x
    for _ in range(n):
        u = step(u)
    want = torch.autograd.grad(u.sum(), [x, *lin.parameters()])
    out = checkpoint_sequence(step, x, n, schedule=schedule)
    got = torch.autograd.grad(out.sum(), [x, *lin.parameters()])
    layers = torch.nn.Sequential(*[torch.nn.Sequential(lin, torch.nn.Tanh()) for _ in range(n)])
    out2 = checkpoint_sequential(layers, n, x, use_reentrant=False, schedule=schedule)
    got2 = torch.autograd.grad(out2.sum(), [x, *lin.parameters()])
    for a, b, c in zip(want, got, got2):
        torch.testing.assert_close(b, a)
        torch.testing.assert_close(c, a)


def test_both_drop_ins_follow_a_forward_sweep_that_reaches_the_last_state():
    """The sweep advances to u_n before its first Reverse (as an Online sweep
    may): the output comes from the sweep, and every block is re-taped."""
    from vlcc_adjoint.schedules import Schedule, actions_to_table, simulate
    from vlcc_adjoint.schedules.actions import Advance, Delete, Load, Reverse, Save
    from vlcc_adjoint.torch import checkpoint_sequence

    n = 3
    acts = [Save(0, 0), Advance(0, 3), Load(0, 0), Advance(0, 2), Reverse(2)]
    acts += [Load(0, 0), Advance(0, 1), Reverse(1), Load(0, 0), Reverse(0), Delete(0, 0)]
    schedule = Schedule(actions_to_table(acts), n)
    simulate(schedule)
    torch.manual_seed(0)
    lin = nn.Linear(4, 4)
    x = torch.randn(2, 4, requires_grad=True)
    layers = nn.Sequential(*[nn.Sequential(lin, nn.Tanh()) for _ in range(n)])
    want = torch.autograd.grad(layers(x).sum(), [x, *lin.parameters()])
    out = checkpoint_sequential(layers, n, x, use_reentrant=False, schedule=schedule)
    got = torch.autograd.grad(out.sum(), [x, *lin.parameters()])
    out2 = checkpoint_sequence(lambda u: torch.tanh(lin(u)), x, n, schedule=schedule)
    got2 = torch.autograd.grad(out2.sum(), [x, *lin.parameters()])
    for a, b, c in zip(want, got, got2):
        torch.testing.assert_close(b, a)
        torch.testing.assert_close(c, a)


def test_a_planned_store_holds_every_level_also_for_a_second_backward():
    from vlcc_adjoint.schedules import io_plan
    from vlcc_adjoint.storage import DeviceTier, MemoryTier, TieredStore

    model = _mlp()
    x = torch.randn(2, 100, requires_grad=True)
    plain = _grads(model, x, model)
    schedule = Multistage(6, levels=[Level(1, 0.0, 0.0), Level(3, 1.0, 1.0)])
    assert simulate(schedule).writes[1] > 0
    with TieredStore([DeviceTier(), MemoryTier()], plan=io_plan(schedule)) as store:
        model.zero_grad(set_to_none=True)
        out = checkpoint_sequential(
            model, 6, x, use_reentrant=False, schedule=schedule, store=store
        )
        out.sum().backward(retain_graph=True)
        out.sum().backward()  # the schedule runs again: the plan restarts
        for n, p in model.named_parameters():
            torch.testing.assert_close(p.grad, 2 * plain[2][n])
        assert store.steps(0) == store.steps(1) == []
        assert store.stats().tiers[1].puts == 2 * simulate(schedule).writes[1]
