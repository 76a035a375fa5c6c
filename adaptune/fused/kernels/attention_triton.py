"""The Triton kernels of adaptune.fused.kernels.attention (that module's docstring says what they compute
and why), FlashAttention-2's tiling (Dao 2023) with each run's counter dropout drawn inside: the forward
kernel walks key blocks with an online softmax; the backward pass recomputes each tile from the saved
log-sum-exp, one kernel per key block for the key and value gradients and one per query block for the
query gradients (no atomics). Queries, keys, values and their gradients share one (row, head, token, dim)
stride set (transformers' head-split views, read in place); the output and its gradient are (row, token,
head, dim), contiguous."""

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
def kept(keys, draws, run, local_row, head, queries, key_positions, threshold):
    """run_dropout.counter_keep_mask's bits at (local_row, head, query, key) of the run's block: the run's
    two words from its keys and draw, then the hash of the position's index with them."""
    draw = tl.load(draws + run).to(tl.uint32, bitcast=True)
    first = tl.load(keys + 2 * run).to(tl.uint32, bitcast=True) ^ mix32(draw)
    second = tl.load(keys + 2 * run + 1).to(tl.uint32, bitcast=True) ^ mix32(draw ^ 0x5BD1E995)
    index = ((local_row.to(tl.uint32) << 24) | (head.to(tl.uint32) << 18)
             | (queries[:, None].to(tl.uint32) << 9) | key_positions[None, :].to(tl.uint32))
    bits = mix32(mix32(index ^ first) ^ second)
    return bits >= threshold.to(tl.uint32)


@triton.jit
def coordinates(heads, block_rows, in_row, in_head, in_dim, BLOCK: tl.constexpr, HEAD: tl.constexpr):
    """This program's row x heads + head, row, head, run and row within the run's block; the token positions of
    its block (along the grid's second axis), the head's dims, and the offset of its (row, head) in the inputs."""
    program = tl.program_id(0)
    row, head = program // heads, program % heads
    dims = tl.arange(0, HEAD)
    return (program, row, head, row // block_rows, row % block_rows, tl.program_id(1) * BLOCK + tl.arange(0, BLOCK), dims,
            row * in_row + head * in_head + dims[None, :] * in_dim)


@triton.jit
def token_rows(pointer, base, positions, length, in_token):
    """A (positions, head size) tile of a (row, head, token, dim)-strided tensor at `base`, zeros past the last token."""
    return tl.load(pointer + base + positions[:, None] * in_token, mask=positions[:, None] < length, other=0.0)


@triton.jit
def store_token_rows(pointer, base, positions, length, in_token, tile):
    tl.store(pointer + base + positions[:, None] * in_token, tile.to(pointer.dtype.element_ty), mask=positions[:, None] < length)


@triton.jit
def query_side(grad_out, log_sum_exp, delta, program, row, head, queries, dims, heads, length, HEAD: tl.constexpr):
    """For a block of queries: the output's gradient (row, token, head, dim), its log-sum-exp and rowsum(dO O)."""
    out_tile = ((row * length + queries[:, None]) * heads + head) * HEAD + dims[None, :]
    do = tl.load(grad_out + out_tile, mask=queries[:, None] < length, other=0.0)
    lse = tl.load(log_sum_exp + program * length + queries, mask=queries < length, other=0.0)
    return do, lse, tl.load(delta + program * length + queries, mask=queries < length, other=0.0)


@triton.jit
def scores_of(q, k, mask, row, head, queries, key_positions, length, mask_row, mask_head, mask_query, mask_key, scaling,
              HAS_MASK: tl.constexpr):
    """A tile of scores (float32): query keyᵀ x scaling plus the additive mask, -inf past the last key."""
    s = tl.dot(q, tl.trans(k)) * scaling
    inside = (queries[:, None] < length) & (key_positions[None, :] < length)
    if HAS_MASK:
        s += tl.load(mask + row * mask_row + head * mask_head + queries[:, None] * mask_query + key_positions[None, :] * mask_key,
                     mask=inside, other=0.0).to(tl.float32)
    return tl.where(key_positions[None, :] < length, s, float("-inf"))


@triton.jit
def forward_kernel(query, key, value, mask, keys, draws, out, log_sum_exp, in_row, in_head, in_token, in_dim,
                   mask_row, mask_head, mask_query, mask_key, heads, length, block_rows, scaling, threshold, keep_scale,
                   HAS_MASK: tl.constexpr, BLOCK: tl.constexpr, HEAD: tl.constexpr):
    program, row, head, run, local_row, queries, dims, base = coordinates(heads, block_rows, in_row, in_head, in_dim, BLOCK, HEAD)
    q = token_rows(query, base, queries, length, in_token)
    top = tl.full([BLOCK], float("-inf"), tl.float32)
    total = tl.zeros([BLOCK], tl.float32)
    acc = tl.zeros([BLOCK, HEAD], tl.float32)
    for start in range(0, length, BLOCK):
        key_positions = start + tl.arange(0, BLOCK)
        k, v = token_rows(key, base, key_positions, length, in_token), token_rows(value, base, key_positions, length, in_token)
        s = scores_of(q, k, mask, row, head, queries, key_positions, length, mask_row, mask_head, mask_query, mask_key, scaling,
                      HAS_MASK)
        new_top = tl.maximum(top, tl.max(s, axis=1))
        rescale = tl.exp(top - new_top)
        e = tl.exp(s - new_top[:, None])
        total = total * rescale + tl.sum(e, axis=1)
        keep = kept(keys, draws, run, local_row, head, queries, key_positions, threshold)
        acc = acc * rescale[:, None] + tl.dot(tl.where(keep, e, 0.0).to(v.dtype), v)
        top = new_top
    o = acc * (keep_scale / total)[:, None]
    out_tile = ((row * length + queries[:, None]) * heads + head) * HEAD + dims[None, :]
    tl.store(out + out_tile, o.to(out.dtype.element_ty), mask=queries[:, None] < length)
    tl.store(log_sum_exp + program * length + queries, top + tl.log(total), mask=queries < length)


