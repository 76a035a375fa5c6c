"""What a training step costs: its FLOPs on a batch's shape (for MFU) and its time on a device, and variants timed
in interleaved rounds; shared by the benchmarks (bench.cpu, bench.gpu, bench.gpu_fused)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from adaptune.core.devices import Device


def training_flops(model: nn.Module, batch: dict[str, torch.Tensor]) -> float:
    """Training FLOPs of one step on this batch's computed (padded) shape.

    Forward: 2 per matmul weight per token, plus attention's two L x L products (4 B L^2 d per layer).
    Backward: activation gradients cost the forward again through every layer (2x for attention's
    products); weight gradients 2 per trained matmul weight per token. Full fine-tuning: the usual
    6 N + 12 L d per token; adapters: 4 N + 2 N_adapters + attention.
    """
    config = model.config
    batch_size, length = batch["input_ids"].shape
    attention = 4 * batch_size * length**2 * config.hidden_size * config.num_hidden_layers
    return batch_size * length * matmul_flops_per_token(model) + 3 * attention


def matmul_flops_per_token(model: nn.Module) -> float:
    """A token's training FLOPs in the matmuls (the embeddings are lookups): 4 per weight (forward and the activations'
    gradient), 2 more per trained weight (its gradient)."""
    matmuls = [p for name, p in model.named_parameters() if p.dim() == 2 and "embeddings" not in name]
    return 4.0 * sum(p.numel() for p in matmuls) + 2.0 * sum(p.numel() for p in matmuls if p.requires_grad)


def timed_pass(step: Callable[[Any], None], batches: list[Any], device: Device) -> float:
    device.synchronize()
    started = time.perf_counter()
    for batch in batches:
        step(batch)
    device.synchronize()
    return time.perf_counter() - started


def interleaved(variants: dict[str, Callable[[], float]], repeats: int) -> dict[str, list[float]]:
    """Each variant once untimed (warm-up), then `repeats` rounds of all variants in turn."""
    for run in variants.values():
        run()
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(repeats):
        for name, run in variants.items():
            times[name].append(run())
    return times
