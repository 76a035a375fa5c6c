"""The frozen backbone's precision on a CPU, as a setting: no torch here, so planning stays light."""

from __future__ import annotations

import os

# The frozen backbone's precision on a CPU. "auto": bf16 where the CPU multiplies it natively, else
# float32 (measured: scores unchanged, README "The frozen backbone in bf16 on a CPU"; an emulated bf16
# step is 17x slower); "bf16" is refused where it would be emulated.
CPU_PRECISIONS = ("auto", "bf16", "float32")
CPU_BF16_ENV = "ADAPTUNE_CPU_BF16"
_CPU_BF16_VALUES = {"": "auto", "auto": "auto", "1": "bf16", "true": "bf16", "yes": "bf16", "0": "float32", "false": "float32", "no": "float32"}


def cpu_precision_setting() -> str:
    """$ADAPTUNE_CPU_BF16 as one of CPU_PRECISIONS: unset or "auto"; "1"/"true"/"yes" bf16; "0"/"false"/"no" float32."""
    value = os.environ.get(CPU_BF16_ENV, "").strip().lower()
    if value not in _CPU_BF16_VALUES:
        raise ValueError(f"{CPU_BF16_ENV}={value!r}: use auto (bf16 where this CPU has it natively, the default), "
                         "1 (bf16) or 0 (float32)")
    return _CPU_BF16_VALUES[value]


def cpu_bf16_env_value(precision: str) -> str:
    """The $ADAPTUNE_CPU_BF16 value that pins `precision` ("bf16" or "float32") on a pipeline's task."""
    return {"bf16": "1", "float32": "0"}[precision]
