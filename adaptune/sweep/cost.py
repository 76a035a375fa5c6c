"""The cost model: how long a planned run takes, from published or measured throughput.

`estimate_hours(run, spec, measured)` prices one run; `plan` sums them into shards, wall clock and
accelerator-hours. A run store's own measurements (adaptune.sweep.throughput) replace the table.
"""

from __future__ import annotations

import dataclasses

from adaptune.data.tasks import get_task
from adaptune.fused.grouping import (
    GROUPABLE_METHODS,
    group_capacity,
    group_key,
    trains_alone_for_its_length,
    trains_as_probe,
    trains_whole_model,
)
from adaptune.fused.settings import StepSettings
from adaptune.sweep.device_sharing import runs_per_group
from adaptune.sweep.spec import ExperimentSpec
from adaptune.sweep.throughput import REFERENCE_MAX_LENGTH, Measured, ThroughputKey, backbone_key, throughput_key
from adaptune.train.config import TrainConfig

# Training throughput in examples per second for full fine-tuning at max_length 128, batch 32,
# per backbone and accelerator (Vertex AI accelerator type, or "cpu"), for one run. These are
# ESTIMATES for planning, except where a row says it was measured (the MiniLM CPU row from the smoke
# runs, the BERT H100 rows from `make bench-gpu`; their sources: bench/LOG.md); the other rows are rough
# scalings of published BERT training throughputs. A plan given a run store's measurements
# (adaptune.sweep.throughput) uses those instead.
THROUGHPUT: dict[tuple[str, str], float] = {
    ("all-MiniLM-L6-v2", "cpu"): 7.0,
    ("bert-base-uncased", "cpu"): 1.5,
    ("bert-large-uncased", "cpu"): 0.5,
    ("all-MiniLM-L6-v2", "NVIDIA_H100_80GB"): 4000.0,
    ("bert-base-uncased", "NVIDIA_H100_80GB"): 695.0,  # measured (bench/LOG.md)
    ("bert-large-uncased", "NVIDIA_H100_80GB"): 359.0,  # measured (bench/LOG.md)
    ("all-MiniLM-L6-v2", "NVIDIA_TESLA_A100"): 2500.0,
    ("bert-base-uncased", "NVIDIA_TESLA_A100"): 600.0,
    ("bert-large-uncased", "NVIDIA_TESLA_A100"): 200.0,
    # One v5e chip (the TPU_V5E preset): about a fifth of an H100's dense bf16 FLOP/s.
    ("all-MiniLM-L6-v2", "TPU_V5_LITEPOD"): 800.0,
    ("bert-base-uncased", "TPU_V5_LITEPOD"): 200.0,
    ("bert-large-uncased", "TPU_V5_LITEPOD"): 70.0,
}
# Frozen weights need no weight gradients: a parameter-efficient step costs about 2/3 of a full one's FLOPs.
PARAMETER_EFFICIENT_STEP_COST = 0.65
# ... but where a GPU was measured, a step is bound by the host launching kernels, not by FLOPs: the
# adapter (m=64) step over the full step, both at batch 32 padded to 128 as the THROUGHPUT rows (bench/gpu.json).
MEASURED_PARAMETER_EFFICIENT_STEP_COST: dict[tuple[str, str], float] = {
    ("bert-base-uncased", "NVIDIA_H100_80GB"): 1.02,
    ("bert-large-uncased", "NVIDIA_H100_80GB"): 0.85,
}
# One run's parameter-efficient step measured at a longer length than the THROUGHPUT rows', which a length
# scaling of those rows would overprice (their 128-token steps were bound by the host, not by the tokens): BERT-large
# adapters at 384 tokens (SQuAD's), the trainer's one-run step (bench/gpu.json; a classification head stands in for
# the span head, negligible beside 24 layers). Methods of the frozen_backbone kind only: a top_k run's backward pass
# grows with its depth (top_k beyond half the layers does more than an adapter's).
MEASURED_ONE_RUN_AT_LENGTH: dict[tuple[str, str, int], float] = {
    ("bert-large-uncased", "NVIDIA_H100_80GB", 384): 385.0,  # measured (bench/LOG.md)
}
# Fused run groups on a GPU, as the H100 preset trains them (its step_settings): training examples/s of a group of
# k runs on real length-grouped GLUE batches, bf16, over this table's one-run throughput for the method's step
# (THROUGHPUT x MEASURED_PARAMETER_EFFICIENT_STEP_COST; THROUGHPUT alone for whole models), so that their product is
# the measured group's (bench/gpu.json; each figure's call in bench/LOG.md). Kinds:
# - "frozen_backbone" (adapters, LayerNorm-only, LoRA, (IA)3: a group's step launches what an adapter group's does);
# - top_k<depth> (each run's top layers stacked): a top_k run prices at the shallowest depth measured at least its
#   own (more stacked layers share less);
# - "whole_model" (full fine-tuning, top_k over every layer: no frozen part to share): stacking them did not pay, so
#   they train one a group (grouping.WHOLE_MODEL_RUNS_PER_GROUP), a group of one replayed.
# Where a figure was measured without a kernel the preset now takes, it is a floor. Between two measured sizes a
# group is priced on the line between their step times, and below the smallest at that size's step time (see
# table_fused_speedup).
FUSED_SPEEDUP: dict[str, dict[str, dict[int, float]]] = {
    "frozen_backbone": {"bert-base-uncased": {1: 6.57, 2: 7.46, 4: 7.44, 6: 7.57, 8: 7.77, 12: 7.22},
                        "bert-large-uncased": {1: 1.98, 8: 4.15}},
    "top_k1": {"bert-base-uncased": {1: 15.41, 8: 13.82}},
    "top_k3": {"bert-base-uncased": {8: 7.38}},
    "top_k6": {"bert-base-uncased": {1: 6.97, 8: 7.26}},
    "top_k11": {"bert-base-uncased": {1: 4.59, 8: 4.95}},
    "whole_model": {"bert-base-uncased": {1: 4.35, 2: 4.37, 4: 4.32}, "bert-large-uncased": {1: 3.38, 2: 3.14, 4: 3.02}},
}
# A task whose rows are mostly far shorter than its max_length, trained in length-grouped batches padded to their own
# longest row (adaptune.data.batching): the mean tokens a row is padded to, by (task, max_length, doc_stride,
# batch size), through the trainer's own features and batching (bench/squad_lengths.py;
# tests/test_calibration.py checks it against the data). The table's 128-token rows scale by it where a step is
# longer than 128: a step measured at 128 tokens was bound by its host, so at L tokens it takes at most L/128 of it
# (its GPU time grows with its tokens): an upper bound. bench/gpu_session.sh `squadtopk` measures those steps.
MEAN_PADDED_LENGTH: dict[tuple[str, int, int, int], float] = {("squad", 384, 128, 32): 185.1}
TOP_K_DEPTHS_MEASURED = sorted(int(kind.removeprefix("top_k")) for kind in FUSED_SPEEDUP if kind.startswith("top_k"))
EVALUATION_OVERHEAD = 1.1  # per-epoch validation adds roughly a tenth
# A probe (adaptune.train.probe) costs one forward pass over its rows, whatever its epochs: a forward pass is about a
# third of a full step's FLOPs. An upper bound: MiniLM's pass over the demo's 640 MRPC rows took 2.5 s on this CPU
# where the table's row prices 15 s, and a shard's other probes of the task reuse the pass.
PROBE_PASS_COST = 1 / 3
# Public GLUE / SQuAD training-set sizes, for tasks whose registry entry has no paper_sizes.
KNOWN_TRAIN_SIZES = {
    "cola": 8551, "sst2": 67349, "mrpc": 3668, "stsb": 5749, "qqp": 363846, "mnli_m": 392702,
    "mnli_mm": 392702, "qnli": 104743, "rte": 2490, "wnli": 635, "squad": 87599,
}


