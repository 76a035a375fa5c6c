"""The Triton kernels of adaptune.model.attention_kernel (that module's docstring says what they compute
and why): one program per (row, head) of a fused group's attention, its whole length x length tile on
chip, each run's counter dropout drawn inside. Queries, keys, values and their gradients share one
(row, head, token, dim) stride set (transformers' head-split views, read in place); the output and its
gradient are (row, token, head, dim), contiguous."""

import triton
import triton.language as tl


@triton.jit
def mix32(x):
    """run_dropout._mix32 on uint32 words: logical shifts, products modulo 2^32."""
    x = x ^ (x >> 16)
    x = x * 0x45D9F3B
    x = x ^ (x >> 16)
    x = x * 0x45D9F3B
    return x ^ (x >> 16)


@triton.jit
def kept(keys, draws, run, local_row, head, offsets, threshold):
    """run_dropout.counter_keep_mask's bits at (local_row, head, query, key) of the run's block: the run's
    two words from its keys and draw, then the hash of the position's index with them."""
    draw = tl.load(draws + run).to(tl.uint32, bitcast=True)
    first = tl.load(keys + 2 * run).to(tl.uint32, bitcast=True) ^ mix32(draw)
    second = tl.load(keys + 2 * run + 1).to(tl.uint32, bitcast=True) ^ mix32(draw ^ 0x5BD1E995)
    index = ((local_row.to(tl.uint32) << 24) | (head.to(tl.uint32) << 18)
             | (offsets[:, None].to(tl.uint32) << 9) | offsets[None, :].to(tl.uint32))
    bits = mix32(mix32(index ^ first) ^ second)
    return bits >= threshold.to(tl.uint32)


@triton.jit
def scores_of(q, k, mask, row, head, offsets, inside, mask_row, mask_head, mask_query, mask_key, length, scaling,
              HAS_MASK: tl.constexpr):
    s = tl.dot(q, tl.trans(k)) * scaling
    if HAS_MASK:
        s += tl.load(mask + row * mask_row + head * mask_head + offsets[:, None] * mask_query + offsets[None, :] * mask_key,
                     mask=inside, other=0.0).to(tl.float32)
    return tl.where(offsets[None, :] < length, s, float("-inf"))


@triton.jit
def forward_kernel(query, key, value, mask, keys, draws, out, log_sum_exp, in_row, in_head, in_token, in_dim,
                   mask_row, mask_head, mask_query, mask_key, heads, length, block_rows, scaling, threshold, keep_scale,
                   HAS_MASK: tl.constexpr, BLOCK: tl.constexpr, HEAD: tl.constexpr):
    program = tl.program_id(0)
    row, head = program // heads, program % heads
    offsets, dims = tl.arange(0, BLOCK), tl.arange(0, HEAD)
    valid = offsets < length
    inside = valid[:, None] & valid[None, :]
    tile = row * in_row + head * in_head + offsets[:, None] * in_token + dims[None, :] * in_dim
    q = tl.load(query + tile, mask=valid[:, None], other=0.0)
    k = tl.load(key + tile, mask=valid[:, None], other=0.0)
    v = tl.load(value + tile, mask=valid[:, None], other=0.0)
    s = scores_of(q, k, mask, row, head, offsets, inside, mask_row, mask_head, mask_query, mask_key, length, scaling, HAS_MASK)
    top = tl.max(s, axis=1)
    e = tl.exp(s - top[:, None])
    total = tl.sum(e, axis=1)
    probabilities = e / total[:, None]
    keep = kept(keys, draws, row // block_rows, row % block_rows, head, offsets, threshold)
    dropped = tl.where(keep, probabilities * keep_scale, 0.0)
    o = tl.dot(dropped.to(v.dtype), v)
    out_tile = ((row * length + offsets[:, None]) * heads + head) * HEAD + dims[None, :]
    tl.store(out + out_tile, o.to(out.dtype.element_ty), mask=valid[:, None])
    tl.store(log_sum_exp + program * length + offsets, top + tl.log(total), mask=valid)


@triton.jit
def backward_kernel(query, key, value, mask, keys, draws, grad_out, log_sum_exp, grad_query, grad_key, grad_value,
                    in_row, in_head, in_token, in_dim, mask_row, mask_head, mask_query, mask_key, heads, length, block_rows,
                    scaling, threshold, keep_scale, HAS_MASK: tl.constexpr, BLOCK: tl.constexpr, HEAD: tl.constexpr):
    program = tl.program_id(0)
    row, head = program // heads, program % heads
    offsets, dims = tl.arange(0, BLOCK), tl.arange(0, HEAD)
    valid = offsets < length
    inside = valid[:, None] & valid[None, :]
    tile = row * in_row + head * in_head + offsets[:, None] * in_token + dims[None, :] * in_dim
    q = tl.load(query + tile, mask=valid[:, None], other=0.0)
    k = tl.load(key + tile, mask=valid[:, None], other=0.0)
    v = tl.load(value + tile, mask=valid[:, None], other=0.0)
    out_tile = ((row * length + offsets[:, None]) * heads + head) * HEAD + dims[None, :]
    do = tl.load(grad_out + out_tile, mask=valid[:, None], other=0.0)
    s = scores_of(q, k, mask, row, head, offsets, inside, mask_row, mask_head, mask_query, mask_key, length, scaling, HAS_MASK)
    lse = tl.load(log_sum_exp + program * length + offsets, mask=valid, other=0.0)
    probabilities = tl.where(inside, tl.exp(s - lse[:, None]), 0.0)
    keep = kept(keys, draws, row // block_rows, row % block_rows, head, offsets, threshold)
    dropped = tl.where(keep, probabilities * keep_scale, 0.0)
    dv = tl.dot(tl.trans(dropped.to(do.dtype)), do)
    grad_dropped = tl.dot(do, tl.trans(v))
    grad_probabilities = tl.where(keep, grad_dropped * keep_scale, 0.0)
    # softmax's backward: dS = P (dP - rowsum(dP P))
    grad_scores = probabilities * (grad_probabilities - tl.sum(grad_probabilities * probabilities, axis=1)[:, None])
    dq = tl.dot(grad_scores.to(k.dtype), k) * scaling
    dk = tl.dot(tl.trans(grad_scores.to(q.dtype)), q) * scaling
    tl.store(grad_query + tile, dq.to(grad_query.dtype.element_ty), mask=valid[:, None])
    tl.store(grad_key + tile, dk.to(grad_key.dtype.element_ty), mask=valid[:, None])
    tl.store(grad_value + tile, dv.to(grad_value.dtype.element_ty), mask=valid[:, None])
