"""A tiny transformer language model, its generated corpora and a deterministic training step.

The story of training checkpoints (``examples/lineage_lm.py``, the DCP
benchmark and their tests) needs a real model that trains in seconds on one
CPU thread and replays bit for bit: a step restarted from a checkpoint must
produce the same loss as the step of the original run.  Three things make
that so here:

1. **The data of a step is a function of the step.**  :func:`batch` draws
   the windows of step ``s`` from a generator seeded with ``(seed, s)``, not
   from a stream consumed by earlier steps, so a run resumed at step ``s``
   sees exactly the batches the original saw (no data-loader state to save).
2. **The arithmetic is fixed.**  :func:`deterministic` selects one CPU
   thread (reductions in one order) and ``torch.use_deterministic_algorithms``;
   there is no dropout, and attention is written out (masked softmax of
   ``q k^T``), not dispatched to a fused kernel that may pick an algorithm
   per shape.
3. **Everything the next step reads is in the checkpoint:** the weights and
   the optimizer's state (AdamW's moments and step counts); the learning
   rate is a function of the step, set before each step.

The corpora are generated, never downloaded (a few hundred KB):

- ``"grammar"``: sentences of a seeded random Markov chain over 16 letters
  (words of 2-5 letters, sparse transitions, a space between words and a
  full stop at the end), the pre-training task;
- ``"addition"``: lines ``"27+58=85;"`` of two-digit sums, the fine-tuning
  task (a different distribution over the same vocabulary).

The model is GPT-shaped (pre-LayerNorm blocks of causal self-attention and
a GELU MLP, learned positions, tied input/output embedding); about 105 K
parameters at the default size.  ``adapter_rank > 0`` adds low-rank
adapters (LoRA: ``W x + B A x``, ``B`` zero at the start) to every linear
layer of the blocks; :func:`freeze_base` then leaves only the adapters
trainable (fine-tuning with a frozen base).

Reference: Radford et al. (2019), "Language models are unsupervised
multitask learners" (the GPT-2 block); Hu et al. (2022), "LoRA: low-rank
adaptation of large language models", ICLR.
"""

from __future__ import annotations

import math
import random

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from ..errors import VlccValueError

__all__ = [
    "VOCAB",
    "TinyLM",
    "batch",
    "corpus",
    "decode",
    "deterministic",
    "evaluate",
    "freeze_base",
    "train_step",
]

#: The shared vocabulary: letters a-p, digits, and ' ', '.', '+', '=', ';' (31 symbols).
VOCAB = "abcdefghijklmnop0123456789 .+=;"
_INDEX = {c: i for i, c in enumerate(VOCAB)}


def deterministic(seed: int = 0) -> None:
    """One thread, deterministic kernels, seeded generators (call once, before building)."""
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(seed)


def _encode(text: str) -> np.ndarray:
    return np.fromiter((_INDEX[c] for c in text), dtype=np.uint8, count=len(text))


def decode(tokens) -> str:
    """The text of a sequence of token ids."""
    return "".join(VOCAB[int(t)] for t in tokens)


def corpus(task: str = "grammar", n_tokens: int = 200_000, seed: int = 0) -> np.ndarray:
    """A generated corpus of about `n_tokens` tokens (``uint8`` ids into :data:`VOCAB`).

    **Arguments:**

    - `task`: ``"grammar"`` (sentences of a random Markov chain over letters)
      or ``"addition"`` (lines like ``"27+58=85;"``).
    - `n_tokens`: its length.
    - `seed`: the generator's seed (the same seed gives the same corpus).
    """
    # Python's generator, drawing only floats (``random()`` is the same on every
    # platform and version): a per-token numpy call would make this 20x slower.
    rng = random.Random(seed)

    def draw(n: int) -> int:
        return int(rng.random() * n)

    parts: list[str] = []
    size = 0
    if task == "grammar":
        letters = VOCAB[:16]
        # each letter may be followed by 3 of the 16, with fixed random weights
        follow = [rng.sample(range(16), 3) for _ in range(16)]
        cumulative = []
        for _ in range(16):
            w = [rng.random() + 0.05 for _ in range(3)]
            cumulative.append([sum(w[: i + 1]) / sum(w) for i in range(3)])
        while size < n_tokens:
            words = []
            for _ in range(3 + draw(5)):
                c = draw(16)
                word = [letters[c]]
                for _ in range(1 + draw(4)):
                    u = rng.random()
                    c = follow[c][next(i for i, q in enumerate(cumulative[c]) if u < q or i == 2)]
                    word.append(letters[c])
                words.append("".join(word))
            parts.append(" ".join(words) + ". ")
            size += len(parts[-1])
    elif task == "addition":
        while size < n_tokens:
            a, b = 10 + draw(90), 10 + draw(90)
            parts.append(f"{a}+{b}={a + b};")
            size += len(parts[-1])
    else:
        raise VlccValueError(f"task must be 'grammar' or 'addition', got {task!r}")
    return _encode("".join(parts)[:n_tokens])


