"""Keep a deep network's saved activations under a memory budget.

``offload_saved_tensors`` routes the tensors autograd saves for the backward
pass through a tiered store: the first ``keep`` bytes stay in memory, the
rest are written behind the forward pass (here to a ZarrTier in a temporary
directory) and prefetched in reverse order during the backward pass.
Gradients are bit-identical to plain autograd's.

Run::

    python examples/torch_offload.py                 # a few seconds
"""

import torch

from vlcc_adjoint.torch import offload_saved_tensors

torch.set_num_threads(1)
torch.manual_seed(0)
model = torch.nn.Sequential(
    *[torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.GELU()) for _ in range(24)]
)
x = torch.randn(1024, 512)


def grads(ctx=None):
    model.zero_grad()
    if ctx is None:
        loss = model(x).square().mean()
    else:
        with ctx:
            loss = model(x).square().mean()
    loss.backward()
    return [p.grad.clone() for p in model.parameters()]


reference = grads()
off = offload_saved_tensors(budget_bytes=16 << 20)  # 16 MiB of the ~96 MiB saved
for it in range(3):
    same = all(torch.equal(a, b) for a, b in zip(grads(off), reference))
    print(f"iteration {it}: gradients identical to plain autograd: {same}")
s = off.stats()
print(
    f"saved tensors routed: {s.packed} ({s.packed_bytes / 2**20:.0f} MiB), kept "
    f"{s.kept}, offloaded {s.offloaded}; prefetch hits {s.prefetch_hits}, "
    f"synchronous reads {s.sync_reads}"
)
print(
    f"peak host bytes held: {s.peak_bytes / 2**20:.1f} MiB <= budget "
    f"{s.budget_bytes / 2**20:.0f} MiB"
)
off.close()
