"""Load a ZeRO-1/2 checkpoint on another number of data-parallel ranks.

DeepSpeed's ZeRO stages 1 and 2 partition the optimizer state: each
data-parallel rank ``r`` of ``N`` keeps, per parameter group, one slice of
the group's *flat* fp32 master weights and of the optimizer's moments, and
saves it in its own file (``zero_pp_rank_<r>_mp_rank_<mp>_optim_states.pt``).
DeepSpeed's engine refuses to load such a checkpoint onto another number of
ranks (``ZeRORuntimeException``, "Automatic adjustment of ZeRO's optimizer
state partitioning with a new world size is not currently supported") unless
it was first converted to its *universal* format (``ds_to_universal``: one
file per parameter and state, written by a separate conversion run).

The repartitioning itself is simple, because a group's flat buffer does not
depend on the number of ranks: it is the group's parameters, flattened in
order (with the same per-parameter alignment gaps, which DeepSpeed records
as ``param_alignment_paddings`` and checks), followed by zeros up to a
multiple of the alignment times the number of ranks.  Rank ``r`` holds the
elements ``[r P, (r + 1) P)`` of it (``P``: the partition size), and only
the last rank holds padding (its ``group_paddings``).  So, per group:

1. *merge*: the saved slices of every rank, each without its padding
   (``single_partition_of_fp32_groups`` is saved without it; the moments of
   the base optimizer's state are cut to ``P - padding``), concatenated in
   rank order: the group's unpadded flat fp32 weights and moments;
2. *split*: this rank's slice of that for the current partitioning
   (``[m P', (m + 1) P')`` for rank ``m`` with partition size ``P'``),
   padded with zeros to ``P'``;
3. *load*: a state dict of the current rank in the layout DeepSpeed's own
   checkpoint has (a rigid one: the base optimizer's ``state_dict``), handed
   to the ZeRO optimizer's ``load_state_dict``, which copies the master
   weights and moments in place and relinks its views.

The bytes move, they are not recomputed: the weights and moments after
loading are bit for bit those saved, whatever the number of ranks
(``tests/torch/test_deepspeed_dist.py`` compares with DeepSpeed's universal
checkpoint loaded on one process).  The files are read through the model
engine's checkpoint engine (``VlccCheckpointEngine`` or DeepSpeed's own),
one rank's file at a time.

Reference: S. Rajbhandari, J. Rasley, O. Ruwase, Y. He, "ZeRO: Memory
optimizations toward training trillion parameter models", SC 2020 (the
partitioning); DeepSpeed ``runtime/zero/stage_1_and_2.py`` (``state_dict``,
``_load_legacy_checkpoint``) and ``checkpoint/ds_to_universal.py``.
"""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING, Any

import torch

from ..errors import VlccFileNotFoundError, VlccValueError

if TYPE_CHECKING:
    from deepspeed.runtime.engine import DeepSpeedEngine

__all__ = ["load_zero_resharded"]

# The keys of a ZeRO-1/2 optimizer file (deepspeed.checkpoint.constants).
_BASE = "base_optimizer_state"
_FP32 = "single_partition_of_fp32_groups"
_PADDINGS = "group_paddings"
_ALIGNMENT = "param_alignment_paddings"
_COUNT = "partition_count"
_MODEL_FILE = re.compile(r"mp_rank_(\d+)_model_states\.pt$")


