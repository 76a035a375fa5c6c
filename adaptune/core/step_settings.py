"""How a training step runs, as settings read from the environment (no torch here, so planning stays
light): each setting's variable, what its values are, and the values, the first being the default. An
accelerator preset pins some of them on its pipeline tasks (adaptune.sweep.experiments.Accelerator);
the modules that act on them read them through `step_setting`."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator

COMPILE_ENV = "ADAPTUNE_COMPILE"  # adaptune.train.compiling
DROPOUT_MASKS_ENV = "ADAPTUNE_DROPOUT_MASKS"  # adaptune.model.run_dropout
ATTENTION_ENV = "ADAPTUNE_ATTENTION"  # adaptune.model.attention_kernel
DROPOUT_ENV = "ADAPTUNE_DROPOUT"  # adaptune.model.dropout_kernel
PROJECTIONS_ENV = "ADAPTUNE_PROJECTIONS"  # adaptune.model.frozen_projections
LAYER_NORM_ENV = "ADAPTUNE_LAYER_NORM"  # adaptune.model.layer_norm_kernel
RESIDUAL_ENV = "ADAPTUNE_RESIDUAL"  # adaptune.model.residual_stream
BRANCH_SUMS_ENV = "ADAPTUNE_BRANCH_SUMS"  # adaptune.model.branch_sums
GRAPH_WARMUP_ENV = "ADAPTUNE_GRAPH_WARMUP"  # adaptune.train.step_graphs
# The compile modes that replay a group's step as CUDA graphs (adaptune.train.step_graphs), a lone run's too.
STEP_GRAPH_MODES = ("step_graphs", "compiled_step_graphs", "autotuned_step_graphs")
STEP_SETTINGS: dict[str, tuple[str, tuple[str, ...]]] = {
    COMPILE_ENV: ("a compile mode", ("eager", "compiled", "graphs", *STEP_GRAPH_MODES)),
    DROPOUT_MASKS_ENV: ("a dropout mask scheme", ("generator", "counter")),
    ATTENTION_ENV: ("an attention mode", ("eager", "kernel")),
    DROPOUT_ENV: ("a dropout mode", ("mask", "kernel")),
    PROJECTIONS_ENV: ("a way to multiply frozen query, key and value projections", ("stacked", "separate")),
    LAYER_NORM_ENV: ("a grouped LayerNorm mode", ("torch", "kernel")),
    RESIDUAL_ENV: ("a residual stream precision", ("float32", "autocast")),
    BRANCH_SUMS_ENV: ("a way to add a group's adapter and LoRA outputs to their sums", ("in_matmul", "separate")),
    GRAPH_WARMUP_ENV: ("a number of eager steps before a shape's CUDA graph is captured", ("1", "2")),
}
# The settings of how a Transformer layer computes, by the field a run's record (and a benchmark's row) gives each one's
# value under: what bench-gpu's fused measurements cross (adaptune.bench.gpu_fused.measure_fused, --fused-<field>).
LAYER_SETTINGS = {"attention": ATTENTION_ENV, "dropout": DROPOUT_ENV, "projections": PROJECTIONS_ENV, "layer_norm": LAYER_NORM_ENV,
                  "residual": RESIDUAL_ENV, "branch_sums": BRANCH_SUMS_ENV}
# The fields of a run's record that say how its steps were computed (runs.parquet's step_settings_json). Of them,
# dropout_masks and residual change what a run computes beyond the order of its sums.
RECORDED_SETTINGS = ("compile", "dropout_masks", *LAYER_SETTINGS)


def step_setting(name: str) -> str:
    """The value of setting `name` in this process's environment (unset or empty: the default)."""
    return checked_value(name, os.environ.get(name) or STEP_SETTINGS[name][1][0])


def checked_value(name: str, value: str) -> str:
    """`value` if setting `name` has it, else one line saying which values it has."""
    if name not in STEP_SETTINGS:
        raise ValueError(f"{name} is not a step setting: use one of {', '.join(STEP_SETTINGS)}")
    what, values = STEP_SETTINGS[name]
    if value not in values:
        raise ValueError(f"{name}={value!r} is not {what}: use one of {', '.join(values)}")
    return value


@contextlib.contextmanager
def step_settings_applied(settings: Iterable[tuple[str, str]]) -> Iterator[dict[str, str]]:
    """These (variable, value) settings in this process's environment for the block, where the variable is
    not set already (a pipeline task's environment, or the user's own, wins); restored afterwards. Yields
    what it set. So a shard run by hand trains as the accelerator's pipeline tasks do."""
    applied = {name: checked_value(name, value) for name, value in settings if not os.environ.get(name)}
    os.environ.update(applied)
    try:
        yield applied
    finally:
        for name in applied:
            os.environ.pop(name, None)


def run_count(name: str, value: object) -> int:
    """`value` of the setting `name` as a number of runs (runs per group, per device), or one line saying what is wrong."""
    try:
        count = int(value)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        count = 0
    if count < 1:
        raise ValueError(f"{name} must be a whole number >= 1, got {value!r}")
    return count
