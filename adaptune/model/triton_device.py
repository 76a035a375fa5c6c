"""Where adaptune's Triton kernels (attention_kernel, dropout_kernel) can run, and the one precision Triton's CPU
interpreter gets wrong."""

from __future__ import annotations

import os

import torch


def runs_triton(tensor: torch.Tensor) -> bool:
    """A GPU, or a CPU under Triton's interpreter (TRITON_INTERPRET=1, the tests'); where triton is missing, a
    kernel's first call says so."""
    return tensor.is_cuda or os.environ.get("TRITON_INTERPRET") == "1"


def interpreted_bf16(tensor: torch.Tensor) -> bool:
    """Whether a kernel call on `tensor` would run bf16 under Triton's interpreter, which gets bf16 wrong (numpy has
    no bf16: tiles multiplied wrongly, 41% of a dropout call's values a bf16 step off): the kernels run such a call
    in float32 and round it to bf16 with torch, which gives the GPU kernels' values."""
    return not tensor.is_cuda and tensor.dtype == torch.bfloat16
