"""A fused group's hidden-state dropout with each run's counter mask drawn and applied in one Triton kernel
(`ADAPTUNE_DROPOUT=kernel`; "mask", the default, draws the mask and applies it with separate kernels).

Why: with the step replayed as CUDA graphs, a GPU spent the largest single item of a fused step in the compiled
counter-mask kernel of the hidden-state dropout sites (the embeddings', each layer's attention-output and
FFN-output dropout, the pooled output's: 26 calls a step), before separate kernels multiplied and divided by it
(figures: bench/LOG.md, "Figures moved out of the code's comments"). That kernel computes each position's coordinates from its flat index
with dynamic-shape 64-bit divisions per element, writes a byte of mask per element, and the mask is kept
for the backward pass. Here a program per line of a run's block (one (row, token), a row for the pooled
output) takes its coordinates from its program ids, hashes its features' positions and writes only
x * keep / (1 - p): no mask reaches memory. The backward pass is the same kernel on the output's gradient
(the same keys and draws, so the same bits). The bits are run_dropout.counter_keep_mask's: the same hash
(attention_triton.mix32) of the run's words and the position's coordinates in the run's block, so a run's
result still does not depend on its group, nor on the mode.

Kept values are x * (1 / (1 - p)) computed in float32 and rounded to x's dtype; eager's (x * mask) / (1 - p)
is that or one unit in the last place from it (tests/fused/kernels/test_dropout.py). Blocks of rank 1-3 only: the
attention probabilities' dropout (rank 4) is the attention kernel's or eager attention's. Under torch.compile
(compiled layers) the torch operators stay, so that inductor fuses the mask into the layer's own kernels; in
evaluation, with generator masks, or where a block does not fit the hash, RunDropout runs as in "mask" mode.
The kernel is a torch custom operator, as the attention kernel's are. On a CPU it runs only under Triton's
interpreter (TRITON_INTERPRET=1), which is how the tests check it.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from adaptune.fused.kernels.counter_coordinates import coordinate_shifts, keep_threshold
from adaptune.fused.kernels.triton_device import interpreted_bf16, lines_per_tile, power_of_two_at_least, runs_triton
from adaptune.fused.settings import DROPOUT_ENV, VALUES

DROPOUT_MODES = VALUES["dropout"]
_DTYPES = (torch.float32, torch.float16, torch.bfloat16)  # the kernel computes in float32: no float64
_MAX_BLOCK = 4096  # features per program at most (a longer line takes several programs)


def kernel_applies(blocks: torch.Tensor, p: float) -> bool:
    """Whether a training RunDropout with counter masks applies its mask to `blocks` ((runs, *block)) in the
    kernel: no torch.compile is tracing (there inductor fuses the torch operators), the
    block has rank 1-3 and fits the counter hash's coordinates, 0 < p < 1 (and below the last 32-bit threshold),
    a float32, float16 or bf16 tensor, and the device runs Triton (a GPU, or a CPU under the interpreter)."""
    if torch.compiler.is_compiling():
        return False
    fits = (2 <= blocks.dim() <= 4 and 0 < p < 1 and keep_threshold(p) < 1 << 32 and blocks.dtype in _DTYPES
            and coordinate_shifts(blocks.shape[1:]) is not None)
    if not fits:
        return False
    return runs_triton(blocks)


def run_dropout(blocks: torch.Tensor, keys: torch.Tensor, draws: torch.Tensor, threshold: int, p: float) -> torch.Tensor:
    """Every run's counter dropout on `blocks` ((runs, rows, [tokens,] features), or (runs, rows)): x * keep *
    (1 / (1 - p)) in float32, in x's dtype, where keep is run_dropout.counter_keep_mask(keys, draws,
    blocks.shape, p). `keys`: each run's (runs, 2) and `draws` its (runs,) int32 words, as counter_keep_mask
    takes them; `threshold`: counter_coordinates.keep_threshold(p), below 2^32. Differentiable: the gradient is the
    same kernel on the output's gradient."""
    return _dropout(blocks, keys, draws, threshold, 1.0 / (1.0 - p))


# A custom operator (torch.library), as the attention kernel's: one opaque node to torch.compile, its shape from the fake
# implementation, its backward the same operator (the mask is drawn again, never kept).
@torch.library.custom_op("adaptune::run_dropout", mutates_args=())
def _dropout(blocks: torch.Tensor, keys: torch.Tensor, draws: torch.Tensor, threshold: int, scale: float) -> torch.Tensor:
    if interpreted_bf16(blocks):
        return _dropout(blocks.float(), keys, draws, threshold, scale).to(blocks.dtype)  # float32 products, then rounded: the same values
    blocks = blocks.contiguous()
    out = torch.empty_like(blocks)
    runs, *block = blocks.shape
    shifts = coordinate_shifts(block)
    if shifts is None:
        raise ValueError(f"a block of {tuple(block)} does not fit the counter hash's coordinates (run_dropout.counter_keep_mask)")
    if len(block) == 1:  # a run's rows are its one line: their coordinate is the hash index's low bits, as a feature's
        rows, tokens, features, row_shift, token_shift = 1, 1, block[0], 0, 0
    elif len(block) == 2:
        rows, tokens, features, row_shift, token_shift = block[0], 1, block[1], shifts[0], 0
    else:
        rows, tokens, features, row_shift, token_shift = block[0], block[1], block[2], shifts[0], shifts[1]
    size = min(_MAX_BLOCK, power_of_two_at_least(features))  # features per program, masked past the last
    per_program = lines_per_tile(size)  # whole lines per program where lines are short
    lines = runs * rows * tokens
    if out.numel():
        _kernels()[0][(-(-lines // per_program), -(-features // size))](
            blocks, out, keys, draws, lines, rows, tokens, features, threshold, scale, ROW_SHIFT=row_shift, TOKEN_SHIFT=token_shift,
            LINES=per_program, BLOCK=size, num_warps=max(1, min(8, per_program * size // 256)))
    return out


@_dropout.register_fake
def _(blocks: torch.Tensor, keys: torch.Tensor, draws: torch.Tensor, threshold: int, scale: float) -> torch.Tensor:
    return torch.empty_like(blocks, memory_format=torch.contiguous_format)


def _keep_for_backward(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
    _, keys, draws, threshold, scale = inputs
    ctx.save_for_backward(keys, draws)
    ctx.settings = (threshold, scale)


def _backward(ctx: Any, grad_out: torch.Tensor) -> tuple[Any, ...]:
    keys, draws = ctx.saved_tensors
    return _dropout(grad_out, keys, draws, *ctx.settings), None, None, None, None


_dropout.register_autograd(_backward, setup_context=_keep_for_backward)



@functools.cache
def _kernels() -> tuple[Any]:
    """The kernel (adaptune.fused.kernels.dropout_triton, which imports triton: loaded only where the kernel runs)."""
    try:
        from adaptune.fused.kernels import dropout_triton
    except ImportError as error:
        raise RuntimeError(f"{DROPOUT_ENV}=kernel needs triton (CUDA builds of torch install it): {error}") from error
    return (dropout_triton.dropout_kernel,)
