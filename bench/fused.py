"""Fused run groups on the CPU (part of `make bench`): operators launched per training example and
training examples per second for a group of k = 1, 4, 16 adapter runs (and top_k runs, their top layers
stacked per run), each k side by side in one run. The step settings (adaptune.fused.settings.StepSettings) are the
caller's, read once where the benchmark starts (bench.cpu); a series that varies the dropout masks' scheme
takes each scheme's form of them (StepSettings.for_masks).

Two backbones: the embedded all-MiniLM-L6-v2 (real cost on this CPU), and an overhead-bound proxy, the
same 6-layer BERT at width 32 (2 heads), where each operator's fixed cost dominates as kernel launches
do on an H100 (bench/gpu.json: a BERT-base step there takes as long at 40 tokens as at 128). The
proxy's examples/s are a proxy, not a GPU figure: they show how much per-operator overhead fusing
removes, which is what the GPU's launch-bound step pays for. Operators are counted with a
TorchDispatchMode (every aten call of forward, backward, clipping and AdamW), per training example.

Also the CPU's native bf16 (avx512_bf16): the frozen backbone's matmuls in bf16 under autocast against
float32, adapters 64 on the embedded backbone, in examples/s.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any
from unittest import mock

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import BertConfig, BertForSequenceClassification

from adaptune.core.backbones import DEFAULT_BACKBONE
from adaptune.core.devices import Device, native_cpu_bf16
from adaptune.core.precision import CPU_BF16_ENV, cpu_bf16_env_value
from adaptune.fused.run_dropout import RowLayout, dropout_stream, use_run_dropout
from adaptune.fused.run_groups import group_model, run_parameters, trained_tensors
from adaptune.fused.settings import StepSettings
from adaptune.model.backbone import load_model
from adaptune.model.methods import apply_method, method_from_dict
from adaptune.train.config import TrainConfig
from adaptune.train.group_loop import fused_step
from adaptune.train.loop import frozen_backbone_for_autocast
from adaptune.train.optimizer_step import adamw, decayed_names

GROUP_SIZES = (1, 4, 16)
# (optimizer step, dropout masks' scheme): the trainer's default, the per-run optimizer step before it, counter masks.
VARIANTS = (("per_run", "generator"), ("together", "generator"), ("together", "counter"))
ADAPTERS = {"name": "adapters", "size": 64}
# top_k's series: the top 3 of 6 layers trained, stacked per run (HFTA's way), the trainer's default variant.
TOP_K = {"name": "top_k", "k": 3}


class _CountOps(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.count += 1
        return func(*args, **(kwargs or {}))


class GroupedRun:
    """One run of a benchmark's group: its trained tensors, a config (what the group's optimizer step reads), AdamW and lr."""

    def __init__(self, params: dict[str, torch.nn.Parameter], decayed: set[str], seed: int) -> None:
        self.params = params
        # What the group's optimizer step reads of a run (lr, max_grad_norm), whatever the method trained.
        self.config = TrainConfig(task="sst2", method=ADAPTERS, lr=1e-4 * (seed + 1), seed=seed)
        self.optimizer = adamw(params, decayed, self.config.lr, 0.01)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda step: 1.0)


def _group(backbone: str, k: int, device: Device, bf16: bool = False, settings: StepSettings = StepSettings(),
           method: dict[str, Any] = ADAPTERS) -> tuple[torch.nn.Module, Any, list[GroupedRun]]:
    trained, model = [], None
    for seed in range(k):
        torch.manual_seed(seed)
        model = load_model(backbone, "classification", num_labels=2)
        apply_method(model, method_from_dict(method))
        trained.append(trained_tensors(model))
    return grouped_runs(model, trained, device, torch.bfloat16 if bf16 else None, settings)


def grouped_runs(model: torch.nn.Module, trained: list[dict[str, torch.Tensor]], device: Device,
                 frozen_dtype: torch.dtype | None, settings: StepSettings = StepSettings()) -> tuple[torch.nn.Module, Any, list[GroupedRun]]:
    """A solo model (its method applied) made a training group of one run per `trained` tensor set, on
    the device, frozen matmuls stored in `frozen_dtype` (None: as they are), each run with its own
    dropout stream (drawn with the scheme `settings` give), AdamW and lr, its layers computing as `settings`
    say (the CPU and GPU fused benchmarks' common setup, as group_loop builds a group)."""
    decayed = decayed_names(model)
    model = group_model(model, trained, settings)
    randomness = use_run_dropout(model, [dropout_stream(seed, device.torch_device, settings.dropout_masks) for seed in range(len(trained))],
                                 settings)
    model.to(device.torch_device).train()
    frozen_backbone_for_autocast(model, frozen_dtype)  # as training does
    return model, randomness, [GroupedRun(params, decayed, seed) for seed, params in enumerate(run_parameters(model))]


def _stacked(batch: dict[str, torch.Tensor], k: int) -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor, RowLayout]:
    """k runs' batches (the same rows, so every k pays for the same tokens), stacked as a group stacks them."""
    rows, length = batch["input_ids"].shape
    inputs = {name: tensor.repeat(k, 1) for name, tensor in batch.items() if name != "labels"}
    return inputs, batch["labels"].repeat(k), torch.ones(k, rows), RowLayout(rows, [rows] * k, [length] * k)


