"""The experiment spec's schema: where an experiment runs and the grid it sweeps, with the shared defaults.

An experiment is a frozen `ExperimentSpec`: where it runs (backbone, accelerator, parallelism,
retries) plus one or more `Sweep`s, each a block tasks x methods x learning rates x epochs x
seeds. Blocks exist because the paper's grids differ per method (SQuAD sweeps different learning
rates and epochs for fine-tuning and adapters) and per task (Table 4 epochs). `DEFAULTS` is what a
named experiment (adaptune.sweep.experiments) or a sweep file (adaptune.sweep.spec_file) leaves out.
Nothing here runs anything.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

from adaptune.core.backbones import BERT_BASE, DEFAULT_BACKBONE
from adaptune.core.errors import UserError
from adaptune.fused.settings import StepSettings

# `Sweep.epochs = PAPER_EPOCHS` means: the epochs the paper chose per task and method (Table 4).
PAPER_EPOCHS: Literal["paper"] = "paper"


@dataclasses.dataclass(frozen=True)
class Accelerator:
    """Where `train_shard` and `ablate_runs` run: the image family and the resources they ask for.

    `type` and `count` are Vertex AI's accelerator settings; `node_selector` and `tolerations`
    pin the task to a GKE node pool on a plain KFP cluster (kfp-kubernetes).
    """

    family: Literal["cpu", "gpu", "tpu"] = "cpu"
    type: str | None = None  # e.g. NVIDIA_H100_80GB, NVIDIA_TESLA_A100, TPU_V5_LITEPOD
    count: int = 0
    node_selector: tuple[tuple[str, str], ...] = ()  # GKE node labels (key, value)
    tolerations: tuple[str, ...] = ()  # taint keys tolerated with operator Exists, effect NoSchedule
    cpu_limit: str = "4"
    memory_limit: str = "16G"
    runs_per_group: int = 1  # runs fused into one forward pass (adaptune.train.group_loop; measured in bench/results.json)
    # On a CPU whose shard trains in float32 (no native bf16), the runs fused at once there; None: runs_per_group. The
    # plan groups and packs shards by runs_per_group either way (every machine plans the same shards); a float32 shard
    # trains each planned group's runs this many at a time (adaptune.sweep.device_sharing).
    float32_runs_per_group: int | None = None
    # The frozen backbone's precision on a CPU (adaptune.core.devices.CPU_PRECISIONS): "auto" leaves it to the
    # machine (bf16 where the CPU has it natively; $ADAPTUNE_CPU_BF16); an experiment whose records must stay
    # comparable pins "float32" (or "bf16").
    cpu_precision: str = "auto"
    # How the training step runs on this accelerator's tasks: a StepSettings' (variable, value) pairs that differ from
    # the defaults (StepSettings.pinned), set in the task's environment; the shard runner reads them under the user's own.
    step_settings: tuple[tuple[str, str], ...] = ()

    @property
    def label(self) -> str:
        """Key of the throughput table in plan.py: the accelerator type, or the family for CPUs."""
        return self.type or self.family


# 4 adapter-style runs a forward pass on a CPU with native bf16: a 4-run MiniLM sweep at 2 threads trained its steps
# 1.35x and scored 1.56x faster so than one run after another, for 4.0 GB of memory against 2.6 GB (2-core Xeon with
# AMX, bench/LOG.md 2026-12-07). In float32 (an AVX2-only CPU) the same sweep took 317 s fused 4 at a time and 318 s
# one run at a time, for 4.2 GB against 1.8 GB (2-core AMD EPYC, bench/LOG.md 2026-12-08): there, one at a time.
CPU = Accelerator(runs_per_group=4, float32_runs_per_group=1)
H100 = Accelerator(
    family="gpu",
    type="NVIDIA_H100_80GB",
    count=1,
    node_selector=(("cloud.google.com/gke-accelerator", "nvidia-h100-80gb"),),
    tolerations=("nvidia.com/gpu",),
    cpu_limit="12",
    memory_limit="96G",
    # 8 adapter-style runs per forward pass with every step setting the H100 timed faster than without it; 12 and
    # 16 runs a group were slower than 8 (bench/LOG.md, "The H100 preset's choices": the figures behind each).
    runs_per_group=8,
    step_settings=StepSettings(compile="step_graphs", dropout_masks="counter", attention="kernel", dropout="kernel", layer_norm="kernel").pinned(),
)
# KFP on GKE: a pod asking for a whole node's CPUs or memory stays Pending (the node keeps some for the
# kubelet and system pods), so each preset asks for what its smallest node leaves allocatable.
# a3-highgpu-1g (1 H100): 26 vCPU, 234 GB; a2-highgpu-1g (1 A100): 12 vCPU, 85 GB; ct5lp-hightpu-1t: 24 vCPU, 48 GB.
A100 = dataclasses.replace(
    H100,
    type="NVIDIA_TESLA_A100",
    node_selector=(("cloud.google.com/gke-accelerator", "nvidia-tesla-a100"),),
    cpu_limit="10",
    memory_limit="64G",
    runs_per_group=1,  # 40 GB: 8 BERT-large runs need 47 GiB, and no A100 has measured a group
    step_settings=(),  # nor a replayed step or the attention kernel
)
# One v5e chip (a 1x1 slice): devices.py trains on a single XLA device (no SPMD, no one process per
# chip), so a larger slice (the paper's 4 Cloud TPUs would be a 2x2) would leave chips idle and bill them.
TPU_V5E = Accelerator(
    family="tpu",
    type="TPU_V5_LITEPOD",
    count=1,
    node_selector=(
        ("cloud.google.com/gke-tpu-accelerator", "tpu-v5-lite-podslice"),
        ("cloud.google.com/gke-tpu-topology", "1x1"),
    ),
    tolerations=("google.com/tpu",),
    cpu_limit="20",
    memory_limit="40G",
    # XLA has no device generator: dropout masks are drawn by the counter hash, on the device (run_dropout.py).
    step_settings=StepSettings(dropout_masks="counter").pinned(),
    # runs_per_group stays 1: a fused group trains on XLA as its runs alone (tests/xla, on XLA's CPU device), but no
    # TPU has timed one, so nothing says it pays there.
)
ACCELERATORS = {"cpu": CPU, "h100": H100, "a100": A100, "tpu_v5e": TPU_V5E}


def method_grid(
    *,
    full: bool = False,
    adapter_sizes: tuple[int, ...] = (),
    top_k: tuple[int, ...] = (),
    layernorm: bool = False,
    head: bool = False,
    init_stds: tuple[float, ...] = (1e-2,),
    pfeiffer_sizes: tuple[int, ...] = (),
    lora_ranks: tuple[int, ...] = (),
    ia3: bool = False,
) -> tuple[dict[str, Any], ...]:
    """Method dicts (methods.py's `to_dict` shape) for a compact grid, in a fixed order; the methods
    beside the paper's take their defaults (LoRA alpha = r on query and value, (IA)3 on key, value, FFN)."""
    methods: list[dict[str, Any]] = [{"name": "full"}] if full else []
    methods += [{"name": "top_k", "k": k} for k in top_k]
    methods += [{"name": "adapters", "size": size, "init_std": std} for size in adapter_sizes for std in init_stds]
    if layernorm:
        methods.append({"name": "layernorm"})
    if head:
        methods.append({"name": "head"})
    methods += [{"name": "pfeiffer", "size": size} for size in pfeiffer_sizes]
    methods += [{"name": "lora", "r": r, "alpha": r} for r in lora_ranks]
    if ia3:
        methods.append({"name": "ia3"})
    return tuple(methods)


@dataclasses.dataclass(frozen=True)
class Sweep:
    """One block of an experiment's grid: every combination of these values is one run."""

    tasks: tuple[str, ...]
    methods: tuple[dict[str, Any], ...]
    learning_rates: tuple[float, ...]
    epochs: tuple[int, ...] | Literal["paper"] = (3,)
    seeds: tuple[int, ...] = (0,)
    backbone: str | None = None  # None: the experiment's backbone
    max_length: int | None = None  # None: TrainConfig's default (128)
    batch_size: int | None = None  # None: TrainConfig's default (32, the paper's)


@dataclasses.dataclass(frozen=True)
class Ablation:
    """Figure 6: which trained runs get their adapters switched off span by span.

    Per task, the run with the best validation score among those using `method` (and `backbone`,
    when set) is ablated.
    """

    tasks: tuple[str, ...]
    method: dict[str, Any]
    backbone: str | None = None  # None: runs of any backbone compete


@dataclasses.dataclass(frozen=True)
class ExperimentSpec:
    name: str
    description: str
    sweeps: tuple[Sweep, ...]
    backbone: str = DEFAULT_BACKBONE
    accelerator: Accelerator = CPU
    # The DAG trains shards of runs (one task, backbone and length each; shard_size runs and about
    # shard_hours estimated hours at most),
    # `parallelism` shards at once, each holding one accelerator set. plan() refuses a plan whose
    # peak exceeds max_accelerators (None: unchecked), so a sweep cannot ask for more than the quota.
    parallelism: int = 32
    shard_size: int = 16
    shard_hours: float = 4.0  # estimated hours per shard (cost.THROUGHPUT); a longer run or fused group is a shard alone
    max_accelerators: int | None = 64
    # A run's transient failures (out of memory, network, storage) retried inside its shard, and restarts of a shard's
    # lost pod (preemption) by the pipeline (adaptune.sweep.retry); a deterministic failure is a "failed" record.
    retries: int = 3
    pod_retries: int = 3
    max_train_examples: int | None = None  # subsampling for CPU-sized experiments
    max_eval_examples: int | None = None
    ablation: Ablation | None = None
    # What the experiment leaves out of the paper's grid and why; the report prints it beside the claims.
    grid_left_out: str = ""
    # True: a task whose files the data source lacks is left out when the spec is resolved against it
    # (adaptune.sweep.task_data), one line each in `tasks_left_out`, instead of failing the run; the resolved spec,
    # the one every pod re-plans, names only the tasks that were there.
    skip_tasks_without_data: bool = False
    tasks_left_out: tuple[str, ...] = ()

    @property
    def tasks(self) -> tuple[str, ...]:
        return _unique(task for sweep in self.sweeps for task in sweep.tasks)

    @property
    def learning_rates(self) -> tuple[float, ...]:
        return _unique(lr for sweep in self.sweeps for lr in sweep.learning_rates)

    @property
    def seeds(self) -> tuple[int, ...]:
        return _unique(seed for sweep in self.sweeps for seed in sweep.seeds)

    @property
    def methods(self) -> tuple[dict[str, Any], ...]:
        seen: dict[str, dict[str, Any]] = {}
        for sweep in self.sweeps:
            for method in sweep.methods:
                seen.setdefault(repr(sorted(method.items())), method)
        return tuple(seen.values())


def _unique(values: Any) -> tuple:
    return tuple(dict.fromkeys(values))


DEFAULTS = ExperimentSpec(
    name="defaults",
    description="shared defaults; every named experiment replaces some of these",
    sweeps=(),
    backbone=BERT_BASE,
    accelerator=H100,
)


class SpecError(UserError, ValueError):
    """A sweep file or spec dict is malformed; the message names the field and what is expected."""
