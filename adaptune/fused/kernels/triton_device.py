"""Where adaptune's Triton kernels (kernels.attention, .dropout, .layer_norm) can run, the one precision
Triton's CPU interpreter gets wrong, and how the elementwise kernels size their tiles (no triton import here: the
kernels' modules load it only where a kernel runs)."""

from __future__ import annotations

import os

import torch


def runs_triton(tensor: torch.Tensor) -> bool:
    """A GPU, or a CPU under Triton's interpreter (TRITON_INTERPRET=1, the tests'); where triton is missing, a
    kernel's first call says so."""
    return tensor.is_cuda or os.environ.get("TRITON_INTERPRET") == "1"


def interpreted_bf16(tensor: torch.Tensor, dtype: torch.dtype | None = None) -> bool:
    """Whether a kernel call on `tensor` (or writing `dtype` on its device) would run bf16 under Triton's interpreter,
    which gets bf16 wrong (numpy has no bf16: tiles multiplied wrongly, 41% of a dropout call's values a bf16 step
    off, stores truncated): the kernels run such a call in float32 and round it to bf16 with torch, which gives the
    GPU kernels' values."""
    return not tensor.is_cuda and (dtype or tensor.dtype) == torch.bfloat16


# Elements an elementwise kernel's program takes at least, where its lines are short: one line of BERT-base's 768
# features (a block of 1,024), many lines of a narrow model's.
TILE_ELEMENTS = 1024


def power_of_two_at_least(size: int) -> int:
    """The smallest power of two not below `size` (1 for 0 or 1): a tile axis's length, masked past `size`."""
    return 1 << max(0, size - 1).bit_length()


def lines_per_tile(block: int) -> int:
    """Whole lines of `block` elements a program takes: TILE_ELEMENTS' worth, at least one."""
    return max(1, TILE_ELEMENTS // block)