def step_fn(backbone: str, k: int, device: Device, batch: dict[str, torch.Tensor], bf16: bool = False,
             together: bool = True, settings: StepSettings = StepSettings(), method: dict[str, Any] = ADAPTERS) -> Any:
    """One eager fused step of k runs of `method` on `batch` (each run's copy of it), the group built under `settings`."""
    model, randomness, runs = _group(backbone, k, device, bf16, settings, method)
    inputs, labels, weights, layout = _stacked(batch, k)
    autocast = torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()

    def step() -> None:
        with autocast:
            fused_step(model, randomness, inputs, labels, weights, layout, "classification", runs, device, together)

    return step


def _proxy_backbone(directory: Path) -> str:
    """The embedded backbone's depth at width 32: each operator's work is tiny, its fixed cost is not."""
    config = BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=6, num_attention_heads=2, intermediate_size=64)
    torch.manual_seed(0)
    BertForSequenceClassification(config).save_pretrained(directory)
    return str(directory)


def _compare(steps: dict[Any, Any], examples: dict[Any, int], repeats: int, steps_per_timing: int) -> dict[Any, tuple[float, float]]:
    """Per variant: (examples/s, the median over `repeats` timings of `steps_per_timing` steps, the variants
    interleaved so that a noisy neighbour slows them all alike; operators per example, counted once)."""
    for step in steps.values():
        step()  # warm-up
    ops = {}
    for key, step in steps.items():
        with _CountOps() as counter:
            step()
        ops[key] = counter.count / examples[key]
    times: dict[Any, list[float]] = {key: [] for key in steps}
    for _ in range(repeats):
        for key, step in steps.items():
            started = time.perf_counter()
            for _ in range(steps_per_timing):
                step()
            times[key].append(time.perf_counter() - started)
    return {key: (examples[key] * steps_per_timing / statistics.median(times[key]), ops[key]) for key in steps}


def mask_site_kernels(group_sizes: tuple[int, ...] = GROUP_SIZES) -> dict[str, Any]:
    """How many kernels torch.compile (inductor, here its CPU backend) makes of one dropout site with
    counter-based masks (hash, mask, scale) at each k, and whether its output
    equals the eager one: what a compiled GPU step launches per site, against 2k + 1 launches for the
    generator masks' draws and copies."""
    from torch._inductor import metrics

    from adaptune.fused.run_dropout import CounterStream, RunDropout, RunRandomness

    def site(k: int) -> RunDropout:  # the trainer's own dropout module, every run's count at 0
        return RunDropout(0.1, RunRandomness([CounterStream(seed) for seed in range(k)])).train()

    kernels, equal = {}, True
    for k in group_sizes:
        x = torch.randn(k * 32, 12, 40, 40)  # a group's attention probabilities: runs x rows, heads, tokens, tokens
        torch._dynamo.reset()
        metrics.reset()
        out = torch.compile(site(k), dynamic=True)(x)
        kernels[str(k)] = metrics.generated_kernel_count
        equal = equal and torch.equal(out, site(k)(x))
    return {"counter_mask_site_compiled_kernels": kernels, "counter_mask_site_compiled_equals_eager": equal}


