"""Parameter accounting: what a model holds, what a method trains, and the total size for N tasks."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # counting reads a model; the report's size arithmetic here needs no torch
    from torch import nn


@dataclasses.dataclass(frozen=True)
class ParameterCount:
    total: int  # every parameter of the model as it stands, inserted adapters included
    trained: int  # parameters with requires_grad
    trained_percent: float  # 100 * trained / total


def count_parameters(model: nn.Module) -> ParameterCount:
    # parameters() yields tied (shared) tensors once, so nothing is counted twice.
    total = sum(parameter.numel() for parameter in model.parameters())
    trained = sum(parameter.numel() for parameter in model.parameters() if parameter.requires_grad)
    return ParameterCount(total=total, trained=trained, trained_percent=100.0 * trained / total if total else 0.0)


def total_size_multiple(trained_per_task: Sequence[int], base_params: int, shares_backbone: bool) -> float:
    """Parameters needed to serve N tasks, as a multiple of the pre-trained model's size.

    This is the paper's "Total num params" column (Tables 1 and 2). One entry of
    `trained_per_task` per task (the paper counts MNLI-m and MNLI-mm as two tasks, footnote 3, so
    GLUE is 9 tasks):

    - shares_backbone=False (full fine-tuning): every task keeps its own whole model, so the total is
      sum(trained) / base; with trained = base for each task this is N ("9x", "17x").
    - shares_backbone=True (adapters, top-k, LayerNorm): one frozen copy of the backbone plus each
      task's trained parameters: 1 + sum(trained) / base. Table 2's adapters, 1.14% per task over 17
      tasks, give 1.19x; Table 1's adapters at 3.6% (sizes 8-256) and 2.1% (size 64) over 9 tasks
      give 1.3x and 1.2x. (Table 2's variable fine-tuning, 52.9% per task, gives 9.99 by this rule;
      the paper prints 9.9x, apparently truncated.)
    """
    if base_params <= 0:
        raise ValueError(f"base_params must be positive, got {base_params}")
    if not trained_per_task:
        raise ValueError("trained_per_task is empty: give one trained-parameter count per task")
    if any(count < 0 for count in trained_per_task):
        raise ValueError(f"trained parameter counts must be >= 0, got {list(trained_per_task)}")
    task_total = sum(trained_per_task) / base_params
    return 1.0 + task_total if shares_backbone else task_total
