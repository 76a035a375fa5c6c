"""A fused group's trained LayerNorms (run_groups.GroupedLayerNorm: shared normalisation, each run's scale and
shift) in one Triton kernel each way (`ADAPTUNE_LAYER_NORM=kernel`; "torch", the default, runs torch's operators).

Why: torch has no LayerNorm whose scale and shift change from one block of rows to the next, so a group normalises
with F.layer_norm and applies each run's scale and shift with a broadcast product and sum. Each of those writes a
float32 tensor of the group's whole hidden state, and the backward pass writes two more (the gradient times the
scale, and times the normalized input, before the per-run sums): a large share of the bytes a layer's step writes
(`make bench-attention`), and a fused step on a GPU is bound by such passes (figures: bench/LOG.md, "Figures moved
out of the code's comments"). Here
the forward pass writes only the output (and each row's mean and reciprocal deviation), and the backward pass
only the input's gradient and, per program, partial sums of the scale's and shift's gradients over its rows, which
torch adds up per run (a fixed order: the same bits on every replay). The library kernels (torch's, apex's, the
Triton tutorial's, Liger's) take one scale for every row; torch.compile fuses this too, and under it (compiled
layers) the torch operators stay for inductor.

Statistics in float32: mean, then the variance of the centred values (as torch's), rstd = 1 / sqrt(var + eps). The
output's dtype is the promotion of the input's and the scale's (float32 for the trainers' float32 scales, as
torch's path gives under autocast, which runs layer_norm in float32), or the one asked for, written by the kernel with no cast after it. On a CPU
the kernel runs only under Triton's interpreter (TRITON_INTERPRET=1), which is how the tests check it.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from adaptune.fused.kernels.triton_device import interpreted_bf16, lines_per_tile, power_of_two_at_least, runs_triton
from adaptune.fused.settings import LAYER_NORM_ENV, VALUES

LAYER_NORM_MODES = VALUES["layer_norm"]
_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
MAX_FEATURES = 8192  # a row is one program's tile (BERT-large's 1,024 features; 8,192 is 32 float32 registers a thread at 8 warps)
# The backward pass's programs, about: two an H100's streaming multiprocessor, and few partial sums to write and add up
# (a group of 8 BERT-base runs at 40 tokens: 40 rows a program, partial sums 5% of the input gradient's bytes).
_PROGRAMS = 256
_MIN_ROWS = 32  # rows a backward program sums at least


def kernel_applies(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether a GroupedLayerNorm call on `x` with the runs' scales `weight` ((runs, features)) runs in the kernel:
    no torch.compile is tracing (inductor fuses the torch operators), the dtypes are float32,
    float16 or bf16, a row fits a program and the device runs Triton (a GPU, or a CPU under the interpreter)."""
    if torch.compiler.is_compiling():
        return False
    fits = (x.dtype in _DTYPES and weight.dtype in _DTYPES and weight.dim() == 2 and x.shape[-1] == weight.shape[1] <= MAX_FEATURES
            and x.numel() > 0 and x.numel() % weight.numel() == 0)
    return fits and runs_triton(x)


def grouped_layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float,
                       out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """LayerNorm over x's last axis with run r's `weight[r]` and `bias[r]` ((runs, features) each) applied to the
    r-th of x's runs equal blocks of rows, in `out_dtype` (None: the promotion of x's and weight's). Differentiable in
    x, weight and bias."""
    return _forward(x, weight, bias, eps, out_dtype)[0]


def _block(features: int) -> int:
    return power_of_two_at_least(features)


def _lines(features: int) -> int:
    """Rows a tile holds: about a thousand elements (one row of BERT's widths, many of a narrow model's)."""
    return lines_per_tile(_block(features))