def planned_group_size(run: TrainConfig, spec: ExperimentSpec) -> int:
    """The largest fused group a run may train in: `runs_per_group` where it can share a forward pass (fewer
    for longer steps: group_capacity), else 1. The plan knows each run's own group (Plan.group_sizes: a
    group key's runs split evenly, so 9 runs train as 5 and 4) and prices it at that size."""
    fused = runs_per_group(spec.accelerator)
    return group_capacity(run, fused) if fused > 1 and group_key(run) is not None else 1


def table_fused_speedup(run: TrainConfig, spec: ExperimentSpec, group_size: int | None = None) -> float:
    """How much faster a run trains in its group (of `group_size`, else planned_group_size) than alone in the
    plain trainer, from FUSED_SPEEDUP, on a GPU: at its size where
    measured; between two measured sizes on the line between their step times (a step's time grows with its
    runs no faster than that line where it is launch-bound at few runs and compute-bound at many, so the line
    does not underprice); below the smallest measured size m, at m's step time (the same launches over fewer
    rows); above the largest, at the largest's speedup. 1 for a run that trains alone for its length, where
    nothing like it was measured (top_k deeper than any measured), and for a run alone where the preset does not
    replay steps as CUDA graphs."""
    size = planned_group_size(run, spec) if group_size is None else group_size
    kind = fused_kind(run)
    if spec.accelerator.family != "gpu" or kind is None or trains_alone_for_its_length(run):
        return 1.0
    if size <= 1 and not _replays_step_graphs(spec):
        return 1.0
    measured = FUSED_SPEEDUP[kind].get(backbone_key(run.backbone), {})
    if not measured:
        return 1.0
    if size in measured:
        return measured[size]
    below, above = [k for k in measured if k < size], [k for k in measured if k > size]
    if not above:
        return measured[max(below)]
    upper = min(above)
    if not below:
        return max(1.0, measured[upper] * size / upper)
    lower = max(below)
    step_lower, step_upper = lower / measured[lower], upper / measured[upper]  # in one plain run's step times
    return size / (step_lower + (size - lower) * (step_upper - step_lower) / (upper - lower))


def _replays_step_graphs(spec: ExperimentSpec) -> bool:
    """Whether the accelerator preset's tasks replay steps as CUDA graphs, a lone groupable run's too."""
    return StepSettings.preset(spec.accelerator.step_settings).step_graphs


