"""PyTorch checkpoint_sequential

`vlcc_adjoint.torch.checkpoint_sequential` has the signature and results of
`torch.utils.checkpoint.checkpoint_sequential`; with `schedule=` the backward
pass follows a vlcc schedule over the segments (here Revolve with 3 kept
inputs over 12 layers). Both gradients are compared with torch's own.
"""

import torch
from torch.utils.checkpoint import checkpoint_sequential as torch_checkpoint_sequential

import vlcc_adjoint.torch as vt
from vlcc_adjoint.schedules import Revolve

torch.manual_seed(0)
model = torch.nn.Sequential(
    *[layer for _ in range(6) for layer in (torch.nn.Linear(32, 32), torch.nn.Tanh())]
)
x = torch.randn(8, 32, requires_grad=True)


def grads(run):
    model.zero_grad()
    x.grad = None
    run().square().sum().backward()
    return [x.grad.clone()] + [p.grad.clone() for p in model.parameters()]


reference = grads(lambda: torch_checkpoint_sequential(model, 4, x, use_reentrant=False))
same = grads(lambda: vt.checkpoint_sequential(model, 4, x, use_reentrant=False))
scheduled = grads(
    lambda: vt.checkpoint_sequential(
        model, len(model), x, use_reentrant=False, schedule=Revolve(len(model), 3)
    )
)
print(
    "same segments as torch, bit for bit:", all(torch.equal(a, b) for a, b in zip(same, reference))
)
err = max(float((a - b).abs().max()) for a, b in zip(scheduled, reference))
print(f"Revolve({len(model)}, 3) over the layers, max |difference| to torch: {err:.1e}")
assert err < 1e-5, err
