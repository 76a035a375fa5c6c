"""How the training forward runs: eagerly (the default), under torch.compile, or replayed as CUDA graphs.

`ADAPTUNE_COMPILE` picks it for every run a process trains, alone or in a group. A launch-bound GPU
step (bench/gpu.json: a BERT-base step takes as long at 40 tokens as at 128) pays per kernel; compiling
fuses operators, and CUDA graphs (torch.compile's "reduce-overhead" mode) replay a whole forward and
backward as one launch. Evaluation stays eager. The sequence length is dynamic, so the batches'
lengths (rounded to the device's pad multiple: at most max_length / 8 of them on a GPU) need one
compiled graph, or one CUDA graph each, not one compile each.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch

COMPILE_ENV = "ADAPTUNE_COMPILE"
COMPILE_MODES: dict[str, str | None] = {"eager": None, "compiled": "default", "graphs": "reduce-overhead"}  # torch.compile's mode


def compile_mode() -> str:
    """The training forward's mode for this process: $ADAPTUNE_COMPILE, else "eager"."""
    mode = os.environ.get(COMPILE_ENV) or "eager"
    if mode not in COMPILE_MODES:
        raise ValueError(f"{COMPILE_ENV}={mode!r} is not a compile mode: use one of {', '.join(COMPILE_MODES)}")
    return mode


def training_forward(model: torch.nn.Module, mode: str) -> Callable[..., Any]:
    """What a training step calls in place of `model` (the same parameters): the model itself, or it
    compiled. Under CUDA graphs each call starts a new step (torch.compiler.cudagraph_mark_step_begin),
    whose outputs the next replay overwrites: the loss is copied out; other outputs (a group's logits)
    must be used before the next call."""
    if COMPILE_MODES[mode] is None:
        return model
    compiled = torch.compile(model, dynamic=True, mode=COMPILE_MODES[mode])
    if mode != "graphs":
        return compiled

    def replayed(*args: Any, **kwargs: Any) -> Any:
        torch.compiler.cudagraph_mark_step_begin()
        outputs = compiled(*args, **kwargs)
        if getattr(outputs, "loss", None) is not None:
            outputs.loss = outputs.loss.clone()  # a solo step keeps its loss until the next check
        return outputs

    return replayed
