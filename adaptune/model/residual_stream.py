"""The residual stream's precision under autocast, a step setting (`ADAPTUNE_RESIDUAL`).

"float32", the default, is autocast's own: CUDA's autocast runs layer_norm in float32, so every hidden state between
a Transformer's layers (each LayerNorm's output, and the residual sums built on it) is float32, although every matmul
that reads it casts it to bf16 first. "autocast" rounds each LayerNorm's output to the autocast dtype, so the stream
is bf16 end to end, as Megatron-LM keeps it unless asked for float32 residuals (`--fp32-residual-connection`): the
statistics and the normalisation are still computed in float32, and trained tensors stay float32.

Why: on an H100 a fused group's step is bound by its elementwise passes as much as by its matmuls (bench/gpu.json),
and the float32 stream is a quarter of the bytes a layer's step writes: the residual sums, the LayerNorms' outputs
and their input gradients in float32, and the casts to bf16 and back around every matmul (`make bench-attention`).
Every LayerNorm rounds alike, a run's alone (torch's nn.LayerNorm) as in a group (GroupedLayerNorm, whose kernel
writes bf16 directly), so a run trains the same alone or grouped, as with the default.
"""

from __future__ import annotations

import torch
from torch import nn

from adaptune.core.step_settings import RESIDUAL_ENV, STEP_SETTINGS, step_setting
from adaptune.model.run_groups import GroupedLayerNorm

RESIDUAL_MODES = STEP_SETTINGS[RESIDUAL_ENV][1]


def residual_mode() -> str:
    """$ADAPTUNE_RESIDUAL: "float32" (unset) or "autocast"."""
    return step_setting(RESIDUAL_ENV)


def round_residual_stream(model: nn.Module, dtype: torch.dtype | None, mode: str | None = None) -> str:
    """Under the "autocast" setting (`mode`, else this process's), make every LayerNorm of `model` give its output in
    `dtype` (the autocast dtype; None: the model trains without autocast, and nothing changes) whenever it runs under
    autocast. Returns what records say of the stream: the dtype's short name, or "float32". Reads the setting first,
    so that a misspelt value fails before anything trains."""
    if (mode or residual_mode()) != "autocast" or dtype is None:
        return "float32"
    for module in model.modules():
        if isinstance(module, GroupedLayerNorm):
            module.rounds_to = dtype
        elif isinstance(module, nn.LayerNorm) and not getattr(module, "_rounds_to", None):
            module._rounds_to = dtype
            module.register_forward_hook(_rounded)
    return str(dtype).removeprefix("torch.").replace("bfloat16", "bf16")


def _rounded(module: nn.Module, _args: tuple, output: torch.Tensor) -> torch.Tensor:
    return output.to(module._rounds_to) if torch.is_autocast_enabled(output.device.type) else output
