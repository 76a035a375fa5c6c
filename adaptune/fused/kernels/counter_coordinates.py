"""Where a position of a run's block lands in the counter dropout hash's 32-bit index, and the keep threshold:
the plain arithmetic that run_dropout.counter_keep_mask and the Triton kernels (kernels.dropout,
kernels.attention) share, below them all (no torch here)."""

from __future__ import annotations

from collections.abc import Sequence

# Bits of a position's index per axis of a run's block (rows first), by the block's rank: 32 in all.
COORDINATE_BITS = {
    1: (32,),  # rows
    2: (20, 12),  # rows, features (the classifier's dropout on the pooled output)
    3: (11, 9, 12),  # rows, tokens, features (embeddings, sublayer outputs, LoRA inputs)
    4: (8, 6, 9, 9),  # rows, heads, queries, keys (attention probabilities)
}


def coordinate_shifts(block: Sequence[int]) -> tuple[int, ...] | None:
    """Where each axis's coordinate lands in a position's 32-bit hash index for a run's block of this shape
    (rows first; left shifts, the last axis's 0), as counter_keep_mask builds the index; None where the
    block's rank or sizes do not fit the counter hash (there counter_keep_mask says why)."""
    widths = COORDINATE_BITS.get(len(block))
    if widths is None or any(size > 1 << width for size, width in zip(block, widths, strict=True)):
        return None
    return tuple(32 - sum(widths[: axis + 1]) for axis in range(len(widths)))


def keep_threshold(p: float) -> int:
    """A position is kept iff its unsigned 32-bit hash is at least this (p = 1: above every word)."""
    return round(p * (1 << 32))
