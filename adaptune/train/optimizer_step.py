"""One optimizer step of one run, and the AdamW it steps: what a run alone (adaptune.train.loop), a probe
(adaptune.train.probe) and the benchmarks share."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn
from transformers.trainer_pt_utils import get_parameter_names

from adaptune.core.devices import Device
from adaptune.train.finite_guard import FiniteGuard, StepResult
from adaptune.train.run_book import RunBook
from adaptune.train.state import trained_parameters


def training_step(
    model: Callable[..., Any], batch: dict[str, torch.Tensor], optimizer: Any, scheduler: Any, trainable: list[nn.Parameter],
    device: Device, max_grad_norm: float,
) -> StepResult:
    """One optimizer step (forward, backward, clip, AdamW, schedule) of `model`; returns (loss, gradient norm) as
    device tensors, so that a GPU step never waits for the host. `FiniteGuard` checks them: on the CPU
    at once, before the weights change; on a GPU or TPU within SYNC_EVERY_STEPS steps, and always
    before a state is saved or the model evaluated, so a diverged run is recorded as failed either way.
    The benchmark times this same function.
    """
    with device.autocast():
        loss = model(**batch).loss
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(trainable, max_grad_norm)
    if device.kind == "cpu" and not (math.isfinite(float(loss.detach())) and math.isfinite(float(grad_norm))):
        optimizer.zero_grad(set_to_none=True)  # the CPU has no queue to keep full: stop before the update
        return loss.detach(), grad_norm
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    device.mark_step()
    return loss.detach(), grad_norm


def start_alone(run: RunBook, model: nn.Module, train_rows: int) -> int:
    """A run alone's training objects over its model's trained tensors (AdamW, decayed as BERT decays them; the
    finiteness guard; the schedule over every step), resumed where it saved a state; returns how many steps it takes
    in all. A run alone (adaptune.train.loop) and a probe (adaptune.train.probe) start so."""
    config = run.config
    total_steps = math.ceil(train_rows / config.batch_size) * config.epochs
    params = trained_parameters(model)
    run.start_training(params, adamw(params, decayed_names(model), config.lr, config.weight_decay), FiniteGuard(run.device), total_steps)
    return total_steps


def model_adamw(model: nn.Module, lr: float, weight_decay: float) -> torch.optim.AdamW:
    """A run alone's AdamW: over its model's trained tensors, decayed as BERT decays them (decayed_names)."""
    return adamw(trained_parameters(model), decayed_names(model), lr, weight_decay)


def decayed_names(model: nn.Module) -> set[str]:
    """The parameters weight decay applies to: BERT's exclusions, no biases and no LayerNorm weights."""
    return {name for name in get_parameter_names(model, [nn.LayerNorm]) if not name.endswith("bias")}


def adamw(trained: Mapping[str, nn.Parameter], decayed: set[str], lr: float, weight_decay: float) -> torch.optim.AdamW:
    """AdamW over one run's trained tensors (by solo name, in the model's order), decay where `decayed` says."""
    groups: list[dict[str, Any]] = [{"params": [], "weight_decay": weight_decay}, {"params": [], "weight_decay": 0.0}]
    for name, parameter in trained.items():
        groups[0 if name in decayed else 1]["params"].append(parameter)
    fused = all(p.is_cuda for g in groups for p in g["params"])  # one kernel for every parameter's update
    return torch.optim.AdamW([g for g in groups if g["params"]], lr=lr, weight_decay=weight_decay, fused=fused or None)
