"""How a shard shares its device: runs fused into one forward pass (`runs_per_group`), the accelerator preset's
setting unless its environment variable overrides it. Torch-free, so that planning can price what the runner will do.
(Runs side by side in separate processes left: on an H100 four were no faster than one at a time, bench/LOG.md.)"""

from __future__ import annotations

from typing import Any

from adaptune.core import environment

RUNS_PER_GROUP_ENV = "ADAPTUNE_RUNS_PER_GROUP"


def runs_per_group(accelerator: Any, device: str | None = None) -> int:
    """Runs fused into one forward pass (adaptune.train.group_loop): the environment's count where it sets one (a bad
    one is the registry's line), else the accelerator's; on a CPU training in float32 (`device` "cpu", as records
    name it: adaptune.core.devices.CPU_DEVICE_NAMES), its `float32_runs_per_group` where it sets one. Planning passes
    no device: every machine plans the same groups."""
    chosen = environment.settings().runs_per_group
    if chosen:
        return chosen
    in_float32 = getattr(accelerator, "float32_runs_per_group", None) if device == "cpu" else None
    return run_count(f"{RUNS_PER_GROUP_ENV} / runs_per_group", in_float32 or getattr(accelerator, "runs_per_group", 1))


def run_count(name: str, value: object) -> int:
    """`value` of the setting `name` as a number of runs, or one line saying what is wrong."""
    try:
        count = int(value)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        count = 0
    if count < 1:
        raise ValueError(f"{name} must be a whole number >= 1, got {value!r}")
    return count
