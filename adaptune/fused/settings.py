"""How a training step computes, as one frozen object built once at an entry point and passed down.

Each field is an ADAPTUNE_* variable of adaptune.core.environment (its values and meaning are declared there);
`StepSettings.from_environment` reads them once, applies an accelerator preset's pinned values under the
user's own, and checks the dependencies between them, each violation one line. Torch-free, so that planning
can validate what a shard will run. Only settings a measurement shows to pay are here (the measurement log,
bench/LOG.md, keeps the figures of those that went).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from adaptune.core import environment
from adaptune.core.environment import STEP_VARIABLES, SettingError, parse

COMPILE_ENV, DROPOUT_MASKS_ENV, ATTENTION_ENV, LAYER_NORM_ENV, DROPOUT_ENV = (variable.name for variable in STEP_VARIABLES)
# Each field of StepSettings, the variable that sets it (in the order presets have always written them: compiled specs keep their bytes).
FIELD_VARIABLES = {"compile": COMPILE_ENV, "dropout_masks": DROPOUT_MASKS_ENV, "attention": ATTENTION_ENV, "layer_norm": LAYER_NORM_ENV,
                   "dropout": DROPOUT_ENV}
VALUES = {field: next(variable.values for variable in STEP_VARIABLES if variable.name == name) for field, name in FIELD_VARIABLES.items()}
STEP_GRAPHS = "step_graphs"
# The settings of how a Transformer layer computes, by the field a run's record (and a benchmark's row) gives each one's
# value under: what bench-gpu's fused measurements cross (bench/gpu_fused.py's measure_fused, --fused-<field>).
LAYER_SETTINGS = {"attention": ATTENTION_ENV, "dropout": DROPOUT_ENV, "layer_norm": LAYER_NORM_ENV}
# The fields of a run's record that say how its steps were computed (runs.parquet's step_settings_json). Of them,
# dropout_masks changes what a run computes beyond the order of its sums (projections, residual and branch_sums are
# recorded as before: always stacked where a layer allows it, float32 and separate since their options went).
RECORDED_SETTINGS = ("compile", "dropout_masks", "attention", "dropout", "projections", "layer_norm", "residual", "branch_sums")
# What needs counter dropout masks, and why: stated once.
NEEDS_COUNTER_MASKS = {
    ("compile", STEP_GRAPHS): "a captured step cannot draw from a host-side generator",
    ("attention", "kernel"): "the kernel draws counter masks inside itself",
    ("dropout", "kernel"): "the kernel draws counter masks inside itself",
}


@dataclasses.dataclass(frozen=True)
class StepSettings:
    """How every step a process trains computes. Defaults are the measured best on a CPU (where no kernel or
    graph applies); an accelerator preset is an instance (adaptune.sweep.spec.Accelerator.step_settings)."""

    # Each non-default value is what a GPU preset takes because it timed faster there (figures: bench/LOG.md,
    # "Figures moved out of the code's comments").
    compile: str = "eager"  # "step_graphs": a group's whole step replayed as CUDA graphs
    dropout_masks: str = "generator"  # "counter": masks keyed by seed, step and site, drawn on the device
    attention: str = "eager"  # "kernel": attention with its dropout in one Triton kernel
    layer_norm: str = "torch"  # "kernel": a group's LayerNorms in one Triton kernel
    dropout: str = "mask"  # "kernel": hidden-state dropout drawn and applied in one Triton kernel

    def __post_init__(self) -> None:
        for field, values in VALUES.items():
            if getattr(self, field) not in values:
                raise SettingError(f"{FIELD_VARIABLES[field]}={getattr(self, field)!r} is not valid: use one of {', '.join(values)}")
        if self.dropout_masks != "counter":
            for (field, value), why in NEEDS_COUNTER_MASKS.items():
                if getattr(self, field) == value:
                    raise SettingError(f"{FIELD_VARIABLES[field]}={value} needs {DROPOUT_MASKS_ENV}=counter ({why}): set both, "
                                       f"or unset {FIELD_VARIABLES[field]}")

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None, preset: Iterable[tuple[str, str]] = ()) -> StepSettings:
        """The settings in `environ` (None: this process's, environment.settings(), patches included); a variable it leaves unset takes the preset's
        (variable, value) pair, else its default. One SettingError line for a bad value or a broken dependency."""
        environ = environment.settings().environ if environ is None else environ
        pinned = dict(preset)
        for name in pinned:
            if name not in FIELD_VARIABLES.values():
                raise SettingError(f"{name} is not a step setting: use one of {', '.join(FIELD_VARIABLES.values())}")
        return cls(**{field: parse(name, (environ.get(name) or "").strip() or pinned.get(name)) for field, name in FIELD_VARIABLES.items()})

    @classmethod
    def preset(cls, pairs: Iterable[tuple[str, str]]) -> StepSettings:
        """An accelerator preset's (variable, value) pairs as settings, the rest at their defaults."""
        return cls.from_environment({}, pairs)

    def pinned(self) -> tuple[tuple[str, str], ...]:
        """The (variable, value) pairs that differ from the defaults: how a preset is written in a sweep file."""
        default = StepSettings()
        return tuple((name, getattr(self, field)) for field, name in FIELD_VARIABLES.items() if getattr(self, field) != getattr(default, field))

    def for_masks(self, mask_scheme: str) -> StepSettings:
        """These settings for a run that keeps `mask_scheme` (a resumed run keeps its own): what needs counter
        masks falls back to its eager form for a run drawing generator masks."""
        if mask_scheme == self.dropout_masks:
            return self
        if mask_scheme == "counter":
            return dataclasses.replace(self, dropout_masks="counter")
        fallback = {field: VALUES[field][0] for field, _ in NEEDS_COUNTER_MASKS}
        return dataclasses.replace(self, dropout_masks=mask_scheme, **fallback)

    @property
    def step_graphs(self) -> bool:
        return self.compile == STEP_GRAPHS

    def recorded(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