def batch(
    data: np.ndarray, step: int, batch_size: int = 32, context: int = 32, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch of training step `step`: inputs and next-token targets, ``(batch, context)``.

    Drawn from a generator seeded with ``(seed, step)``: any step's batch is
    known without replaying the steps before it (a resumed run sees the
    original batches).
    """
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    starts = torch.randint(0, len(data) - context - 1, (batch_size,), generator=g)
    idx = starts[:, None] + torch.arange(context + 1)
    tokens = torch.from_numpy(data.astype(np.int64))[idx]
    return tokens[:, :-1], tokens[:, 1:]


class LoRALinear(nn.Module):
    """A linear layer with an optional low-rank adapter: ``W x + b + (alpha / r) B A x``."""

    def __init__(self, n_in: int, n_out: int, rank: int = 0, alpha: float = 8.0):
        super().__init__()
        self.base = nn.Linear(n_in, n_out)
        self.rank = rank
        if rank:
            self.lora_a = nn.Parameter(torch.randn(rank, n_in) / math.sqrt(n_in))
            self.lora_b = nn.Parameter(torch.zeros(n_out, rank))
            self.scale = alpha / rank

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base(x)
        if self.rank:
            y = y + self.scale * (x @ self.lora_a.T) @ self.lora_b.T
        return y


class _Block(nn.Module):
    def __init__(self, d: int, heads: int, rank: int):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv = LoRALinear(d, 3 * d, rank)
        self.proj = LoRALinear(d, d, rank)
        self.up = LoRALinear(d, 4 * d, rank)
        self.down = LoRALinear(4 * d, d, rank)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.heads)
        att = torch.softmax(att.masked_fill(mask[:t, :t], float("-inf")), dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(y)
        return x + self.down(F.gelu(self.up(self.ln2(x))))


class TinyLM(nn.Module):
    """A GPT-shaped character model.

    **Arguments:**

    - `d_model`, `n_layers`, `n_heads`: width, depth, attention heads.
    - `context`: the longest sequence (learned positions).
    - `adapter_rank`: rank of LoRA adapters on every linear layer of the
      blocks (0: none).
    - `seed`: seeds the initial weights (the same seed, the same model).
    """

    def __init__(
        self,
        d_model: int = 64,
        n_layers: int = 2,
        n_heads: int = 4,
        context: int = 32,
        adapter_rank: int = 0,
        seed: int = 0,
    ):
        super().__init__()
        if d_model % n_heads:
            raise VlccValueError(f"d_model ({d_model}) must be a multiple of n_heads ({n_heads})")
        g = torch.random.fork_rng()
        with g:
            torch.manual_seed(seed)
            self.embed = nn.Embedding(len(VOCAB), d_model)
            self.pos = nn.Parameter(0.02 * torch.randn(context, d_model))
            self.blocks = nn.ModuleList(
                _Block(d_model, n_heads, adapter_rank) for _ in range(n_layers)
            )
            self.ln = nn.LayerNorm(d_model)
            nn.init.normal_(self.embed.weight, std=0.02)
        self.register_buffer(
            "mask", torch.triu(torch.ones(context, context, dtype=torch.bool), 1), persistent=False
        )

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits ``(batch, time, vocab)`` of the next token."""
        x = self.embed(tokens) + self.pos[: tokens.shape[1]]
        for block in self.blocks:
            x = block(x, self.mask)
        return self.ln(x) @ self.embed.weight.T


def freeze_base(model: TinyLM) -> list[nn.Parameter]:
    """Freeze every weight but the adapters; **Returns:** the trainable parameters."""
    trainable = []
    for name, p in model.named_parameters():
        p.requires_grad_("lora_" in name)
        if p.requires_grad:
            trainable.append(p)
    if not trainable:
        raise VlccValueError("the model has no adapters to train; build it with adapter_rank > 0")
    return trainable


def train_step(
    model: TinyLM, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor, lr: float
) -> float:
    """One optimizer step at learning rate `lr` (no clipping); **Returns:** the batch's loss
    before the step."""
    for group in optimizer.param_groups:
        group["lr"] = lr
    optimizer.zero_grad(set_to_none=True)
    loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
    loss.backward()
    optimizer.step()
    return float(loss.detach())


@torch.no_grad()
def evaluate(
    model: TinyLM,
    data: np.ndarray,
    batches: int = 4,
    batch_size: int = 64,
    context: int = 32,
    seed: int = 12345,
) -> float:
    """Mean cross-entropy over `batches` fixed held-out batches (nats per token)."""
    total = 0.0
    for i in range(batches):
        x, y = batch(data, i, batch_size, context, seed)
        total += float(F.cross_entropy(model(x).flatten(0, 1), y.flatten()))
    return total / batches
