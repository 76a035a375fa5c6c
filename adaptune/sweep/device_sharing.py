"""How a shard shares its device: runs side by side in separate processes (`runs_per_device`) and runs
fused into one forward pass (`runs_per_group`), each the accelerator preset's setting unless its
environment variable overrides it. Torch-free (so that planning can price what the runner will do) but for
a CPU's default group, which asks the CPU whether it multiplies bf16 natively."""

from __future__ import annotations

import os
from typing import Any

RUNS_PER_DEVICE_ENV = "ADAPTUNE_RUNS_PER_DEVICE"
RUNS_PER_GROUP_ENV = "ADAPTUNE_RUNS_PER_GROUP"


def runs_per_device(accelerator: Any) -> int:
    return _count(RUNS_PER_DEVICE_ENV, "runs_per_device", accelerator)


# Whole adapter runs fused 4 at a time in bf16 on a CPU with native bf16 finished 1.3x sooner than one
# after another (bench/cpu_bf16.json "whole_runs_bfloat16"); in float32 a group was no faster (0.97x).
CPU_BF16_RUNS_PER_GROUP = 4


def runs_per_group(accelerator: Any) -> int:
    """Runs fused into one forward pass (adaptune.train.group_loop): the env's, else the accelerator's
    setting, else (None) its measured default."""
    if not os.environ.get(RUNS_PER_GROUP_ENV) and getattr(accelerator, "runs_per_group", 1) is None:
        return default_runs_per_group(accelerator)
    return _count(RUNS_PER_GROUP_ENV, "runs_per_group", accelerator)


def default_runs_per_group(accelerator: Any) -> int:
    """CPU_BF16_RUNS_PER_GROUP on a CPU whose runs train in bf16 here (its pinned cpu_precision, else
    this machine's); 1 elsewhere (a GPU preset names its own, measured)."""
    if accelerator.family != "cpu":
        return 1
    from adaptune.sweep.throughput import planned_cpu_device  # torch, for the CPU's capability

    return CPU_BF16_RUNS_PER_GROUP if planned_cpu_device(accelerator.cpu_precision) == "cpu:bf16" else 1


def _count(env: str, field: str, accelerator: Any) -> int:
    value = os.environ.get(env) or getattr(accelerator, field, 1)
    try:
        count = int(value)
    except ValueError:
        count = 0
    if count < 1:
        raise ValueError(f"{env} / {field} must be a whole number >= 1, got {value!r}")
    return count