def fused_kind(run: TrainConfig) -> str | None:
    """Which FUSED_SPEEDUP a grouped run's method prices at; None where nothing like it was measured."""
    if trains_whole_model(run):
        return "whole_model"
    if run.method["name"] == "top_k":
        depth = next((depth for depth in TOP_K_DEPTHS_MEASURED if depth >= run.method.get("k", 0)), None)
        return None if depth is None else f"top_k{depth}"
    return "frozen_backbone" if run.method["name"] in GROUPABLE_METHODS else None


def measurement_for(run: TrainConfig, spec: ExperimentSpec, measured: dict[ThroughputKey, Measured],
                    group_size: int | None = None) -> tuple[ThroughputKey, Measured] | None:
    """The store's throughput that prices this run: measured at the group size it will train in
    (`group_size`, else planned_group_size), else measured one run at a time (fusing is then not counted
    on), else none."""
    if not measured:
        return None
    for size in dict.fromkeys((planned_group_size(run, spec) if group_size is None else group_size, 1)):
        key = throughput_key(run.backbone, spec.accelerator.label, run.method, size)
        if key in measured:
            return key, measured[key]
    return None


def estimate_hours(run: TrainConfig, spec: ExperimentSpec, measured: dict[ThroughputKey, Measured] | None = None,
                   group_size: int | None = None, cpu_factor: float = 1.0) -> float:
    """Estimated accelerator-hours of one run in a group of `group_size` (else planned_group_size):
    examples x epochs / throughput, the throughput measured by the store's records where `measured` has it
    (wall time, evaluation included, shared among a fused group's runs), else THROUGHPUT (one run at a
    time, times the measured FUSED_SPEEDUP of its group on a GPU). A probe is priced at one forward pass over its
    training rows (PROBE_PASS_COST). `cpu_factor` scales the table's rates on a CPU to the machine's own
    (adaptune.sweep.cpu_calibration)."""
    factor = cpu_factor if spec.accelerator.label == "cpu" else 1.0
    task = get_task(run.task)
    train_size = task.paper_sizes[0] if task.paper_sizes else KNOWN_TRAIN_SIZES.get(task.name, 10_000)
    if run.max_train_examples:
        train_size = min(train_size, run.max_train_examples)
    if trains_as_probe(run.method, task.kind):
        full_step_throughput = table_one_run_throughput(dataclasses.replace(run, method={"name": "full"}), spec)
        return train_size * PROBE_PASS_COST / (full_step_throughput * factor) * EVALUATION_OVERHEAD / 3600
    found = measurement_for(run, spec, measured or {}, group_size)
    if found is not None:
        return train_size * run.epochs / (found[1].examples_per_s * REFERENCE_MAX_LENGTH / run.max_length) / 3600
    speedup = table_fused_speedup(run, spec, group_size)
    return train_size * run.epochs / (table_one_run_throughput(run, spec) * speedup * factor) * EVALUATION_OVERHEAD / 3600


def step_tokens(run: TrainConfig) -> float:
    """The tokens a run's step pads its rows to, on average, where measured longer than the table's 128
    (MEAN_PADDED_LENGTH), else its max_length, as the table's rows were scaled before."""
    measured = MEAN_PADDED_LENGTH.get((run.task, run.max_length, run.doc_stride, run.batch_size))
    return max(REFERENCE_MAX_LENGTH, measured) if measured is not None else run.max_length


def measured_at_length(run: TrainConfig, spec: ExperimentSpec) -> bool:
    """Whether MEASURED_ONE_RUN_AT_LENGTH prices this run alone: a frozen backbone's method at a measured length."""
    return fused_kind(run) == "frozen_backbone" and _length_key(run, spec) in MEASURED_ONE_RUN_AT_LENGTH


def _length_key(run: TrainConfig, spec: ExperimentSpec) -> tuple[str, str, int]:
    return backbone_key(run.backbone), spec.accelerator.label, run.max_length


def table_one_run_throughput(run: TrainConfig, spec: ExperimentSpec) -> float:
    """Examples/s of one run alone, from the tables: MEASURED_ONE_RUN_AT_LENGTH where it has the run (a frozen
    backbone's method), else THROUGHPUT scaled to the run's tokens a step (step_tokens) and method."""
    if measured_at_length(run, spec):
        return MEASURED_ONE_RUN_AT_LENGTH[_length_key(run, spec)]
    backbone, accelerator = backbone_key(run.backbone), spec.accelerator.label
    per_second = THROUGHPUT.get((backbone, accelerator))
    if per_second is None:  # unknown pair: assume BERT-base on this accelerator, else the CPU row
        per_second = THROUGHPUT.get(("bert-base-uncased", accelerator), THROUGHPUT[("bert-base-uncased", "cpu")])
    per_second *= REFERENCE_MAX_LENGTH / step_tokens(run)
    if run.method["name"] != "full":
        per_second /= MEASURED_PARAMETER_EFFICIENT_STEP_COST.get((backbone, accelerator), PARAMETER_EFFICIENT_STEP_COST)
    return per_second
