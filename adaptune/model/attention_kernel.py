"""A fused group's attention with each run's counter dropout drawn inside one Triton kernel
(`ADAPTUNE_ATTENTION=kernel`; eager attention is the default).

Why: with the step replayed as CUDA graphs, an H100 spent a fused BERT step's time on elementwise passes
over the attention probabilities (bench/gpu.json "h100_2026_11_26_step_graphs"): scores, the additive
mask, a float32 softmax, the dropout mask and its product are each written out at (runs x rows) x
heads x length x length, forward and backward. Here one program per (row, head) holds its whole
length x length tile on chip: the scores, the softmax, the mask and the dropped probabilities never
reach memory. The backward pass recomputes them from the log-sum-exp it saved and draws the same mask
again (FlashAttention's recomputation, Dao et al. 2022). Each run's mask bits are
run_dropout.counter_keep_mask's: the same hash of the run's words and the position's coordinates in
the run's block, so a run's result still does not depend on its group.

No library kernel fits: SDPA's and FlashAttention's dropout draws from one Philox seed for the whole
batch, so a run's mask would depend on its place in the group; FlexAttention modifies scores before
the softmax, and dropout acts after it.

One tile per (row, head) bounds the length: up to `MAX_LENGTH` tokens (GLUE's 128), head sizes of 16, 32
or 64 (MiniLM's and BERT's). Elsewhere (SQuAD's 384 tokens, evaluation, generator masks) attention runs
eagerly. The kernels are torch custom operators, so a compiled layer (adaptune.train.compiling) holds each
call as one node. On a CPU the kernel runs only under Triton's interpreter (TRITON_INTERPRET=1), which is
how the tests check it.
"""

from __future__ import annotations

import functools
import os
from typing import Any

import torch

ATTENTION_ENV = "ADAPTUNE_ATTENTION"
ATTENTION_MODES = ("eager", "kernel")
MAX_LENGTH = 128  # one program's length x length tile of float32 scores: 64 KiB at 128


def attention_mode() -> str:
    """$ADAPTUNE_ATTENTION: "eager" (unset) or "kernel"."""
    mode = os.environ.get(ATTENTION_ENV) or "eager"
    if mode not in ATTENTION_MODES:
        raise ValueError(f"{ATTENTION_ENV}={mode!r} is not an attention mode: use one of {', '.join(ATTENTION_MODES)}")
    return mode


def recorded_attention(mask_scheme: str) -> str:
    """What a run's record says its training attention was: "kernel" where the setting asks for it and
    the run draws counter masks (where a call does not fit the kernel, that call runs eagerly), else "eager"."""
    return "kernel" if attention_mode() == "kernel" and mask_scheme == "counter" else "eager"


def kernel_applies(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, p: float) -> bool:
    """Whether this attention call runs in the kernel: the mode asks for it, the shapes fit one tile,
    and the device runs Triton (a GPU, or a CPU under the interpreter)."""
    if attention_mode() != "kernel":
        return False
    length, head_size = query.shape[2], query.shape[3]
    fits = (length <= MAX_LENGTH and key.shape[2] == length and head_size in (16, 32, 64) and 0 < p < 1
            and query.dtype == key.dtype == value.dtype)
    if not fits:
        return False
    return query.is_cuda or os.environ.get("TRITON_INTERPRET") == "1"  # where triton is missing, the first call says so


def run_dropout_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, additive_mask: torch.Tensor | None,
                          keys: torch.Tensor, draws: torch.Tensor, threshold: int, p: float, scaling: float) -> torch.Tensor:
    """softmax(query keyᵀ x scaling + mask) with each run's counter dropout, times value: (rows, heads,
    length, head size) in, (rows, length, heads, head size) out (the layout transformers' attention
    functions return). `keys`: each run's (runs, 2) and `draws` its (runs,) int32 words, as
    run_dropout.counter_keep_mask takes them; a position is kept where its unsigned hash is at least
    `threshold` (run_dropout.keep_threshold(p)); the rows are the runs' equal blocks, run after run."""
    return _attention(query, key, value, additive_mask, keys, draws, threshold, p, scaling)[0]


