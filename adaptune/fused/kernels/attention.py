"""A fused group's attention with each run's counter dropout drawn inside one Triton kernel
(`ADAPTUNE_ATTENTION=kernel`; eager attention is the default).

Why: with the step replayed as CUDA graphs, a GPU spent a fused BERT step's time on elementwise passes
over the attention probabilities (bench/LOG.md, "Figures moved out of the code's comments"): scores, the additive
mask, a float32 softmax, the dropout mask and its product are each written out at (runs x rows) x
heads x length x length, forward and backward. Here a program per (row, head, block of queries) walks
the keys block by block on chip: the scores, the softmax, the mask and the dropped probabilities never
reach memory. The backward pass recomputes them from the log-sum-exp it saved and draws the same mask
again (FlashAttention's tiling and recomputation, Dao et al. 2022, 2023). Each run's mask bits are
run_dropout.counter_keep_mask's: the same hash of the run's words and the position's coordinates in
the run's block, so a run's result still does not depend on its group.

No library kernel fits: SDPA's and FlashAttention's dropout draws from one Philox seed for the whole
batch, so a run's mask would depend on its place in the group; FlexAttention modifies scores before
the softmax, and dropout acts after it.

Up to `MAX_LENGTH` tokens (SQuAD's 384 too), head sizes of 16, 32 or 64 (MiniLM's and BERT's); elsewhere,
and in evaluation or with generator masks, attention runs eagerly. The kernels are torch custom operators,
so a compiled graph holds each call as one node. On a CPU the kernel runs only
under Triton's interpreter (TRITON_INTERPRET=1), which is how the tests check it.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from adaptune.fused.kernels.triton_device import interpreted_bf16, power_of_two_at_least, runs_triton
from adaptune.fused.settings import ATTENTION_ENV, VALUES

ATTENTION_MODES = VALUES["attention"]
MAX_LENGTH = 512  # tokens: the counter hash's coordinates give queries and keys 9 bits each
MAX_HEADS, MAX_BLOCK_ROWS = 64, 256  # and heads 6 bits, a run's rows 8 (counter_coordinates.COORDINATE_BITS)


def kernel_applies(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, p: float, runs: int) -> bool:
    """Whether this attention call of `runs` runs' blocks runs in the kernel: the
    shapes fit the counter hash's coordinates and the kernel's tiles, and the device runs Triton (a GPU, or a
    CPU under the interpreter). Elsewhere eager attention draws the same masks (or says why it cannot)."""
    rows, heads, length, head_size = query.shape
    fits = (length <= MAX_LENGTH and heads <= MAX_HEADS and rows // runs <= MAX_BLOCK_ROWS and key.shape[2] == length
            and head_size in (16, 32, 64) and 0 < p < 1 and query.dtype == key.dtype == value.dtype)
    if not fits:
        return False
    return runs_triton(query)


def run_dropout_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, additive_mask: torch.Tensor | None,
                          keys: torch.Tensor, draws: torch.Tensor, threshold: int, p: float, scaling: float) -> torch.Tensor:
    """softmax(query keyᵀ x scaling + mask) with each run's counter dropout, times value: (rows, heads,
    length, head size) in, (rows, length, heads, head size) out (the layout transformers' attention
    functions return). `keys`: each run's (runs, 2) and `draws` its (runs,) int32 words, as
    run_dropout.counter_keep_mask takes them; a position is kept where its unsigned hash is at least
    `threshold` (counter_coordinates.keep_threshold(p)); the rows are the runs' equal blocks, run after run."""
    return _attention(query, key, value, additive_mask, keys, draws, threshold, p, scaling)[0]


def run_dropout_attention_stacked(stacked: torch.Tensor, heads: int, additive_mask: torch.Tensor | None, keys: torch.Tensor,
                                  draws: torch.Tensor, threshold: int, p: float, scaling: float) -> torch.Tensor:
    """run_dropout_attention on the query, key and value that frozen_projections' one matmul returns side by side:
    `stacked` is (rows, length, 3 x heads x head size). The same kernels read the three where they lie and write their
    gradients side by side into one tensor of `stacked`'s shape: no `cat` of three gradients in the backward pass,
    and no gradient allocated at the stacked row's stride."""
    return _stacked_attention(stacked, heads, additive_mask, keys, draws, threshold, p, scaling)[0]