def measure_group_runs(data_dir: str | None, k: int = 4, settings: StepSettings = StepSettings()) -> dict[str, Any]:
    """Whole runs (`make bench`, float32): k small MRPC adapter runs trained as one group, and one after another."""
    timed = time_whole_runs(data_dir, k, WholeRuns(task="mrpc", train_rows=128, eval_rows=64, epochs=2, max_length=64), "float32",
                            settings=settings)
    return {"fused_group_runs": {"runs": k, "task": "mrpc: 128 training rows, 64 validation, 2 epochs, adapters 64, batch 32",
                                 "group_wall_s": timed["group_wall_s"], "alone_wall_s": timed["alone_wall_s"],
                                 "speedup": timed["speedup"]}}


@dataclasses.dataclass(frozen=True)
class WholeRuns:
    """The runs a whole-run timing trains: adapters 64 on `task`, batch 32, lr and seed differing."""

    task: str
    train_rows: int | None  # None: the task's whole training split
    eval_rows: int | None
    epochs: int
    max_length: int = 128

    def configs(self, k: int) -> list[TrainConfig]:
        return [TrainConfig(task=self.task, method=ADAPTERS, lr=lr, seed=seed, epochs=self.epochs, max_length=self.max_length,
                            max_train_examples=self.train_rows, max_eval_examples=self.eval_rows, batch_size=32)
                for seed, lr in zip(range(k), (3e-4, 1e-3, 3e-3, 1e-4) * k)]


# Adapter runs as glue_local trains them, on part of the training split, 1 epoch: minutes each way. CoLA's
# single sentences average 11 tokens, MRPC's pairs 53 (the embedded tokenizer).
WHOLE_RUNS_BENCH = (WholeRuns(task="cola", train_rows=1024, eval_rows=512, epochs=1),
                    WholeRuns(task="mrpc", train_rows=512, eval_rows=256, epochs=1))
WHOLE_RUNS_K = 4


def time_whole_runs(data_dir: str | None, k: int, runs: WholeRuns, precision: str, repeats: int = 1,
                    settings: StepSettings = StepSettings()) -> dict[str, Any]:
    """Wall clock of k whole runs (data preparation, model building, training, per-epoch evaluation,
    test, checkpoints) trained as one group and one after another alone, in `precision` on the CPU, their steps
    computed as `settings` say;
    with repeats > 1 in ABBA order (group, alone, alone, group, ...) so that a drifting load hits both
    alike; medians. Each run's test score too: grouped and alone must agree (bf16: to reduction order)."""
    from adaptune.train.group_loop import train_group
    from adaptune.train.loop import train_and_evaluate

    configs = runs.configs(k)
    walls: dict[str, list[float]] = {"group": [], "alone": []}
    scores: dict[str, list[float | None]] = {}
    order = [("group", "alone") if repeat % 2 == 0 else ("alone", "group") for repeat in range(repeats)]
    with tempfile.TemporaryDirectory() as tmp, _cpu_precision(precision):
        for repeat, pair in enumerate(order):
            for how in pair:
                outs = [Path(tmp) / f"{how}{repeat}" / config.run_id for config in configs]
                started = time.perf_counter()
                if how == "group":
                    records = train_group(configs, outs, data_dir=data_dir, settings=settings)
                else:
                    records = [train_and_evaluate(config, data_dir=data_dir, out_dir=out, progress=False, settings=settings)
                               for config, out in zip(configs, outs)]
                walls[how].append(time.perf_counter() - started)
                scores[how] = [(record.get("test_metrics") or {}).get(record.get("primary_metric")) for record in records]
    group, alone = statistics.median(walls["group"]), statistics.median(walls["alone"])
    differences = [abs(a - b) for a, b in zip(scores["group"], scores["alone"]) if a is not None and b is not None]
    return {"runs": k, "precision": precision, "group_wall_s": round(group, 1), "alone_wall_s": round(alone, 1),
            "speedup": round(alone / group, 2), "repeats": repeats,
            "group_walls_s": [round(wall, 1) for wall in walls["group"]], "alone_walls_s": [round(wall, 1) for wall in walls["alone"]],
            "largest_test_score_difference": round(max(differences), 4) if differences else None}


