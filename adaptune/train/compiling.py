"""How the training forward runs: eagerly (the default), under torch.compile, or replayed as CUDA graphs.

`ADAPTUNE_COMPILE` picks it for every run a process trains, alone or in a group. A launch-bound GPU
step (bench/gpu.json: a BERT-base step takes as long at 40 tokens as at 128) pays per kernel; compiling
fuses operators, and CUDA graphs (torch.compile's "reduce-overhead" mode) replay each Transformer
layer's forward and backward as one launch. Evaluation stays eager. The sequence length is dynamic, so the batches'
lengths (rounded to the device's pad multiple: at most max_length / 8 of them on a GPU) need one
compiled graph, or one CUDA graph each, not one compile each.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from adaptune.core.step_settings import COMPILE_ENV, step_setting
from adaptune.model.adapters import UnsupportedModelError, encoder_layers

# torch.compile's mode; "step_graphs": a fused group's whole step captured as CUDA graphs, the model eager;
# "compiled_step_graphs": the same capture around the compiled layers (adaptune.train.step_graphs; a run that
# cannot be grouped, full fine-tuning, runs eagerly in those modes); "autotuned_step_graphs": the layers compiled with
# inductor's max-autotune (without its own CUDA graphs: the step's capture holds them), which on a GPU times Triton
# matmul templates against cuBLAS and can fuse a matmul's elementwise consumers (bias and GELU, a residual add) into
# it: what a BERT-large group's step still writes apart from its matmuls' outputs (make bench-attention) is mostly
# such passes. Slow to compile (each matmul shape autotuned); a GPU call times it (bench/gpu_session.sh autotunelarge).
COMPILE_MODES: dict[str, str | None] = {"eager": None, "compiled": "default", "graphs": "reduce-overhead", "step_graphs": None,
                                        "compiled_step_graphs": "default", "autotuned_step_graphs": "max-autotune-no-cudagraphs"}


def compile_mode() -> str:
    """The training forward's mode for this process: $ADAPTUNE_COMPILE, else "eager"."""
    return step_setting(COMPILE_ENV)


def training_forward(model: torch.nn.Module, mode: str) -> Callable[..., Any]:
    """What a training step calls in place of `model` (the same parameters): the model itself, or it
    with its Transformer layers compiled. Under CUDA graphs each call starts a new step
    (torch.compiler.cudagraph_mark_step_begin), whose outputs the next replay overwrites: the loss is
    copied out; other outputs (a group's logits) must be used before the next call.

    Compiled by region: the layers are one code path with their own tensors, so one compiled graph
    serves them all. A group of 8 BERT-base runs (12 layers) took 203 s to capture whole on this
    project's 2-core CPU (aot_eager) and 27 s by layer; whole, it never finished compiling in a GPU call's
    170 s (bench/gpu.json). The layers run compiled only inside this call, so evaluation stays eager.
    A model without a BERT-family layer list is compiled whole."""
    if COMPILE_MODES[mode] is None:
        return model
    layers = _layer_list(model)
    if layers is None:
        forward: Callable[..., Any] = torch.compile(model, dynamic=True, mode=COMPILE_MODES[mode])
    else:
        compiled = [torch.compile(layer, dynamic=True, mode=COMPILE_MODES[mode]) for layer in layers]
        forward = functools.partial(_with_layers, model, layers, compiled)
    if mode != "graphs":
        return forward

    def replayed(*args: Any, **kwargs: Any) -> Any:
        torch.compiler.cudagraph_mark_step_begin()
        outputs = forward(*args, **kwargs)
        if getattr(outputs, "loss", None) is not None:
            outputs.loss = outputs.loss.clone()  # a solo step keeps its loss until the next check
        return outputs

    return replayed


def _layer_list(model: torch.nn.Module) -> torch.nn.ModuleList | None:
    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # peft's wrapper
    try:
        return encoder_layers(base)
    except UnsupportedModelError:
        return None


def _with_layers(model: torch.nn.Module, layers: torch.nn.ModuleList, compiled: list[torch.nn.Module], *args: Any, **kwargs: Any) -> Any:
    originals = list(layers)
    for index, layer in enumerate(compiled):
        layers[index] = layer
    try:
        return model(*args, **kwargs)
    finally:
        for index, layer in enumerate(originals):
            layers[index] = layer