@triton.jit
def tile_gradients(q, k, v, do, lse, delta, mask, keys, draws, run, local_row, row, head, queries, key_positions, length,
                   mask_row, mask_head, mask_query, mask_key, scaling, threshold, keep_scale, HAS_MASK: tl.constexpr):
    """One tile's dropped probabilities and score gradients, recomputed: softmax's backward dS = P (dP - delta),
    delta = rowsum(dO O), with dP the dropped probabilities' gradient through the mask."""
    s = scores_of(q, k, mask, row, head, queries, key_positions, length, mask_row, mask_head, mask_query, mask_key, scaling,
                  HAS_MASK)
    inside = (queries[:, None] < length) & (key_positions[None, :] < length)
    probabilities = tl.where(inside, tl.exp(s - lse[:, None]), 0.0)
    keep = kept(keys, draws, run, local_row, head, queries, key_positions, threshold)
    dropped = tl.where(keep, probabilities * keep_scale, 0.0)
    grad_probabilities = tl.where(keep, tl.dot(do, tl.trans(v)) * keep_scale, 0.0)
    return dropped, probabilities * (grad_probabilities - delta[:, None])


@triton.jit
def backward_key_value_kernel(query, key, value, mask, keys, draws, grad_out, log_sum_exp, delta, grad_key, grad_value,
                              in_row, in_head, in_token, in_dim, mask_row, mask_head, mask_query, mask_key, heads, length,
                              block_rows, scaling, threshold, keep_scale,
                              HAS_MASK: tl.constexpr, BLOCK: tl.constexpr, HEAD: tl.constexpr):
    program, row, head, run, local_row, key_positions, dims, base = coordinates(heads, block_rows, in_row, in_head, in_dim, BLOCK, HEAD)
    k, v = token_rows(key, base, key_positions, length, in_token), token_rows(value, base, key_positions, length, in_token)
    dk = tl.zeros([BLOCK, HEAD], tl.float32)
    dv = tl.zeros([BLOCK, HEAD], tl.float32)
    for start in range(0, length, BLOCK):
        queries = start + tl.arange(0, BLOCK)
        q = token_rows(query, base, queries, length, in_token)
        do, lse, row_delta = query_side(grad_out, log_sum_exp, delta, program, row, head, queries, dims, heads, length, HEAD)
        dropped, grad_scores = tile_gradients(q, k, v, do, lse, row_delta, mask, keys, draws, run, local_row, row, head, queries,
                                              key_positions, length, mask_row, mask_head, mask_query, mask_key, scaling, threshold,
                                              keep_scale, HAS_MASK)
        dv += tl.dot(tl.trans(dropped.to(do.dtype)), do)
        dk += tl.dot(tl.trans(grad_scores.to(q.dtype)), q)
    store_token_rows(grad_key, base, key_positions, length, in_token, dk * scaling)
    store_token_rows(grad_value, base, key_positions, length, in_token, dv)


@triton.jit
def backward_query_kernel(query, key, value, mask, keys, draws, grad_out, log_sum_exp, delta, grad_query,
                          in_row, in_head, in_token, in_dim, mask_row, mask_head, mask_query, mask_key, heads, length,
                          block_rows, scaling, threshold, keep_scale,
                          HAS_MASK: tl.constexpr, BLOCK: tl.constexpr, HEAD: tl.constexpr):
    program, row, head, run, local_row, queries, dims, base = coordinates(heads, block_rows, in_row, in_head, in_dim, BLOCK, HEAD)
    q = token_rows(query, base, queries, length, in_token)
    do, lse, row_delta = query_side(grad_out, log_sum_exp, delta, program, row, head, queries, dims, heads, length, HEAD)
    dq = tl.zeros([BLOCK, HEAD], tl.float32)
    for start in range(0, length, BLOCK):
        key_positions = start + tl.arange(0, BLOCK)
        k, v = token_rows(key, base, key_positions, length, in_token), token_rows(value, base, key_positions, length, in_token)
        _, grad_scores = tile_gradients(q, k, v, do, lse, row_delta, mask, keys, draws, run, local_row, row, head, queries,
                                        key_positions, length, mask_row, mask_head, mask_query, mask_key, scaling, threshold,
                                        keep_scale, HAS_MASK)
        dq += tl.dot(grad_scores.to(k.dtype), k)
    store_token_rows(grad_query, base, queries, length, in_token, dq * scaling)
