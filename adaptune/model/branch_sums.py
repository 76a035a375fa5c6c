"""A fused group's adapter and LoRA outputs added to their sums inside the matmul that makes them (a step setting,
`ADAPTUNE_BRANCH_SUMS`: "in_matmul", the default, or "separate", the layers' own operators).

An adapter is `a + up(act(down(a)))`, a LoRA layer `base(x) + B(A(x)) * scaling`: each writes its branch's output at
the hidden width and then the sum, another pass over the same bytes; in the backward pass the adapter's input, read
by its down projection and by its skip, gets two gradients that autograd adds up in one more. A group's batched
matmul can do both additions itself (baddbmm's input is added to its product with the product's own accumulator):
- adapters: the up projection's output is added to `a` in the matmul, its bias taken in as one more input column of
  ones (padded with zeros to a multiple of 8 columns, which tensor-core matmuls want), and the input's gradient is the
  skip's plus the down projection's in one matmul too (`grouped_adapter`, an autograd Function, since autograd
  would add the two up itself);
- LoRA: `baddbmm(base(x), A(x), B, alpha=scaling)` (`grouped_lora_sum`), autograd's own.
At BERT-base width that takes 4 full-width passes a layer off an adapter group's step (`make bench-attention`);
rounding differs only in that a sum is rounded once instead of twice. A run alone, or in a group of one, keeps
its layers' own operators (it trains exactly as alone); so does a step torch.compile traces (inductor fuses the
additions itself).
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
    return _GroupedAdapter.apply(x, down_weight, down_bias, up_weight, up_bias, activation)


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
    """hidden's rows with columns of ones after them, up to a multiple of _ALIGN (one at least): the bias's inputs."""
    return torch.nn.functional.pad(hidden, (0, _ALIGN - hidden.shape[-1] % _ALIGN), value=1.0)


def _with_bias(weight: torch.Tensor, bias: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(runs, out, in) weights with the bias as the next input column and zeros after it, as _with_ones' columns."""
    runs, out, inner = weight.shape
    zeros = weight.new_zeros(runs, out, _ALIGN - inner % _ALIGN - 1)
    return torch.cat([weight, bias.unsqueeze(-1), zeros], dim=-1).to(dtype)


class _GroupedAdapter(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, down_weight: torch.Tensor, down_bias: torch.Tensor, up_weight: torch.Tensor,
                up_bias: torch.Tensor, activation: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        device, dtype, runs = x.device.type, x.dtype, down_weight.shape[0]
        with torch.autocast(device, enabled=False):
            blocks = x.reshape(runs, -1, x.shape[-1])
            pre_activation = torch.baddbmm(down_bias.to(dtype).unsqueeze(1), blocks, down_weight.to(dtype).transpose(1, 2))
        activated = activation(pre_activation).to(dtype)  # under autocast as the adapter's own (some activations' ops run in float32)
        with torch.autocast(device, enabled=False):
            hidden = _with_ones(activated)
            up = _with_bias(up_weight, up_bias, dtype)
            out = torch.baddbmm(blocks, hidden, up.transpose(1, 2))  # x + the up projection: one pass
        ctx.save_for_backward(blocks, pre_activation, hidden, down_weight, up)
        ctx.activation, ctx.autocast = activation, torch.is_autocast_enabled(device)
        ctx.dtypes = down_weight.dtype, up_weight.dtype
        return out.reshape(x.shape)

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[Any, ...]:
        blocks, pre_activation, hidden, down_weight, up = ctx.saved_tensors
        down_dtype, up_dtype = ctx.dtypes
        device, dtype, inner = blocks.device.type, blocks.dtype, pre_activation.shape[-1]
        grad = grad_out.reshape(blocks.shape).to(dtype)
        grad_up = torch.bmm(grad.transpose(1, 2), hidden)  # the up weights' and (column `inner`) the bias's gradient
        grad_hidden = torch.bmm(grad, up[..., :inner])
        # Any activation's derivative, recomputed at the bottleneck's small width under the forward pass's autocast.
        with torch.enable_grad(), torch.autocast(device, dtype=dtype, enabled=ctx.autocast):
            point = pre_activation.detach().requires_grad_()
            (grad_pre,) = torch.autograd.grad(ctx.activation(point).to(dtype), point, grad_hidden)
        grad_x = torch.baddbmm(grad, grad_pre, down_weight.to(dtype))  # the skip's gradient plus the down projection's: one pass
        grad_down = torch.bmm(grad_pre.transpose(1, 2), blocks)
        return (grad_x.reshape(grad_out.shape), grad_down.to(down_dtype), grad_pre.sum(1).to(down_dtype),
                grad_up[..., :inner].to(up_dtype), grad_up[..., inner].to(up_dtype), None)