def _cpu_precision(precision: str) -> Any:
    """Pin the CPU precision (adaptune.core.precision) of the runs trained inside, as an experiment's spec does."""
    return mock.patch.dict(os.environ, {CPU_BF16_ENV: cpu_bf16_env_value(precision)})


def measure_cpu_bf16(batch: dict[str, torch.Tensor], device: Device, repeats: int, whole_runs: bool = False,
                     data_dir: str | None = None, settings: StepSettings = StepSettings()) -> dict[str, Any]:
    """One adapters-64 training step on the embedded backbone, the frozen matmuls in bf16 under autocast
    against float32, side by side, in examples/s; and, where the CPU has native bf16, groups of k such
    runs in bf16, and with `whole_runs` whole runs fused against alone in each precision (`make bench-bf16`
    measures all of this)."""
    rows = batch["input_ids"].shape[0]
    steps = settings.for_masks("generator")  # the whole runs' settings as they are; the steps' masks as before: a generator per run
    timed = _compare({"float32": step_fn(DEFAULT_BACKBONE, 1, device, batch, settings=steps),
                      "bfloat16": step_fn(DEFAULT_BACKBONE, 1, device, batch, bf16=True, settings=steps)},
                     {"float32": rows, "bfloat16": rows}, repeats, 2)
    entry: dict[str, Any] = {name: round(per_s, 1) for name, (per_s, _) in timed.items()}
    entry["speedup"] = round(entry["bfloat16"] / entry["float32"], 2)
    # The speed-up is the CPU's: native bf16 (avx512_bf16/AMX) or emulated (AVX2 only), as oneDNN dispatches.
    entry["native_bf16"] = native_cpu_bf16()
    entry["cpu_capability"] = torch.backends.cpu.get_cpu_capability()
    if entry["native_bf16"]:  # emulated, a 16-run bf16 step takes minutes, and bf16 is never the default there
        # Whether fusing pays once the backbone is bf16 (the CPU default where native): k runs in one step.
        grouped = _compare({k: step_fn(DEFAULT_BACKBONE, k, device, batch, bf16=True, settings=steps) for k in GROUP_SIZES},
                           {k: rows * k for k in GROUP_SIZES}, repeats, 1)
        entry["fused_groups_bfloat16"] = [{"k": k, "examples_per_s": round(per_s, 1), "speedup_vs_k1": round(per_s / grouped[1][0], 2)}
                                          for k, (per_s, _) in grouped.items()]
    if entry["native_bf16"] and whole_runs:
        # Whether a step's gain survives whole runs (loading, evaluation, checkpoints), on short single
        # sentences and on longer sentence pairs, in each precision: the CPU's runs_per_group rests on this.
        entry["whole_runs"] = [{"task": runs.task, "train_rows": runs.train_rows, "eval_rows": runs.eval_rows, "epochs": runs.epochs,
                                **time_whole_runs(data_dir, WHOLE_RUNS_K, runs, precision, repeats=2, settings=settings)}
                               for runs in WHOLE_RUNS_BENCH for precision in ("bf16", "float32")]
    return {"frozen_backbone_bf16_examples_per_s": entry}


