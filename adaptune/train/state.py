"""The full training state a preempted run resumes from: trained weights, optimizer, schedule, RNG, progress.

Written atomically (temp file + rename) at epoch ends and every `checkpoint_every_steps` steps, so a
kill at any moment leaves either the previous state or the new one, never half of one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from adaptune.core.files import atomic_write
from adaptune.core.run_files import STATE_FILE
from adaptune.fused.run_dropout import CounterStream, saved_scheme
from adaptune.fused.settings import StepSettings


@dataclasses.dataclass
class Progress:
    """Where the loop stands, plus what the record needs from the steps already taken."""

    epoch: int = 0  # epochs completed
    step_in_epoch: int = 0  # optimizer steps taken in the current (unfinished) epoch
    global_step: int = 0
    epoch_loss_sum: float = 0.0
    epoch_loss_steps: int = 0
    train_time_s: float = 0.0  # time inside training steps, over every attempt
    examples_trained: int = 0
    elapsed_s: float = 0.0  # wall time of earlier attempts, up to their last saved state
    phase_s: dict[str, float] = dataclasses.field(default_factory=dict)  # setup, evaluation, saving (phase_times)
    curve: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    best_epoch: int | None = None  # the epoch best on validation (recorded; not the run's result)
    best_value: float | None = None
    # The run's result: the final epoch's metrics (the official code evaluates the final model).
    final_val_metrics: dict[str, float | None] = dataclasses.field(default_factory=dict)
    final_test_metrics: dict[str, float | None] = dataclasses.field(default_factory=dict)
    final_predicted_classes: int | None = None  # on validation
    final_test_predicted_classes: int | None = None
    final_companions: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)  # mnli_mm for an MNLI run


def trained_parameters(model: nn.Module) -> dict[str, nn.Parameter]:
    return {name: parameter for name, parameter in model.named_parameters() if parameter.requires_grad}


def saved_optimizer_state(optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The optimizer's state_dict as a run saves it. A fused group's run shares one step count among its
    tensors (group_optimizer.adamw_together), and torch's AdamW, which a resumed run may train with
    alone, increments every tensor's count in place: the saved state gives each tensor its own copy
    (the live optimizer's state is left as it is)."""
    optimizer_state = optimizer.state_dict()
    # A step replayed as a CUDA graph (step_graphs) holds its learning rate in a device tensor: saved as a number.
    groups = [{**group, "lr": float(group["lr"]), "capturable": False} if torch.is_tensor(group["lr"]) else group
              for group in optimizer_state["param_groups"]]
    states = {index: {**state, "step": state["step"].clone()} if torch.is_tensor(state.get("step")) else state
              for index, state in optimizer_state["state"].items()}
    return {**optimizer_state, "param_groups": groups, "state": states}


def save_state(
    out_dir: Path, run_id: str, trained: Mapping[str, torch.Tensor], optimizer: torch.optim.Optimizer, scheduler: Any,
    progress: Progress, dropout: torch.Generator | CounterStream | None = None,
) -> None:
    """`trained`: the run's trained tensors by their solo names (a grouped run's too: run_groups.run_parameters);
    `dropout`: the run's dropout stream (run_dropout), whose state a resumed run continues from (and whose scheme it
    keeps: resume_point)."""
    state = {
        "run_id": run_id,
        "trained": {name: p.detach().cpu().clone() for name, p in trained.items()},
        "optimizer": saved_optimizer_state(optimizer),
        "scheduler": scheduler.state_dict(),
        "rng_cpu": torch.get_rng_state(),
        "rng_cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "rng_dropout": dropout.get_state() if dropout is not None else None,
        "progress": dataclasses.asdict(progress),
    }
    atomic_write(out_dir / STATE_FILE, lambda temporary: torch.save(state, temporary))


def load_state(
    out_dir: Path, run_id: str, trained: Mapping[str, nn.Parameter], optimizer: torch.optim.Optimizer, scheduler: Any,
    dropout: torch.Generator | CounterStream | None = None,
) -> Progress | None:
    """Restore a saved state into model/optimizer/scheduler/RNG; None when there is none to resume."""
    path = out_dir / STATE_FILE
    if not path.is_file():
        return None
    state = torch.load(path, map_location="cpu", weights_only=True)
    if state["run_id"] != run_id:
        raise ValueError(
            f"{path} belongs to run {state['run_id']!r}, not {run_id!r}: give this run its own out dir "
            "(or delete the file to start over)"
        )
    saved = state["trained"]
    if set(saved) != set(trained) or any(saved[name].shape != parameter.shape for name, parameter in trained.items()):
        unexpected = sorted(set(saved) ^ set(trained))[:5]
        raise ValueError(f"{path} does not fit this model (differing tensors: {unexpected or 'shapes'}); delete it to start over")
    with torch.no_grad():
        for name, parameter in trained.items():
            parameter.copy_(saved[name])
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    torch.set_rng_state(state["rng_cpu"])
    if state["rng_cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["rng_cuda"])
    if dropout is not None and state.get("rng_dropout") is not None:
        dropout.set_state(state["rng_dropout"])
    known = {field.name for field in dataclasses.fields(Progress)}
    return Progress(**{key: value for key, value in state["progress"].items() if key in known})  # older states' extra fields dropped


def resume_point(out_dir: Path, settings: StepSettings) -> tuple[int, StepSettings]:
    """Where a run stands: (the global step of its saved state, the settings it trains under): `settings`, with the
    dropout masks' scheme of its saved state where it has one, since the scheme changes what a run computes beyond
    reduction order (StepSettings.for_masks). Memory-mapped: only these fields are read."""
    path = out_dir / STATE_FILE
    if not path.is_file():
        return 0, settings
    state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    if state.get("residual") not in (None, "float32"):  # saved by a run that trained a bf16 residual stream
        raise ValueError(f"{path} was saved under ADAPTUNE_RESIDUAL=autocast, an option that has left (bench/LOG.md): "
                         "delete it to train the run again from its start")
    return int(state["progress"]["global_step"]), settings.for_masks(saved_scheme(state.get("rng_dropout")) or settings.dropout_masks)


def remove_state(out_dir: Path) -> None:
    """A finished run needs no resume state (it holds the optimizer's moments: up to 3x the model)."""
    (out_dir / STATE_FILE).unlink(missing_ok=True)
