"""Keep a deep network's saved activations under a memory budget.

``offload_saved_tensors`` routes the tensors autograd saves for the backward
pass through a tiered store: the first ``keep`` bytes stay in memory, the
rest are written behind the forward pass (here to a ZarrTier in a temporary
directory) and prefetched in reverse order during the backward pass.
Gradients are bit-identical to plain autograd's.

Run::

    python examples/torch_offload.py                 # a few seconds
    python examples/torch_offload.py --budget-mib 4 --iterations 5
"""

import torch

from vlcc_adjoint.cli import Integer, Parser
from vlcc_adjoint.torch import offload_saved_tensors


def build_parser() -> Parser:
    parser = Parser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--layers", type=Integer(1), default=24, help="Linear + GELU blocks of 512 features"
    )
    parser.add_argument(
        "--batch",
        type=Integer(512, why="smaller activations stay with autograd (threshold 1 MiB)"),
        default=1024,
        help="rows of the input (an activation is batch x 512 float32)",
    )
    parser.add_argument(
        "--budget-mib",
        type=Integer(1),
        default=16,
        help="MiB of saved tensors kept in memory (the rest is offloaded)",
    )
    parser.add_argument(
        "--iterations", type=Integer(1), default=3, help="forward + backward passes"
    )
    return parser


def main(argv=None) -> dict:
    args = build_parser().parse_args(argv)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        *[
            torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.GELU())
            for _ in range(args.layers)
        ]
    )
    x = torch.randn(args.batch, 512)

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
    off = offload_saved_tensors(budget_bytes=args.budget_mib << 20)
    identical = []
    try:
        for it in range(args.iterations):
            same = all(torch.equal(a, b) for a, b in zip(grads(off), reference))
            identical.append(same)
            print(f"iteration {it}: gradients identical to plain autograd: {same}")
        s = off.stats()
    finally:
        off.close()  # stops the prefetcher, removes the temporary directory
    print(
        f"saved tensors routed: {s.packed} ({s.packed_bytes / 2**20:.0f} MiB), kept "
        f"{s.kept}, offloaded {s.offloaded}; prefetch hits {s.prefetch_hits}, "
        f"synchronous reads {s.sync_reads}"
    )
    print(
        f"peak host bytes held: {s.peak_bytes / 2**20:.1f} MiB <= budget "
        f"{s.budget_bytes / 2**20:.0f} MiB"
    )
    return {"identical": all(identical), "offloaded": s.offloaded}


if __name__ == "__main__":
    main()
