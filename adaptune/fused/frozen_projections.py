"""One matmul for a layer's frozen query, key and value projections.

Every method that leaves a layer's self-attention frozen (adapters, Pfeiffer, LayerNorm-only, and the
layers below top_k's) multiplies the same input by three frozen matrices. Stacked into one (3 x hidden)
matrix they are one matmul: under bf16 autocast one cast of the input instead of three, and in the
backward pass one matmul for the input's gradient instead of three matmuls, three casts and two float32
adds; with eager attention the price is one `cat` joining the three gradients. The census of a fused BERT-base-width step
(`make bench-attention`) counts what that saves; a launch-bound solo step saves the launches, a
device-bound group the bytes, and the matmul is wider. The trainers stack only where the frozen matmuls
run in the autocast dtype (after keep_frozen_matmuls_in): in float32 a CPU step gained nothing
(`make bench-projections`). The attention kernel takes the stacked output whole
(kernels.attention.run_dropout_attention_stacked): it reads the three where they lie and writes their gradients side by
side, so with the kernel there is no `cat`.

The layer keeps its `query`, `key` and `value` modules (their state-dict names and weights are
unchanged); the stacked copy is a non-persistent buffer, made after the weights are loaded and cast
(`stack_frozen_projections`), so it moves with the model and is never saved. Layers whose projections
train, or that peft wraps (LoRA, (IA)3), keep transformers' own forward.
"""

from __future__ import annotations

import functools
from typing import Any, Protocol

import torch
from torch import nn
from torch.nn import functional as F
from transformers import PretrainedConfig
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.models.bert.modeling_bert import eager_attention_forward

from adaptune.fused.run_dropout import RUN_DROPOUT_ATTENTION, RunDropout

PROJECTIONS = ("query", "key", "value")


def stack_frozen_projections(model: nn.Module) -> int:
    """Give every self-attention whose query, key and value are frozen nn.Linear layers one stacked
    matmul, in place (faster on a GPU, bench/LOG.md; the separate form went with its setting); returns how many
    layers changed. Call after the model's last cast (a later move carries the buffers along)."""
    fused = 0
    for module in model.modules():
        if _fusable(module):
            weight = torch.cat([getattr(module, name).weight.detach() for name in PROJECTIONS])
            bias = torch.cat([getattr(module, name).bias.detach() for name in PROJECTIONS])
            module.register_buffer("stacked_projection_weight", weight, persistent=False)
            module.register_buffer("stacked_projection_bias", bias, persistent=False)
            cls: type = type(module)  # as a plain class: mypy matches type[nn.Module] to Hashable through its instances' __hash__
            module.__class__ = _stacked_class(cls)
            fused += 1
    return fused


def _fusable(module: nn.Module) -> bool:
    found = [getattr(module, name, None) for name in PROJECTIONS]
    projections = [projection for projection in found if type(projection) is nn.Linear and projection.bias is not None]
    if len(projections) != len(PROJECTIONS):
        return False
    if any(parameter.requires_grad for projection in projections for parameter in projection.parameters()):
        return False
    dtypes = {projection.weight.dtype for projection in projections}
    return (len(dtypes) == 1 and hasattr(module, "attention_head_size") and not getattr(module, "is_decoder", False)
            and not hasattr(module, "stacked_projection_weight"))


@functools.cache
def _stacked_class(cls: type) -> type:
    """`cls` with the stacked forward: isinstance checks and every attribute stay as they were."""
    return type(f"Stacked{cls.__name__}", (cls,), {"forward": _stacked_forward})


class _StackedSelfAttention(Protocol):
    """What _stacked_forward reads of a self-attention (transformers' BertSelfAttention) given its stacked buffers."""

    stacked_projection_weight: torch.Tensor
    stacked_projection_bias: torch.Tensor
    attention_head_size: int
    all_head_size: int
    scaling: float
    config: PretrainedConfig
    dropout: nn.Dropout | RunDropout  # a RunDropout where use_run_dropout replaced it
    training: bool


def _stacked_forward(self: _StackedSelfAttention, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None,
                     past_key_values: Any = None, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    """transformers' BertSelfAttention.forward (encoder path) with the three projections as one matmul."""
    if past_key_values is not None:  # a decoder's cache: transformers' own path
        # the forward of the class _stacked_class derived from (looked up at run time: statically, `self` has no base)
        return getattr(super(type(self), self), "forward")(hidden_states, attention_mask, past_key_values, **kwargs)
    input_shape = hidden_states.shape[:-1]
    hidden_shape = (*input_shape, -1, self.attention_head_size)
    stacked = F.linear(hidden_states, self.stacked_projection_weight, self.stacked_projection_bias)
    query, key, value = (part.view(*hidden_shape).transpose(1, 2) for part in stacked.split(self.all_head_size, dim=-1))
    attention = ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation, eager_attention_forward)
    if self.config._attn_implementation == RUN_DROPOUT_ATTENTION:  # its kernel takes the three as one tensor
        kwargs = {**kwargs, "stacked_projections": stacked}
    output, weights = attention(self, query, key, value, attention_mask, dropout=0.0 if not self.training else self.dropout.p,
                                scaling=self.scaling, **kwargs)
    return output.reshape(*input_shape, -1).contiguous(), weights
