"""The frozen backbone's precision on a CPU, as a setting: no torch here, so planning stays light."""

from __future__ import annotations

from adaptune.core import environment

# The frozen backbone's precision on a CPU. "auto": bf16 where the CPU multiplies it natively, else
# float32 (scores within seed noise, docs/results.md; an emulated bf16 step is an order of magnitude
# slower, bench/LOG.md); "bf16" is refused where it would be emulated.
CPU_PRECISIONS = ("auto", "bf16", "float32")
CPU_BF16_ENV = "ADAPTUNE_CPU_BF16"


def cpu_precision_setting() -> str:
    """$ADAPTUNE_CPU_BF16 as one of CPU_PRECISIONS: unset or "auto"; a yes (1/true/yes/on) bf16; a no float32."""
    value = environment.settings().cpu_bf16
    return "auto" if value == "auto" else "bf16" if value in environment.YES else "float32"


def cpu_bf16_env_value(precision: str) -> str:
    """The $ADAPTUNE_CPU_BF16 value that pins `precision` ("bf16" or "float32") on a pipeline's task."""
    return {"bf16": "1", "float32": "0"}[precision]
