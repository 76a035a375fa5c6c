"""Dropout whose masks come from each run's own seed, so a run's result does not depend on which runs
shared its forward pass (adaptune.model.run_groups), nor on whether it trained alone.

Every dropout of a training model (the embeddings', each sublayer's, the attention probabilities',
the classifier's, LoRA's) becomes a `RunDropout`. It draws run i's mask from run i's own
`torch.Generator`, in the shape run i's batch has when it trains alone: its real rows, padded to its
own longest row. A group pads every run's rows to a common length and block size; the mask is drawn
at the run's own shape and laid into the top-left of its block (what lies outside is padding, which
no real position reads). The same run, step and site thus get the same mask in any group.

The attention probabilities' dropout lives inside transformers' attention function, which draws from
the global generator; `RUN_DROPOUT_ATTENTION` is an attention function (registered with transformers'
AttentionInterface) that applies the layer's RunDropout there instead, and uses SDPA where no dropout
applies (evaluation).
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, eager_mask

RUN_DROPOUT_ATTENTION = "adaptune_run_dropout"
# Each run's dropout stream is its own generator, apart from the data-order streams
# (batching.epoch_batches seeds seed * 1_000_003 + epoch, with epoch < 1_000_002).
_DROPOUT_STREAM = 1_000_002


def dropout_generator(seed: int, device: torch.device) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed * 1_000_003 + _DROPOUT_STREAM)


@dataclasses.dataclass
class RowLayout:
    """How a step's rows split into runs: k blocks of `block_rows` rows; run i's first `rows[i]` rows
    are real and its own longest row is `lengths[i]` tokens (after the collator's rounding)."""

    block_rows: int
    rows: list[int]
    lengths: list[int]


class RunRandomness:
    """What every RunDropout of one model shares: each run's generator, and the current step's layout
    (None: the rows are one block per generator, at their full shape, as when a run trains alone)."""

    def __init__(self, generators: list[torch.Generator]) -> None:
        self.generators = generators
        self.layout: RowLayout | None = None

    def keep(self, indices: list[int]) -> None:
        self.generators = [self.generators[i] for i in indices]


class RunDropout(nn.Module):
    """nn.Dropout with per-run masks (module docstring). Inputs: (rows, features) after pooling,
    (rows, tokens, features) in the sublayers, (rows, heads, tokens, tokens) for attention."""

    def __init__(self, p: float, randomness: RunRandomness) -> None:
        super().__init__()
        self.p = p
        self.randomness = randomness

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0:
            return x
        generators = self.randomness.generators
        runs = len(generators)
        blocks = x.reshape(runs, -1, *x.shape[1:])
        layout = self.randomness.layout
        mask = blocks.new_ones(blocks.shape) if layout is not None else torch.empty_like(blocks)
        for run, generator in enumerate(generators):
            if layout is None:
                mask[run].bernoulli_(1 - self.p, generator=generator)
                continue
            own = _own_shape(blocks.shape[1:], layout.rows[run], layout.lengths[run])
            region = tuple(slice(0, size) for size in own)
            mask[run][region] = torch.empty(own, device=x.device, dtype=x.dtype).bernoulli_(1 - self.p, generator=generator)
        return (blocks * mask).reshape(x.shape) / (1 - self.p)

    def extra_repr(self) -> str:
        return f"p={self.p}"


def _own_shape(block_shape: torch.Size, rows: int, length: int) -> tuple[int, ...]:
    """A run's own shape within its block: its real rows, and its own length on the token axes."""
    if len(block_shape) == 4:  # attention probabilities: rows, heads, queries, keys
        return (rows, block_shape[1], length, length)
    if len(block_shape) == 3:  # rows, tokens, features
        return (rows, length, block_shape[2])
    return (rows, *block_shape[1:])


def use_run_dropout(model: nn.Module, generators: list[torch.Generator]) -> RunRandomness:
    """Replace every nn.Dropout of the model by a RunDropout drawing from `generators` (one per run),
    and route attention through RUN_DROPOUT_ATTENTION; in place. Returns the shared RunRandomness."""
    randomness = RunRandomness(generators)
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Dropout):
                setattr(parent, name, RunDropout(child.p, randomness).train(child.training))
    _set_attention(model)
    return randomness


def _set_attention(model: nn.Module) -> None:
    if RUN_DROPOUT_ATTENTION not in AttentionInterface._global_mapping:
        AttentionInterface.register(RUN_DROPOUT_ATTENTION, run_dropout_attention)
        ALL_MASK_ATTENTION_FUNCTIONS.register(RUN_DROPOUT_ATTENTION, eager_mask)  # additive masks: both branches read them
    model.set_attn_implementation(RUN_DROPOUT_ATTENTION)


def run_dropout_attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                          attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
                          **kwargs) -> tuple[torch.Tensor, torch.Tensor | None]:
    """transformers' eager attention with the layer's RunDropout on the probabilities; SDPA without dropout."""
    if dropout == 0.0 or not isinstance(getattr(module, "dropout", None), RunDropout):
        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs)
    scores = torch.matmul(query, key.transpose(2, 3)) * (scaling if scaling is not None else query.size(-1) ** -0.5)
    if attention_mask is not None:
        scores = scores + attention_mask
    probabilities = module.dropout(nn.functional.softmax(scores, dim=-1))
    return torch.matmul(probabilities, value).transpose(1, 2).contiguous(), probabilities
