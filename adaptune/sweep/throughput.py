"""Training throughput measured by a run store's own records, so that a plan's cost estimate learns
from the sweep itself (a resubmission is estimated at the speed its finished runs actually had).

A record's throughput is its training rows x epochs over its wall time (`wall_time_s`: evaluation,
checkpoints and resumed attempts included, which is what an accelerator-hour estimate must cover),
scaled to REFERENCE_MAX_LENGTH tokens. A run trained in a fused group of k (adaptune.train.group_loop)
held the accelerator with k-1 others for its group's wall time: it is charged a k-th of it. Records are
grouped by (backbone, accelerator, method name, group size): adapters of every size share a row, as
their step costs differ by far less than the estimate's error; runs fused k at a time do not share a
row with runs trained alone, as their cost per run is what fusing changes. What a plan's estimate cannot use
is set aside and said (set_aside_on here: another accelerator or precision; Plan.estimate_source: another
group size than the plan's).
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter
from collections.abc import Iterable
from typing import Any

from adaptune.train.record import group_size

REFERENCE_MAX_LENGTH = 128  # throughputs are quoted at this many tokens per example
MEASURED_STATUSES = ("ok", "degenerate")  # a failed run stopped early: its time says nothing of a whole run

ThroughputKey = tuple[str, str, str, int]  # (backbone, accelerator label, method name, runs per group)


@dataclasses.dataclass(frozen=True)
class Measured:
    """Examples per second of one run at REFERENCE_MAX_LENGTH, from `runs` records."""

    examples_per_s: float
    runs: int


def backbone_key(backbone: str) -> str:
    """The throughput table's name of a backbone: the hub name without its organisation."""
    return backbone.split("/")[-1]


def throughput_key(backbone: str, accelerator_label: str, method: dict[str, Any], group_size: int = 1) -> ThroughputKey:
    return backbone_key(backbone), accelerator_label, method["name"], group_size


def accelerator_seconds(record: dict[str, Any]) -> float:
    """The record's share of its accelerator's time: its wall time, divided among the runs of its group."""
    return float(record.get("wall_time_s") or 0.0) / group_size(record)


def runs_on(device: str | None, accelerator_label: str, cpu_device: str = "cpu") -> bool:
    """Whether a record's `device` ("cpu", "cpu:bf16", "cuda:NVIDIA H100 80GB HBM3", "xla:TPU",
    adaptune.core.devices) is the accelerator a spec names (its label: "cpu", "NVIDIA_H100_80GB",
    "TPU_V5_LITEPOD"). On a CPU, `cpu_device` names the precision its runs will train in (bf16 steps
    twice as fast as float32 where native: one precision's records do not price the other's runs)."""
    if not device:
        return False
    if accelerator_label == "cpu":
        return device == cpu_device
    if accelerator_label.startswith("TPU"):
        return device.startswith("xla")
    # The GPU's model (H100, A100, L4) is the label's token that reads letters then digits.
    models = [token for token in accelerator_label.split("_") if re.fullmatch(r"[A-Z]+\d+", token)]
    return device.startswith("cuda") and any(re.search(rf"\b{model}\b", device.upper()) for model in models)


def record_rate(record: dict[str, Any]) -> tuple[float, float] | None:
    """(examples at REFERENCE_MAX_LENGTH, accelerator seconds) of a finished record, or None where it cannot tell."""
    wall = record.get("wall_time_s")
    rows = (record.get("split_sizes") or {}).get("train")
    epochs = record.get("epochs")
    if record.get("status") not in MEASURED_STATUSES or not wall or wall <= 0 or not rows or not epochs:
        return None
    max_length = (record.get("config") or {}).get("max_length") or REFERENCE_MAX_LENGTH
    return rows * epochs * max_length / REFERENCE_MAX_LENGTH, accelerator_seconds(record)


def accelerator_hours(records: Iterable[dict[str, Any]], accelerators_per_run: int) -> float:
    """Accelerator-hours the records took: their share of wall time x the accelerators each run holds."""
    return sum(accelerator_seconds(record) for record in records) / 3600 * max(accelerators_per_run, 1)


def planned_cpu_device(cpu_precision: str) -> str:
    """The `device` an experiment's CPU runs will record when trained here: its pinned `cpu_precision`'s,
    else this machine's ($ADAPTUNE_CPU_BF16, then whether the CPU multiplies bf16 natively)."""
    from adaptune.core.devices import CPU_DEVICE_NAMES, resolved_cpu_precision  # torch: only for a CPU plan

    return CPU_DEVICE_NAMES[resolved_cpu_precision(None if cpu_precision == "auto" else cpu_precision)]


def measure_throughput(records: Iterable[dict[str, Any]], accelerator_label: str,
                       cpu_device: str = "cpu") -> dict[ThroughputKey, Measured]:
    """Per (backbone, accelerator, method name, group size), the throughput of the records trained on that
    accelerator (on a CPU, in `cpu_device`'s precision: planned_cpu_device): all their examples over all
    their seconds (a long run weighs more than a short one)."""
    examples: dict[ThroughputKey, float] = {}
    seconds: dict[ThroughputKey, float] = {}
    runs: dict[ThroughputKey, int] = {}
    for record in records:
        rate = record_rate(record)
        if rate is None or not runs_on(record.get("device"), accelerator_label, cpu_device):
            continue
        key = throughput_key(record["backbone"], accelerator_label, record["method"], group_size(record))
        examples[key] = examples.get(key, 0.0) + rate[0]
        seconds[key] = seconds.get(key, 0.0) + rate[1]
        runs[key] = runs.get(key, 0) + 1
    return {key: Measured(examples[key] / seconds[key], runs[key]) for key in runs}


def measure_on(records: Iterable[dict[str, Any]], accelerator: Any) -> dict[ThroughputKey, Measured]:
    """measure_throughput for a spec's accelerator (experiments.Accelerator): its label, and on a CPU the
    precision its runs will train in."""
    cpu_device = planned_cpu_device(accelerator.cpu_precision) if accelerator.label == "cpu" else "cpu"
    return measure_throughput(records, accelerator.label, cpu_device)


def set_aside_on(records: Iterable[dict[str, Any]], accelerator: Any) -> dict[str, int]:
    """The finished records measure_on leaves out because they trained on another accelerator or in another
    precision than a spec's runs will, counted by why ("trained on cpu:bf16, not cpu"), for the plan to say."""
    label = accelerator.label
    cpu_device = planned_cpu_device(accelerator.cpu_precision) if label == "cpu" else "cpu"
    planned = cpu_device if label == "cpu" else label
    reasons: Counter[str] = Counter()
    for record in records:
        if record_rate(record) is not None and not runs_on(record.get("device"), label, cpu_device):
            reasons[f"trained on {record.get('device') or 'an unrecorded device'}, not {planned}"] += 1
    return dict(sorted(reasons.items()))
