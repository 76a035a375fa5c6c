"""The counter dropout masks' scheme written out apart from adaptune.fused.run_dropout, on int64 words: what
tests/fused/test_run_dropout.py holds counter_keep_mask to, and what bench/counter_mask_int32.py timed its int32 form
against."""

from __future__ import annotations

import torch


def defined_keep_mask(keys: torch.Tensor, draws: torch.Tensor, shape: tuple[int, ...], p: float) -> torch.Tensor:
    """The counter scheme's definition, written out apart from run_dropout: saved runs resume on these bits,
    so any faster form of counter_keep_mask must draw exactly them."""
    m32 = (1 << 32) - 1

    def mix32(x: torch.Tensor) -> torch.Tensor:
        x = x ^ (x >> 16)
        x = (x * 0x45D9F3B) & m32
        x = x ^ (x >> 16)
        x = (x * 0x45D9F3B) & m32
        return x ^ (x >> 16)

    widths = {1: (32,), 2: (20, 12), 3: (11, 9, 12), 4: (8, 6, 9, 9)}[len(shape) - 1]
    index, shift = torch.zeros((), dtype=torch.int64), 32
    for axis, (size, width) in enumerate(zip(shape[1:], widths, strict=True)):
        shift -= width
        index = index + (torch.arange(size, dtype=torch.int64) << shift).view(size, *([1] * (len(widths) - axis - 1)))
    per_run = (-1, *([1] * len(widths)))
    first = (keys[:, 0] ^ mix32(draws & m32)).view(per_run)
    second = (keys[:, 1] ^ mix32((draws & m32) ^ 0x5BD1E995)).view(per_run)
    return mix32(mix32(index.unsqueeze(0) ^ first) ^ second) >= round(p * (1 << 32))