def split_heads(stacked: torch.Tensor, heads: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Query, key and value of a stacked (rows, length, 3 x heads x head size) tensor as (rows, heads, length, head
    size) views, as transformers splits them."""
    rows, length, width = stacked.shape
    return tuple(part.view(rows, length, heads, -1).transpose(1, 2) for part in stacked.split(width // 3, dim=-1))


# Custom operators (torch.library), so that torch.compile keeps each call as one opaque node, its shapes from the
# fake implementations, inside compiled layers (inductor launches the kernel in place; a CUDA graph captures it).
@torch.library.custom_op("adaptune::run_dropout_attention", mutates_args=())
def _attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, additive_mask: torch.Tensor | None, keys: torch.Tensor,
               draws: torch.Tensor, threshold: int, p: float, scaling: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(output, log-sum-exp per query): the forward kernel."""
    if interpreted_bf16(query):
        out, log_sum_exp = _attention(query.float(), key.float(), value.float(), additive_mask, keys, draws, threshold, p, scaling)
        return out.to(query.dtype), log_sum_exp
    return _forward(*_one_layout(query, key, value), additive_mask, keys, draws, threshold, p, scaling)


def _forward(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, additive_mask: torch.Tensor | None, keys: torch.Tensor,
             draws: torch.Tensor, threshold: int, p: float, scaling: float) -> tuple[torch.Tensor, torch.Tensor]:
    out, log_sum_exp = _forward_outputs(query)
    mask, keys, draws, *strides = _common(query, additive_mask, keys, draws)
    forward_kernel = _kernels()[0]
    forward_kernel[_grid(query)](query, key, value, mask, keys, draws, out, log_sum_exp, *strides, scaling, threshold, 1.0 / (1.0 - p),
                                 **_constants(query, additive_mask))
    return out, log_sum_exp


@_attention.register_fake
def _(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, additive_mask: torch.Tensor | None, keys: torch.Tensor,
      draws: torch.Tensor, threshold: int, p: float, scaling: float) -> tuple[torch.Tensor, torch.Tensor]:
    return _forward_outputs(query)


@torch.library.custom_op("adaptune::run_dropout_attention_backward", mutates_args=())
def _attention_backward(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, additive_mask: torch.Tensor | None,
                        keys: torch.Tensor, draws: torch.Tensor, out: torch.Tensor, grad_out: torch.Tensor, log_sum_exp: torch.Tensor,
                        threshold: int, p: float, scaling: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The gradients of query, key and value (their layout): the backward kernels, which recompute each tile."""
    if interpreted_bf16(query):
        grads = _attention_backward(query.float(), key.float(), value.float(), additive_mask, keys, draws, out, grad_out.float(),
                                    log_sum_exp, threshold, p, scaling)
        return tuple(grad.to(query.dtype) for grad in grads)
    query, key, value = _one_layout(query, key, value)
    grads = _gradients_like(query)
    _backward_into(grads, query, key, value, additive_mask, keys, draws, out, grad_out, log_sum_exp, threshold, p, scaling)
    return grads


def _backward_into(grads: tuple[torch.Tensor, torch.Tensor, torch.Tensor], query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                   additive_mask: torch.Tensor | None, keys: torch.Tensor, draws: torch.Tensor, out: torch.Tensor, grad_out: torch.Tensor,
                   log_sum_exp: torch.Tensor, threshold: int, p: float, scaling: float) -> None:
    """The backward kernels, writing the gradients of query, key and value into `grads` (laid out as query is)."""
    grad_query, grad_key, grad_value = grads
    grad_out = grad_out.contiguous()
    delta = (grad_out.float() * out.float()).sum(-1).transpose(1, 2).contiguous()  # rowsum(dO O): (rows, heads, length)
    mask, keys, draws, *strides = _common(query, additive_mask, keys, draws)
    settings = (scaling, threshold, 1.0 / (1.0 - p))
    _, key_value_kernel, query_kernel = _kernels()
    key_value_kernel[_grid(query)](query, key, value, mask, keys, draws, grad_out, log_sum_exp, delta, grad_key, grad_value,
                                   *strides, *settings, **_constants(query, additive_mask))
    query_kernel[_grid(query)](query, key, value, mask, keys, draws, grad_out, log_sum_exp, delta, grad_query,
                               *strides, *settings, **_constants(query, additive_mask))


@_attention_backward.register_fake
def _(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, additive_mask: torch.Tensor | None, keys: torch.Tensor,
      draws: torch.Tensor, out: torch.Tensor, grad_out: torch.Tensor, log_sum_exp: torch.Tensor, threshold: int, p: float,
      scaling: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _gradients_like(_one_layout(query, key, value)[0])


def _keep_for_backward(ctx: Any, inputs: tuple[Any, ...], output: tuple[torch.Tensor, torch.Tensor]) -> None:
    query, key, value, additive_mask, keys, draws, threshold, p, scaling = inputs
    ctx.save_for_backward(query, key, value, additive_mask, keys, draws, *output)
    ctx.settings = (threshold, p, scaling)
    ctx.set_materialize_grads(False)  # the log-sum-exp's gradient is never used: no tensor of zeros for it


def _backward(ctx: Any, grad_out: torch.Tensor, _grad_log_sum_exp: torch.Tensor | None) -> tuple[Any, ...]:
    query, key, value, additive_mask, keys, draws, out, log_sum_exp = ctx.saved_tensors
    grads = _attention_backward(query, key, value, additive_mask, keys, draws, out, grad_out, log_sum_exp, *ctx.settings)
    return (*grads, None, None, None, None, None, None)


_attention.register_autograd(_backward, setup_context=_keep_for_backward)


@torch.library.custom_op("adaptune::run_dropout_attention_stacked", mutates_args=())
def _stacked_attention(stacked: torch.Tensor, heads: int, additive_mask: torch.Tensor | None, keys: torch.Tensor, draws: torch.Tensor,
                       threshold: int, p: float, scaling: float) -> tuple[torch.Tensor, torch.Tensor]:
    if interpreted_bf16(stacked):
        out, log_sum_exp = _stacked_attention(stacked.float(), heads, additive_mask, keys, draws, threshold, p, scaling)
        return out.to(stacked.dtype), log_sum_exp
    return _forward(*split_heads(stacked.contiguous(), heads), additive_mask, keys, draws, threshold, p, scaling)


@_stacked_attention.register_fake
def _(stacked: torch.Tensor, heads: int, additive_mask: torch.Tensor | None, keys: torch.Tensor, draws: torch.Tensor,
      threshold: int, p: float, scaling: float) -> tuple[torch.Tensor, torch.Tensor]:
    return _forward_outputs(split_heads(stacked, heads)[0])


@torch.library.custom_op("adaptune::run_dropout_attention_stacked_backward", mutates_args=())
def _stacked_attention_backward(stacked: torch.Tensor, heads: int, additive_mask: torch.Tensor | None, keys: torch.Tensor,
                                draws: torch.Tensor, out: torch.Tensor, grad_out: torch.Tensor, log_sum_exp: torch.Tensor,
                                threshold: int, p: float, scaling: float) -> torch.Tensor:
    """The stacked input's gradient: query's, key's and value's side by side, each written in place by the kernels."""
    if interpreted_bf16(stacked):
        return _stacked_attention_backward(stacked.float(), heads, additive_mask, keys, draws, out, grad_out.float(), log_sum_exp,
                                           threshold, p, scaling).to(stacked.dtype)
    stacked = stacked.contiguous()
    grad = torch.empty_like(stacked)
    _backward_into(split_heads(grad, heads), *split_heads(stacked, heads), additive_mask, keys, draws, out, grad_out, log_sum_exp,
                   threshold, p, scaling)
    return grad


@_stacked_attention_backward.register_fake
def _(stacked: torch.Tensor, heads: int, additive_mask: torch.Tensor | None, keys: torch.Tensor, draws: torch.Tensor, out: torch.Tensor,
      grad_out: torch.Tensor, log_sum_exp: torch.Tensor, threshold: int, p: float, scaling: float) -> torch.Tensor:
    return torch.empty_like(stacked, memory_format=torch.contiguous_format)


def _keep_stacked_for_backward(ctx: Any, inputs: tuple[Any, ...], output: tuple[torch.Tensor, torch.Tensor]) -> None:
    stacked, heads, additive_mask, keys, draws, threshold, p, scaling = inputs
    ctx.save_for_backward(stacked, additive_mask, keys, draws, *output)
    ctx.heads, ctx.settings = heads, (threshold, p, scaling)
    ctx.set_materialize_grads(False)


def _stacked_backward(ctx: Any, grad_out: torch.Tensor, _grad_log_sum_exp: torch.Tensor | None) -> tuple[Any, ...]:
    stacked, additive_mask, keys, draws, out, log_sum_exp = ctx.saved_tensors
    grad = _stacked_attention_backward(stacked, ctx.heads, additive_mask, keys, draws, out, grad_out, log_sum_exp, *ctx.settings)
    return (grad, None, None, None, None, None, None, None)


_stacked_attention.register_autograd(_stacked_backward, setup_context=_keep_stacked_for_backward)


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
    grad_query, grad_key, grad_value = (torch.empty_strided(query.shape, query.stride(), device=query.device, dtype=query.dtype)
                                        for _ in range(3))
    return grad_query, grad_key, grad_value


def _common(query: torch.Tensor, additive_mask: torch.Tensor | None, keys: torch.Tensor, draws: torch.Tensor) -> tuple[Any, ...]:
    """What every kernel takes after its tensors: the additive mask broadcast to (rows, heads, length,
    length) as strides (0 where it broadcasts: no copy of transformers' (rows, 1, length, length) mask),
    the runs' words, the inputs' and the mask's strides, heads, length and rows per run."""
    rows, heads, length, _ = query.shape
    mask: torch.Tensor | None = None
    mask_strides: tuple[int, ...] = (0, 0, 0, 0)
    if additive_mask is not None:
        mask = additive_mask.expand(rows, heads, length, length)
        mask_strides = mask.stride()
    return (mask, keys, draws, *query.stride(), *mask_strides, heads, length, rows // keys.shape[0])


def _grid(query: torch.Tensor) -> tuple[int, int]:
    """One program per (row, head) and block of queries (or keys)."""
    rows, heads, length, _ = query.shape
    return rows * heads, -(-length // _block(length))


def _constants(query: torch.Tensor, additive_mask: torch.Tensor | None) -> dict[str, Any]:
    return {"HAS_MASK": additive_mask is not None, "BLOCK": _block(query.shape[2]), "HEAD": query.shape[3], "num_warps": 4}


def _block(length: int) -> int:
    """Tokens per tile: the length rounded up to a power of two, from 16 (tl.dot's least) to 64 (a 64 x 64
    float32 tile of scores beside the running sums fits one program's registers)."""
    return min(64, max(16, power_of_two_at_least(length)))


@functools.cache
def _kernels() -> tuple[Any, Any, Any]:
    """The forward kernel and the two backward kernels (adaptune.fused.kernels.attention_triton, which imports triton: loaded only
    where the kernel runs)."""
    try:
        from adaptune.fused.kernels import attention_triton
    except ImportError as error:
        raise RuntimeError(f"{ATTENTION_ENV}=kernel needs triton (CUDA builds of torch install it): {error}") from error
    return attention_triton.forward_kernel, attention_triton.backward_key_value_kernel, attention_triton.backward_query_kernel
