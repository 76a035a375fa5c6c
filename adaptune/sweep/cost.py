"""The cost model: how long a planned run takes, from published or measured throughput.

`estimate_hours(run, spec, measured)` prices one run; `plan` sums them into shards, wall clock and
accelerator-hours. A run store's own measurements (adaptune.sweep.throughput) replace the table.
"""

from __future__ import annotations

from adaptune.data.tasks import get_task
from adaptune.sweep.device_sharing import runs_per_group
from adaptune.sweep.experiments import ExperimentSpec
from adaptune.sweep.throughput import REFERENCE_MAX_LENGTH, Measured, ThroughputKey, backbone_key, throughput_key
from adaptune.train.config import TrainConfig
from adaptune.train.grouping import GROUPABLE_METHODS, group_capacity, group_key

# Training throughput in examples per second for full fine-tuning at max_length 128, batch 32,
# per backbone and accelerator (Vertex AI accelerator type, or "cpu"), for one run. These are
# ESTIMATES for planning, except where a row says it was measured: the MiniLM CPU row comes from the
# smoke runs here (full fine-tuning 12-17 examples/s at max_length 64, one thread per run, two runs
# on a busy 2-core machine, halved for max_length 128); the BERT H100 rows are `make bench-gpu`'s
# training steps on a lent H100 (bench/gpu.json, 2026-11-23: batch 32 padded to 128, bf16, one run:
# 46.0 ms and 89.2 ms a step); the other rows are rough scalings of published BERT training
# throughputs. A plan given a run store's measurements (adaptune.sweep.throughput) uses those instead.
THROUGHPUT: dict[tuple[str, str], float] = {
    ("all-MiniLM-L6-v2", "cpu"): 7.0,
    ("bert-base-uncased", "cpu"): 1.5,
    ("bert-large-uncased", "cpu"): 0.5,
    ("all-MiniLM-L6-v2", "NVIDIA_H100_80GB"): 4000.0,
    ("bert-base-uncased", "NVIDIA_H100_80GB"): 695.0,  # measured: 32 / 0.0460 s
    ("bert-large-uncased", "NVIDIA_H100_80GB"): 359.0,  # measured: 32 / 0.0892 s
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
# adapter (m=64) step over the full step, both at batch 32 padded to 128 as the THROUGHPUT rows
# (bench/gpu.json, H100 2026-11-23: 47.1 / 46.0 ms and 76.1 / 89.2 ms).
MEASURED_PARAMETER_EFFICIENT_STEP_COST: dict[tuple[str, str], float] = {
    ("bert-base-uncased", "NVIDIA_H100_80GB"): 1.02,
    ("bert-large-uncased", "NVIDIA_H100_80GB"): 0.85,
}
# Fused run groups on a GPU, as the H100 preset trains them (its step_settings: the step replayed as CUDA
# graphs, counter dropout masks, the attention kernel; bench/gpu.json "h100_2026_11_27_attention_kernel"):
# training examples/s of a group of 8 runs on 64 real length-grouped GLUE batches, bf16, over this table's
# one-run adapter throughput (THROUGHPUT x MEASURED_PARAMETER_EFFICIENT_STEP_COST), so that their product is
# the measured group's: BERT-base adapters 4,411 / 681, BERT-large 1,643 / 422. (Against the one-run step
# measured on the same machine, 669 and 337 examples/s, they are 6.6x and 4.9x: a one-run step is bound by
# its host, and hosts differ by a third; the group is bound by the device, 3,272 and 3,328 examples/s on two
# H100s without the kernel.) BERT-base top_k 3 (its top 3 layers stacked per run), measured eager only
# ("h100_2026_11_26"): 5,029 / 1,893, a floor. Groups of another size price at the largest measured size
# below theirs. A group prices as its method's kind: "frozen_backbone" (adapters, LayerNorm-only,
# LoRA, (IA)3: a group's step launches what an adapter group's does) or "top_k" (up to
# TOP_K_LAYERS_MEASURED layers: more stacked layers share less; deeper top_k is priced one run at a time).
FUSED_SPEEDUP: dict[str, dict[str, dict[int, float]]] = {
    "frozen_backbone": {"bert-base-uncased": {8: 6.48}, "bert-large-uncased": {8: 3.89}},
    "top_k": {"bert-base-uncased": {8: 2.66}},
}
TOP_K_LAYERS_MEASURED = 3
EVALUATION_OVERHEAD = 1.1  # per-epoch validation adds roughly a tenth
# Public GLUE / SQuAD training-set sizes, for tasks whose registry entry has no paper_sizes.
KNOWN_TRAIN_SIZES = {
    "cola": 8551, "sst2": 67349, "mrpc": 3668, "stsb": 5749, "qqp": 363846, "mnli_m": 392702,
    "mnli_mm": 392702, "qnli": 104743, "rte": 2490, "wnli": 635, "squad": 87599,
}


def planned_group_size(run: TrainConfig, spec: ExperimentSpec) -> int:
    """The fused group a run will train in: `runs_per_group` where it can share a forward pass (fewer for
    longer steps: group_capacity), else 1.
    (A shard's last group of a kind may be smaller; the estimate does not count on that.)"""
    fused = runs_per_group(spec.accelerator)
    return group_capacity(run, fused) if fused > 1 and group_key(run) is not None else 1


def table_fused_speedup(run: TrainConfig, spec: ExperimentSpec) -> float:
    """How much faster a run trains in its planned group than alone, from FUSED_SPEEDUP: at the largest
    measured group size that is not larger than the planned one; 1 where nothing was measured (deeper top_k,
    groups smaller than any measured, such as SQuAD's pairs)."""
    size = planned_group_size(run, spec)
    kind = fused_kind(run)
    if spec.accelerator.family != "gpu" or size <= 1 or kind is None:
        return 1.0
    measured = {k: speedup for k, speedup in FUSED_SPEEDUP[kind].get(backbone_key(run.backbone), {}).items() if k <= size}
    return measured[max(measured)] if measured else 1.0


def fused_kind(run: TrainConfig) -> str | None:
    """Which FUSED_SPEEDUP a grouped run's method prices at; None where nothing like it was measured."""
    if run.method["name"] == "top_k":
        return "top_k" if run.method.get("k", 0) <= TOP_K_LAYERS_MEASURED else None
    return "frozen_backbone" if run.method["name"] in GROUPABLE_METHODS else None


def measurement_for(run: TrainConfig, spec: ExperimentSpec, measured: dict[ThroughputKey, Measured]
                    ) -> tuple[ThroughputKey, Measured] | None:
    """The store's throughput that prices this run: measured at the group size it will train in, else
    measured one run at a time (fusing is then not counted on), else none."""
    if not measured:
        return None
    for size in dict.fromkeys((planned_group_size(run, spec), 1)):
        key = throughput_key(run.backbone, spec.accelerator.label, run.method, size)
        if key in measured:
            return key, measured[key]
    return None


def estimate_hours(run: TrainConfig, spec: ExperimentSpec, measured: dict[ThroughputKey, Measured] | None = None) -> float:
    """Estimated accelerator-hours of one run: examples x epochs / throughput, the throughput measured
    by the store's records where `measured` has it (wall time, evaluation included, shared among a fused
    group's runs), else THROUGHPUT (one run at a time, times the measured FUSED_SPEEDUP of its group on a GPU)."""
    task = get_task(run.task)
    train_size = task.paper_sizes[0] if task.paper_sizes else KNOWN_TRAIN_SIZES.get(task.name, 10_000)
    if run.max_train_examples:
        train_size = min(train_size, run.max_train_examples)
    found = measurement_for(run, spec, measured or {})
    if found is not None:
        return train_size * run.epochs / (found[1].examples_per_s * REFERENCE_MAX_LENGTH / run.max_length) / 3600
    backbone = backbone_key(run.backbone)
    per_second = THROUGHPUT.get((backbone, spec.accelerator.label))
    if per_second is None:  # unknown pair: assume BERT-base on this accelerator, else the CPU row
        per_second = THROUGHPUT.get(("bert-base-uncased", spec.accelerator.label), THROUGHPUT[("bert-base-uncased", "cpu")])
    per_second *= REFERENCE_MAX_LENGTH / run.max_length
    if run.method["name"] != "full":
        per_second /= MEASURED_PARAMETER_EFFICIENT_STEP_COST.get((backbone, spec.accelerator.label), PARAMETER_EFFICIENT_STEP_COST)
    per_second *= table_fused_speedup(run, spec)
    return train_size * run.epochs / per_second * EVALUATION_OVERHEAD / 3600