def load_zero_resharded(
    model_engine: DeepSpeedEngine,
    load_dir: str | os.PathLike,
    tag: str | None = None,
    *,
    load_lr_scheduler_states: bool = True,
) -> tuple[str, dict]:
    """``model_engine.load_checkpoint`` of a ZeRO stage 1 or 2 checkpoint saved by
    any number of data-parallel ranks, optimizer state included.

    The model's weights, the learning-rate scheduler and the client state are
    loaded by DeepSpeed (``load_checkpoint(..., load_optimizer_states=False)``);
    then the optimizer files of every saved rank are merged and this rank's
    partition of the master weights and moments is loaded (see the module
    docstring).  Call it on every rank, as ``load_checkpoint``.

    **Arguments:**

    - `model_engine`: a DeepSpeed engine with a ZeRO stage 1 or 2 optimizer,
      built for the same model as the checkpoint's (any number of ranks).
    - `load_dir`, `tag`: as for ``load_checkpoint`` (`tag` ``None``: the tag
      in ``<load_dir>/latest``).
    - `load_lr_scheduler_states`: passed to ``load_checkpoint``.

    **Returns:** ``(load_path, client_state)``, as ``load_checkpoint``.
    """
    optimizer = getattr(model_engine, "optimizer", None)
    fp32_groups = getattr(optimizer, _FP32, None)
    if optimizer is None or fp32_groups is None or not hasattr(optimizer, "groups_padding"):
        raise VlccValueError(
            "load_zero_resharded needs a DeepSpeed engine with a ZeRO stage 1 or 2 optimizer "
            f"(got {type(optimizer).__name__}); for ZeRO-3 use DeepSpeed's universal "
            "checkpoint (deepspeed.checkpoint.ds_to_universal) or zero_to_fp32"
        )
    path, client_state = model_engine.load_checkpoint(
        os.fspath(load_dir),
        tag=tag,
        load_optimizer_states=False,
        load_lr_scheduler_states=load_lr_scheduler_states,
    )
    if path is None:
        raise VlccFileNotFoundError(
            f"no checkpoint to load in {os.fspath(load_dir)} (tag {tag!r}): DeepSpeed found "
            "no model states file there; pass the save_checkpoint directory and tag"
        )
    saved = _read_rank_files(model_engine, str(path))
    m = _dp_rank(optimizer)
    first = saved[0]
    groups = len(fp32_groups)
    if any(len(sd[_FP32]) != groups for sd in saved):
        raise VlccValueError(
            f"the checkpoint's optimizer has {len(first[_FP32])} parameter groups, this "
            f"engine's {groups}: build the engine with the optimizer and parameter groups "
            "of the run that saved it"
        )
    base_states = [_base_state(sd) for sd in saved]
    fp32: list[torch.Tensor] = []
    state: dict[int, dict[str, Any]] = {}
    paddings = []
    for i in range(groups):
        size = fp32_groups[i].numel()  # this rank's partition, padding included
        padding = int(optimizer.groups_padding[i])
        merged = torch.cat([sd[_FP32][i].reshape(-1) for sd in saved])
        lean = optimizer.partition_count[i] * size - _total_padding(optimizer, i, size, padding)
        if merged.numel() != lean:
            raise VlccValueError(
                f"parameter group {i}: the checkpoint holds {merged.numel()} weights, this "
                f"engine's group {lean}: the checkpoint is of another model (or another "
                "parameter_alignment setting)"
            )
        fp32.append(merged[m * size : m * size + size - padding].clone())
        paddings.append(padding)
        state[i] = {}
        for key, value in base_states[0][i].items():
            if torch.is_tensor(value) and value.dim() > 0:
                parts = []
                for r, sd in enumerate(saved):
                    v = base_states[r][i][key].reshape(-1)
                    keep = sd[_FP32][i].numel()  # the rank's partition without its padding
                    parts.append(v[:keep])
                whole = torch.cat(parts)
                mine = torch.zeros(size, dtype=whole.dtype)
                part = whole[m * size : m * size + size - padding]
                mine[: part.numel()] = part
                state[i][key] = mine
            else:
                state[i][key] = value  # the step: equal on every rank
    base = first[_BASE]
    sd = {k: v for k, v in first.items() if k not in (_BASE, _FP32, _PADDINGS, _COUNT)}
    sd[_BASE] = {"state": state, "param_groups": base["param_groups"]}
    sd[_FP32] = fp32
    sd[_PADDINGS] = paddings
    sd[_COUNT] = list(optimizer.partition_count)
    optimizer.load_state_dict(
        state_dict_list=[sd] * max(optimizer.partition_count),
        load_optimizer_states=True,
        load_from_fp32_weights=True,
    )
    return path, client_state


def _read_rank_files(model_engine, model_path: str) -> list[dict]:
    """The optimizer state dicts of every data-parallel rank of the checkpoint whose
    model states file is `model_path`, in rank order."""
    folder, name = os.path.split(model_path)
    found = _MODEL_FILE.search(name)
    mp = found.group(1) if found else "00"
    pattern = re.compile(rf"^(?:bf16_)?zero_pp_rank_(\d+)_mp_rank_{mp}_optim_states\.pt$")
    ranks: dict[int, str] = {}
    for entry in sorted(os.listdir(folder)):
        hit = pattern.match(entry)
        if hit:
            ranks[int(hit.group(1))] = os.path.join(folder, entry)
    if not ranks or sorted(ranks) != list(range(len(ranks))):
        raise VlccFileNotFoundError(
            f"{folder} holds the optimizer files of ranks {sorted(ranks)}, not those of "
            "ranks 0..N-1 of one ZeRO checkpoint: copy every rank's "
            "zero_pp_rank_*_optim_states.pt file of the save"
        )
    out = []
    for r in range(len(ranks)):
        sd = model_engine.checkpoint_engine.load(ranks[r], map_location="cpu")
        sd = sd.get("optimizer_state_dict", sd) if isinstance(sd, dict) else sd
        if not (isinstance(sd, dict) and _FP32 in sd and _BASE in sd):
            raise VlccValueError(
                f"{ranks[r]} is not a ZeRO stage 1 or 2 optimizer file (no {_FP32!r}); "
                "ZeRO-3 files are resharded by DeepSpeed's universal checkpoint"
            )
        out.append(sd)
    return out


def _base_state(sd: dict) -> list[dict]:
    """Per parameter group, the base optimizer's state (moments, step) of one rank's file."""
    base = sd[_BASE]
    if isinstance(base, dict):  # a rigid checkpoint: the base optimizer's state_dict
        st = base["state"]
        return [st[i] for i in range(len(sd[_FP32]))]
    return list(base)  # an elastic one: per group, without padding


def _dp_rank(optimizer) -> int:
    """This process's rank among the data-parallel ranks of the optimizer's groups."""
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()):
        return 0
    group = getattr(optimizer, "real_dp_process_group", [None])[0]
    return int(dist.get_rank(group=group))


def _total_padding(optimizer, i: int, size: int, padding: int) -> int:
    """The zeros at the end of group `i`'s flat buffer (on the last rank's partition).

    Only the last rank has padding, and it knows it; the others compute it from
    the group's unpadded length, which every rank derives from the model's
    parameters in the group (the bit16 groups)."""
    groups = getattr(optimizer, "bit16_groups", None)
    if groups is not None:
        lean = sum(p.numel() for p in groups[i])
        paddings = getattr(optimizer, "round_robin_bit16_padding", None)
        if paddings is not None:
            lean += sum(int(x) for x in paddings[i])
        return optimizer.partition_count[i] * size - lean
    return padding