# Custom operators (torch.library), so that torch.compile keeps each call as one opaque node, its shapes from the
# fake implementations, inside compiled layers (inductor launches the kernel in place; a CUDA graph captures it).
@torch.library.custom_op("adaptune::run_dropout_attention", mutates_args=())
def _attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, additive_mask: torch.Tensor | None, keys: torch.Tensor,
               draws: torch.Tensor, threshold: int, p: float, scaling: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(output, log-sum-exp per query): the forward kernel."""
    query, key, value = _one_layout(query, key, value)
    out, log_sum_exp = _forward_outputs(query)
    rows, heads, length, head_size = query.shape
    block = _block(length)
    mask, *mask_strides = _mask_and_strides(additive_mask, rows, heads, length)
    forward_kernel, _ = _kernels()
    forward_kernel[(rows * heads,)](
        query, key, value, mask, keys, draws, out, log_sum_exp, *query.stride(), *mask_strides,
        heads, length, rows // keys.shape[0], scaling, threshold, 1.0 / (1.0 - p),
        HAS_MASK=additive_mask is not None, BLOCK=block, HEAD=head_size, num_warps=_warps(block))
    return out, log_sum_exp


@_attention.register_fake
def _(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, additive_mask: torch.Tensor | None, keys: torch.Tensor,
      draws: torch.Tensor, threshold: int, p: float, scaling: float) -> tuple[torch.Tensor, torch.Tensor]:
    return _forward_outputs(query)


@torch.library.custom_op("adaptune::run_dropout_attention_backward", mutates_args=())
def _attention_backward(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, additive_mask: torch.Tensor | None,
                        keys: torch.Tensor, draws: torch.Tensor, grad_out: torch.Tensor, log_sum_exp: torch.Tensor, threshold: int,
                        p: float, scaling: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The gradients of query, key and value (their layout): the backward kernel, which recomputes the tile."""
    query, key, value = _one_layout(query, key, value)
    grads = _gradients_like(query)
    rows, heads, length, head_size = query.shape
    block = _block(length)
    mask, *mask_strides = _mask_and_strides(additive_mask, rows, heads, length)
    _, backward_kernel = _kernels()
    backward_kernel[(rows * heads,)](
        query, key, value, mask, keys, draws, grad_out.contiguous(), log_sum_exp, *grads, *query.stride(), *mask_strides,
        heads, length, rows // keys.shape[0], scaling, threshold, 1.0 / (1.0 - p),
        HAS_MASK=additive_mask is not None, BLOCK=block, HEAD=head_size, num_warps=_warps(block))
    return grads


@_attention_backward.register_fake
def _(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, additive_mask: torch.Tensor | None, keys: torch.Tensor,
      draws: torch.Tensor, grad_out: torch.Tensor, log_sum_exp: torch.Tensor, threshold: int, p: float, scaling: float
      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _gradients_like(_one_layout(query, key, value)[0])


def _keep_for_backward(ctx: Any, inputs: tuple[Any, ...], output: tuple[torch.Tensor, torch.Tensor]) -> None:
    query, key, value, additive_mask, keys, draws, threshold, p, scaling = inputs
    ctx.save_for_backward(query, key, value, additive_mask, keys, draws, output[1])
    ctx.settings = (threshold, p, scaling)


def _backward(ctx: Any, grad_out: torch.Tensor, _grad_log_sum_exp: torch.Tensor | None) -> tuple[Any, ...]:
    query, key, value, additive_mask, keys, draws, log_sum_exp = ctx.saved_tensors
    grads = _attention_backward(query, key, value, additive_mask, keys, draws, grad_out, log_sum_exp, *ctx.settings)
    return (*grads, None, None, None, None, None, None)


_attention.register_autograd(_backward, setup_context=_keep_for_backward)


def _one_layout(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The three as the kernels read them: in place where they share one layout (transformers' head-split views do)."""
    if query.stride() == key.stride() == value.stride():
        return query, key, value
    return query.contiguous(), key.contiguous(), value.contiguous()


def _forward_outputs(query: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    rows, heads, length, head_size = query.shape
    return (torch.empty(rows, length, heads, head_size, device=query.device, dtype=query.dtype),
            torch.empty(rows, heads, length, device=query.device, dtype=torch.float32))


def _gradients_like(query: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return tuple(torch.empty_strided(query.shape, query.stride(), device=query.device, dtype=query.dtype) for _ in range(3))


def _mask_and_strides(mask: torch.Tensor | None, rows: int, heads: int, length: int) -> tuple[Any, ...]:
    """The additive mask broadcast to (rows, heads, length, length), and its strides (0 where it
    broadcasts): no copy of transformers' (rows, 1, length, length) mask."""
    if mask is None:
        return None, 0, 0, 0, 0
    expanded = mask.expand(rows, heads, length, length)
    return expanded, *expanded.stride()


def _block(length: int) -> int:
    return max(16, 1 << (length - 1).bit_length())


def _warps(block: int) -> int:
    return 8 if block >= 128 else 4


@functools.cache
def _kernels() -> tuple[Any, Any]:
    """The forward and backward kernels (adaptune.model.attention_triton, which imports triton: loaded only
    where the kernel runs)."""
    try:
        from adaptune.model import attention_triton
    except ImportError as error:
        raise RuntimeError(f"{ATTENTION_ENV}=kernel needs triton (CUDA builds of torch install it): {error}") from error
    return attention_triton.forward_kernel, attention_triton.backward_kernel
