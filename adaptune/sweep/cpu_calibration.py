"""The published CPU price scaled to this machine by its own benchmark, for a plan with no store records to go by.

`make bench-peer` times a small sweep through `pipelines run` (bench/peer.json: per method, a `calibration` entry
with the runs' training rows x epochs over their own seconds, evaluation included, as a store's record is priced:
adaptune.sweep.throughput.record_rate). Where that JSON was measured on a CPU like this one (the same torch CPU
capability, the precision the plan's runs will train in, the same number of cores), the plan prices its CPU runs at
the published table's rate (adaptune.sweep.cost.THROUGHPUT) times the benchmark's measured rate over the table's
price of the benchmark's own runs, and says so; otherwise at the table alone, saying why. A store's own records,
once there, price their runs instead (throughput.measure_on): they are this sweep's, not a benchmark's.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

from adaptune.sweep.spec import ExperimentSpec


@dataclasses.dataclass(frozen=True)
class CpuCalibration:
    """How the plan's CPU price relates to the published table: `factor` (None: the table as it is) and the one line
    that says where it comes from, or why none applies."""

    factor: float | None
    basis: str


@dataclasses.dataclass(frozen=True)
class CpuIdentity:
    """What makes one CPU's timings price another's runs: torch's CPU capability, precision and cores."""

    capability: str
    precision: str
    cores: int

    def describe(self) -> str:
        return f"{self.capability}, {self.precision}, {self.cores} cores"


def this_cpu(cpu_precision: str) -> CpuIdentity:
    """This machine, training in the precision a spec's `cpu_precision` resolves to here."""
    import torch

    from adaptune.core.devices import resolved_cpu_precision

    return CpuIdentity(torch.backends.cpu.get_cpu_capability(),
                       resolved_cpu_precision(None if cpu_precision == "auto" else cpu_precision), len(os.sched_getaffinity(0)))


def calibration_from_bench(path: Path, spec: ExperimentSpec, here: CpuIdentity) -> CpuCalibration:
    """The calibration `path` (bench/peer.json) gives a CPU plan on `here`; factor None where it cannot."""
    name = f"{path.parent.name}/{path.name}"
    if not path.is_file():
        return CpuCalibration(None, f"no {name} here (make bench-peer measures this CPU)")
    try:
        bench = json.loads(path.read_text())
        measured = CpuIdentity(str(bench["cpu_capability"]), str(bench["precision"]), int(bench["cores"]))
        entries = [entry["calibration"] for entry in bench["methods"].values() if "calibration" in entry]
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        return CpuCalibration(None, f"{name} is not a bench-peer result this version reads ({error!r}): make bench-peer")
    if measured != here:
        return CpuCalibration(None, f"{name} measured another CPU ({measured.describe()}; this one: {here.describe()}): "
                                    "make bench-peer measures this one")
    if not entries:
        return CpuCalibration(None, f"{name} has no `pipelines run` timing to calibrate by: make bench-peer")
    ratios = [entry["examples_per_s"] / table_price(entry, spec) for entry in entries]
    factor = sum(ratios) / len(ratios)
    timed = ", ".join(f"{entry['method']['name']} " + (f"fused {entry['group_size']} at a time" if entry["group_size"] > 1 else
                                                        "one run at a time") + f" {entry['examples_per_s']:.1f} examples/s"
                      for entry in entries)
    fused = any(entry["group_size"] > 1 for entry in entries)
    return CpuCalibration(factor, f"scaled x{factor:.2f} to this CPU ({here.describe()}) by {name} of {bench.get('date', '?')} "
                                  f"({timed}, over the table's price of those runs; every method at the same factor"
                                  + (", so the fused groups' gain prices runs alone too)" if fused else ")"))


def table_price(entry: dict[str, Any], spec: ExperimentSpec) -> float:
    """Examples/s the published table gives a benchmark entry's runs, evaluation included (as a record is priced)."""
    from adaptune.sweep.cost import EVALUATION_OVERHEAD, table_one_run_throughput
    from adaptune.train.config import TrainConfig

    run = TrainConfig(task=str(entry["task"]), method=dict(entry["method"]), backbone=str(entry["backbone"]), max_length=int(entry["max_length"]))
    return table_one_run_throughput(run, spec) / EVALUATION_OVERHEAD
