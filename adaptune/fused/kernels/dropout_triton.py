"""The Triton kernel of adaptune.fused.kernels.dropout (that module's docstring says what it computes and
why). A run's block is seen as lines of features: one line per (row, token) of a rank-3 block, per row of a
rank-2 block, and a run's whole rows as one line of a rank-1 block. A program takes LINES whole lines (a
BLOCK of features each, masked past the last; LINES x BLOCK about a thousand elements) or, for a line longer
than BLOCK, a BLOCK of one line's features (the grid's second axis). Coordinates come from the program's ids:
32-bit divisions per line, none per element. The hash is attention_triton.mix32, the attention kernel's."""

import triton
import triton.language as tl

from adaptune.fused.kernels.attention_triton import mix32


@triton.jit
def dropout_kernel(x, out, keys, draws, lines, block_rows, tokens, features, threshold, scale,
                   ROW_SHIFT: tl.constexpr, TOKEN_SHIFT: tl.constexpr, LINES: tl.constexpr, BLOCK: tl.constexpr):
    """out = x * keep * scale in float32, rounded to out's dtype, where `keep` is run_dropout.counter_keep_mask's
    bit at each position: x and out are contiguous (runs, block_rows, tokens, features), `lines` = runs x
    block_rows x tokens (tokens 1 for a rank-2 block; rows and tokens 1 for a rank-1 block, its rows the
    features); a position's hash index is (row << ROW_SHIFT) | (token << TOKEN_SHIFT) | feature."""
    line = tl.program_id(0) * LINES + tl.arange(0, LINES)  # (run x block_rows + row) x tokens + token
    real = line < lines
    token = line % tokens
    run_row = line // tokens
    run, row = run_row // block_rows, run_row % block_rows
    draw = tl.load(draws + run, mask=real, other=0).to(tl.uint32, bitcast=True)
    first = tl.load(keys + 2 * run, mask=real, other=0).to(tl.uint32, bitcast=True) ^ mix32(draw)
    second = tl.load(keys + 2 * run + 1, mask=real, other=0).to(tl.uint32, bitcast=True) ^ mix32(draw ^ 0x5BD1E995)
    positions = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    inside = real[:, None] & (positions[None, :] < features)
    index = (((row.to(tl.uint32) << ROW_SHIFT) | (token.to(tl.uint32) << TOKEN_SHIFT))[:, None]
             | positions[None, :].to(tl.uint32))
    keep = mix32(mix32(index ^ first[:, None]) ^ second[:, None]) >= threshold.to(tl.uint32)
    offsets = line[:, None].to(tl.int64) * features + positions[None, :]  # 64-bit offsets: blocks past 2^31 elements
    values = tl.load(x + offsets, mask=inside, other=0.0).to(tl.float32)
    # x * 0 where dropped (as eager's x * mask: -0 for a negative x, NaN for an infinite one), x * scale where kept
    tl.store(out + offsets, (values * tl.where(keep, scale, 0.0)).to(out.dtype.element_ty), mask=inside)