def _method_series(backbone: str, name: str, proxy: bool, label: str, method: dict[str, Any], sizes: tuple[int, ...],
                   batch: dict[str, torch.Tensor], device: Device, repeats: int, settings: StepSettings) -> list[dict[str, Any]]:
    """One method's groups at these sizes in the trainer's variant, side by side: operators per example, examples/s."""
    rows = batch["input_ids"].shape[0]
    settings = settings.for_masks(VARIANTS[1][1])
    steps = {k: step_fn(backbone, k, device, batch, settings=settings, method=method) for k in sizes}
    measured = _compare(steps, {k: rows * k for k in sizes}, repeats, 3 if proxy else 1)
    return [{"k": k, "backbone": name, "proxy": proxy, "method": label, "optimizer_step": VARIANTS[1][0], "masks": VARIANTS[1][1],
             "ops_per_example": round(ops, 2), "examples_per_s": round(per_s, 1), "speedup_vs_k1": round(per_s / measured[1][0], 2)}
            for k, (per_s, ops) in measured.items()]


def measure_fused_groups(batch: dict[str, torch.Tensor], device: Device, repeats: int,
                         settings: StepSettings = StepSettings()) -> dict[str, Any]:
    """Each group size k with the group's optimizer step done for all runs at once ("together", the
    trainer's) and one run after another ("per_run", as before), and with counter-based dropout masks
    (one set of operators for all runs' masks) against one generator draw per run, side by side; the
    rest of the step as `settings` say, in each scheme's form of them."""
    rows = batch["input_ids"].shape[0]
    entries = []
    with tempfile.TemporaryDirectory() as tmp:
        backbones = {DEFAULT_BACKBONE: False, _proxy_backbone(Path(tmp) / "proxy"): True}
        for backbone, proxy in backbones.items():
            variants = [(k, optimizer, masks) for k in GROUP_SIZES for optimizer, masks in VARIANTS]
            steps = {(k, optimizer, masks): step_fn(backbone, k, device, batch, together=optimizer == "together",
                                                     settings=settings.for_masks(masks))
                     for k, optimizer, masks in variants}
            measured = _compare(steps, {variant: rows * variant[0] for variant in variants}, repeats, 3 if proxy else 1)
            name = "tiny-bert-w32 (proxy)" if proxy else DEFAULT_BACKBONE
            for (k, optimizer, masks), (per_s, ops) in measured.items():
                entries.append({"k": k, "backbone": name, "proxy": proxy, "method": "adapters64",
                                "optimizer_step": optimizer, "masks": masks, "ops_per_example": round(ops, 2),
                                "examples_per_s": round(per_s, 1),
                                "speedup_vs_k1_per_run": round(per_s / measured[(1, *VARIANTS[0])][0], 2),
                                "speedup_vs_per_run": round(per_s / measured[(k, *VARIANTS[0])][0], 2)})
            del steps
            entries += _method_series(backbone, name, proxy, f"top_k{TOP_K['k']}", TOP_K, GROUP_SIZES, batch, device, repeats, settings)
    return {"fused_groups": entries, **mask_site_kernels(), **measure_cpu_bf16(batch, device, repeats, settings=settings),
            "fused_groups_note": ("k runs of adapters 64 (and of top_k 3: the top 3 of 6 layers trained, stacked per "
                                  "run; the trainer's step) on the same SST-2 batch of "
                                  f"{rows} rows each (batch x k rows per step); optimizer_step 'together' is the group's "
                                  "multi-tensor clipping and AdamW for all runs (the trainer's), 'per_run' each run's own "
                                  "clip_grad_norm_ and AdamW in turn; masks 'generator' draws each run's dropout masks "
                                  "from its own torch.Generator, 'counter' every run's at once (a keyed hash, eager here); "
                                  "'proxy' entries are the width-32 BERT, a stand-in "
                                  "for a launch-bound GPU step, not a GPU measurement")}
