"""PyTorch (and DeepSpeed) integration.

Five pieces, each usable alone::

    import vlcc_adjoint.torch as vt

    # 1. A long chain of steps whose backward pass follows a vlcc schedule.
    h = vt.checkpoint_sequence(rnn_cell, h0, 2000, inputs=xs)          # Revolve by default
    p = vt.plan_sequence(2000, memory=40)                              # blocks + Revolve
    h = vt.checkpoint_sequence(rnn_cell, h0, 2000, inputs=xs, block=p.block,
                               snapshots=p.snapshots)

    #    torch's call, and a schedule over the layers beyond torch's segments:
    y = vt.checkpoint_sequential(model, 4, x, use_reentrant=False)    # = torch's
    y = vt.checkpoint_sequential(model, len(model), x, use_reentrant=False,
                                 schedule=Revolve(len(model), 3))   # 3 kept inputs

    # 2. Saved activations beyond a memory budget go to a tiered store.
    off = vt.offload_saved_tensors(budget_bytes=1 << 30)
    with off:
        loss = model(batch)
    loss.backward()

    # 3. state_dicts (bfloat16 included) in a TieredStore or a lineage History, no pickle.
    history.commit(vt.training_state(model, optimizer), meta={"step": step})

    # 4. torch.distributed.checkpoint: every dcp.save a version of a History.
    dcp.save(sd, storage_writer=vt.dcp.VlccWriter("run.vlcc", message="step 100"))
    dcp.load(sd, storage_reader=vt.dcp.VlccReader("run.vlcc", ref="main~3"))

    # 5. DeepSpeed: asynchronous, versioned save_checkpoint in one line.
    vt.VlccCheckpointEngine.attach(model_engine)
    #    a ZeRO-1/2 checkpoint of N ranks, optimizer state included, on M ranks
    vt.load_zero_resharded(model_engine, "ckpt", tag="step100")

Install with ``pip install torch==2.13.0`` (the ``torch`` extra pins it;
for the CPU build add ``--index-url https://download.pytorch.org/whl/cpu``
where no CPU wheel is at hand); DeepSpeed is optional (``DS_BUILD_OPS=0 pip install
deepspeed``).  Importing this package imports torch and registers the torch
state providers (:func:`register_providers`); ``import vlcc_adjoint`` does
not import torch.
"""

from . import dcp as dcp
from ._deepspeed import VlccCheckpointEngine as VlccCheckpointEngine
from ._offload import OffloadStats as OffloadStats
from ._offload import offload_saved_tensors as offload_saved_tensors
from ._sequence import checkpoint_sequence as checkpoint_sequence
from ._sequence_plan import SequencePlan as SequencePlan
from ._sequence_plan import plan_sequence as plan_sequence
from ._sequential import checkpoint_sequential as checkpoint_sequential
from ._state import numpy_to_tensor as numpy_to_tensor
from ._state import register_providers as register_providers
from ._state import restore_training_state as restore_training_state
from ._state import tensor_to_numpy as tensor_to_numpy
from ._state import training_state as training_state
from ._zero_reshard import load_zero_resharded as load_zero_resharded

register_providers()