def _warps(features: int) -> int:
    return max(1, min(8, _lines(features) * _block(features) // 256))


# Custom operators (torch.library), as the other kernels': one opaque node to torch.compile, shapes from the fake
# implementations, the backward pass its own operator.
@torch.library.custom_op("adaptune::grouped_layer_norm", mutates_args=())
def _forward(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float,
             out_dtype: torch.dtype | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    dtype = out_dtype or torch.promote_types(x.dtype, weight.dtype)
    # bf16 in or out under Triton's interpreter: float32 in, the result rounded with torch, the GPU kernel's values.
    if any(interpreted_bf16(tensor) for tensor in (x, weight, bias)) or interpreted_bf16(x, dtype):
        out, mean, rstd = _forward(x.float(), weight.float(), bias.float(), eps, None)
        return out.to(dtype), mean, rstd
    x = x.contiguous()
    runs, features = weight.shape
    rows = x.numel() // features
    out = torch.empty(x.shape, dtype=dtype, device=x.device)
    mean = torch.empty(rows, dtype=torch.float32, device=x.device)
    rstd = torch.empty_like(mean)
    lines = _lines(features)
    _kernels()[0][(-(-rows // lines),)](x, weight.contiguous(), bias.contiguous(), out, mean, rstd, rows, rows // runs, features, eps,
                                        LINES=lines, BLOCK=_block(features), num_warps=_warps(features))
    return out, mean, rstd


@_forward.register_fake
def _(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float,
      out_dtype: torch.dtype | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    rows = x.numel() // weight.shape[1]
    statistics = x.new_empty(rows, dtype=torch.float32)
    out = x.new_empty(x.shape, dtype=out_dtype or torch.promote_types(x.dtype, weight.dtype))
    return out, statistics, torch.empty_like(statistics)


@torch.library.custom_op("adaptune::grouped_layer_norm_backward", mutates_args=())
def _backward_op(grad_out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, mean: torch.Tensor, rstd: torch.Tensor,
                 grad_x_needed: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(the input's gradient, or an empty tensor where not needed; the scales' gradient; the shifts')."""
    if any(interpreted_bf16(tensor) for tensor in (grad_out, x, weight)):
        grad_x, grad_weight, grad_bias = _backward_op(grad_out.float(), x.float(), weight.float(), mean, rstd, grad_x_needed)
        return grad_x.to(x.dtype), grad_weight.to(weight.dtype), grad_bias.to(weight.dtype)
    runs, features = weight.shape
    rows_per_run = x.numel() // features // runs
    rows = max(_MIN_ROWS, -(-rows_per_run * runs // _PROGRAMS))
    parts = -(-rows_per_run // rows)
    grad_x = torch.empty(x.shape if grad_x_needed else (0,), dtype=x.dtype, device=x.device)
    partial_weight = torch.empty(runs, parts, features, dtype=torch.float32, device=x.device)
    partial_bias = torch.empty_like(partial_weight)
    _kernels()[1][(runs, parts)](x.contiguous(), weight.contiguous(), grad_out.contiguous(), mean, rstd, grad_x, partial_weight,
                                 partial_bias, rows_per_run, features, ROWS=rows, LINES=_lines(features), BLOCK=_block(features),
                                 GRAD_X=grad_x_needed, num_warps=_warps(features))
    return grad_x, partial_weight.sum(1).to(weight.dtype), partial_bias.sum(1).to(weight.dtype)


@_backward_op.register_fake
def _(grad_out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, mean: torch.Tensor, rstd: torch.Tensor,
      grad_x_needed: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return x.new_empty(x.shape if grad_x_needed else (0,)), torch.empty_like(weight), torch.empty_like(weight)


def _keep_for_backward(ctx: Any, inputs: tuple[Any, ...], output: tuple[torch.Tensor, ...]) -> None:
    x, weight, *_ = inputs
    _, mean, rstd = output
    ctx.save_for_backward(x, weight, mean, rstd)
    ctx.set_materialize_grads(False)  # the statistics' gradients are never used: no tensors of zeros for them


def _backward(ctx: Any, grad_out: torch.Tensor, *_statistics: Any) -> tuple[Any, ...]:
    x, weight, mean, rstd = ctx.saved_tensors
    needed = ctx.needs_input_grad[0]
    grad_x, grad_weight, grad_bias = _backward_op(grad_out, x, weight, mean, rstd, needed)
    return grad_x if needed else None, grad_weight, grad_bias, None, None


_forward.register_autograd(_backward, setup_context=_keep_for_backward)


@functools.cache
def _kernels() -> tuple[Any, Any]:
    """The kernels (adaptune.fused.kernels.layer_norm_triton, which imports triton: loaded only where the kernel runs)."""
    try:
        from adaptune.fused.kernels import layer_norm_triton
    except ImportError as error:
        raise RuntimeError(f"{LAYER_NORM_ENV}=kernel needs triton (CUDA builds of torch install it): {error}") from error
    return layer_norm_triton.layer_norm_forward, layer_norm_triton.layer_norm_backward
