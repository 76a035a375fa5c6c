"""A fused group's adapter and LoRA outputs added to their sums inside the matmul that makes them (a step setting,
`ADAPTUNE_BRANCH_SUMS`: "in_matmul", the default, or "separate", the layers' own operators).

An adapter is `a + up(act(down(a)))`, a LoRA layer `base(x) + B(A(x)) * scaling`: each writes its branch's output at
the hidden width and then the sum, another pass over the same bytes; in the backward pass the adapter's input, read
by its down projection and by its skip, gets two gradients that autograd adds up in one more. A group's batched
matmul can do both additions itself (baddbmm's input is added to its product with the product's own accumulator):
- adapters: the up projection's output is added to `a` in the matmul, its bias taken in as one more input column of
  ones (padded with zeros to a multiple of 8 columns, which tensor-core matmuls want), and the input's gradient is the
  skip's plus the down projection's in one matmul too (`grouped_adapter`: an autograd Function gives the down
  projection and the skip together, so that its backward pass gets both gradients, which autograd would add itself);
- LoRA: `baddbmm(base(x), A(x), B, alpha=scaling)` (`grouped_lora_sum`), autograd's own.
At BERT-base width that takes 4 full-width passes a layer off an adapter group's step, 8% of the bytes it writes
(`make bench-attention`); rounding differs only in that a sum is rounded once instead of twice. A run alone, or in a
group of one, keeps its layers' own operators (it trains exactly as alone); so does a step torch.compile traces
(inductor fuses the additions itself).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from adaptune.core.step_settings import BRANCH_SUMS_ENV, STEP_SETTINGS, step_setting

BRANCH_SUMS_MODES = STEP_SETTINGS[BRANCH_SUMS_ENV][1]
_ALIGN = 8  # columns: a bf16 matmul's operand rows must start at 16-byte boundaries for the tensor cores


def branch_sums_mode() -> str:
    """$ADAPTUNE_BRANCH_SUMS: "in_matmul" (unset) or "separate"."""
    return step_setting(BRANCH_SUMS_ENV)


def sums_in_matmul(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether a group's branch on input x, with stacked weights `weight` (runs first), adds its output in the matmul:
    more than one run, the setting asks for it, no torch.compile is tracing, and the matmul runs in x's dtype (the sum
    keeps it, as the layers' own operators give it)."""
    return (weight.shape[0] > 1 and not torch.compiler.is_compiling() and branch_sums_mode() == "in_matmul"
            and matmul_dtype(x, weight) == x.dtype)


def grouped_adapter(x: torch.Tensor, down_weight: torch.Tensor, down_bias: torch.Tensor, up_weight: torch.Tensor,
                    up_bias: torch.Tensor, activation: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """`x + up(activation(down(x)))` for a group: run r's weights ((runs, out, in) stacks, biases (runs, out)) applied
    to the r-th of x's runs equal blocks of rows, in x's dtype (sums_in_matmul: autocast's, where it is on)."""
    runs = down_weight.shape[0]
    pre_activation, skip = _DownAndSkip.apply(x.reshape(runs, -1, x.shape[-1]), down_weight, down_bias)
    hidden = _with_ones(activation(pre_activation))
    up = _with_bias(up_weight, up_bias)
    return torch.baddbmm(skip, hidden, up.transpose(1, 2)).reshape(x.shape)  # x + the up projection: one pass


def grouped_lora_sum(base: torch.Tensor, hidden: torch.Tensor, b_weight: torch.Tensor, scaling: float) -> torch.Tensor:
    """`base + (hidden @ B_r^T) * scaling`, run r's B ((runs, out, rank)) for the r-th block of rows, in one matmul."""
    runs = b_weight.shape[0]
    blocks = hidden.reshape(runs, -1, hidden.shape[-1])
    out = torch.baddbmm(base.reshape(runs, -1, base.shape[-1]), blocks, b_weight.transpose(1, 2), alpha=scaling)
    return out.reshape(base.shape)


def matmul_dtype(x: torch.Tensor, weight: torch.Tensor) -> torch.dtype:
    """The dtype a batched matmul of x and weight runs in: autocast's, or their promotion without autocast."""
    device = x.device.type
    if torch.is_autocast_enabled(device):
        return torch.get_autocast_dtype(device)
    return torch.promote_types(x.dtype, weight.dtype)


def _with_ones(hidden: torch.Tensor) -> torch.Tensor:
    """hidden's rows with columns of ones after them, up to a multiple of _ALIGN (one at least): the bias's inputs.
    A cat, whose backward pass hands hidden its gradient as a view (a pad's copies it)."""
    ones = hidden.new_ones(1, 1, 1).expand(*hidden.shape[:-1], _ALIGN - hidden.shape[-1] % _ALIGN)
    return torch.cat([hidden, ones], dim=-1)


def _with_bias(weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """(runs, out, in) weights with the bias as the next input column and zeros after it, as _with_ones' columns."""
    runs, out, inner = weight.shape
    return torch.cat([weight, bias.unsqueeze(-1), weight.new_zeros(runs, out, _ALIGN - inner % _ALIGN - 1)], dim=-1)


class _DownAndSkip(torch.autograd.Function):
    """The down projection of x's blocks, and x itself for the skip: autograd hands the backward pass both gradients
    at once, so the input's gradient is the skip's plus the down projection's in one baddbmm."""

    @staticmethod
    def forward(ctx: Any, blocks: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        dtype = matmul_dtype(blocks, weight)
        with torch.autocast(blocks.device.type, enabled=False):  # as autocast runs baddbmm: every operand in its dtype
            pre_activation = torch.baddbmm(bias.to(dtype).unsqueeze(1), blocks.to(dtype), weight.to(dtype).transpose(1, 2))
        ctx.save_for_backward(blocks, weight)
        ctx.bias_dtype = bias.dtype
        return pre_activation, blocks

    @staticmethod
    def backward(ctx: Any, grad_pre_activation: torch.Tensor, grad_skip: torch.Tensor) -> tuple[torch.Tensor, ...]:
        blocks, weight = ctx.saved_tensors
        dtype = grad_pre_activation.dtype
        grad_blocks = torch.baddbmm(grad_skip.to(dtype), grad_pre_activation, weight.to(dtype))
        grad_weight = torch.bmm(grad_pre_activation.transpose(1, 2), blocks.to(dtype))
        return (grad_blocks.to(blocks.dtype), grad_weight.to(weight.dtype),
                grad_pre_activation.sum(1).to(ctx.bias_dtype))
