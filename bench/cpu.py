"""`make bench`: training speed and checkpoint size, measured side by side in one process; JSON out.

    python -m bench.cpu --out bench/results.json

On the embedded backbone and real SST-2 sentences:
  - the train step time of each method on identical batches; `adapters_vs_full_step_ratio` is
    adapters (m=64) over full fine-tuning (target <= 0.75; the floor is about 2/3, since frozen
    weights need no weight gradients);
  - dynamic padding + length-grouped batches versus every batch padded to 128, in training examples
    per second (`dynamic_padding_speedup`, target >= 2.5);
  - the adapter checkpoint's size over the full fine-tuning checkpoint's;
  - fused run groups (k = 1, 4, 16 adapter runs in one forward pass: operators per example and
    examples/s, on the embedded backbone and an overhead-bound proxy) and the frozen backbone in bf16
    (bench.fused), their steps computed as the environment's step settings say (StepSettings, read once here).
BERT-base/-large on a GPU: `make bench-gpu` (bench.gpu). Repetitions are interleaved
across the variants (so drifting machine load hits all alike) and medians are reported. Not a test:
no pass/fail here.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from datasets import DatasetDict
from torch import nn
from transformers.trainer_pt_utils import get_length_grouped_indices

from adaptune.core.backbones import DEFAULT_BACKBONE
from adaptune.core.devices import Device, pick_device
from adaptune.data.batching import make_collator, model_rows, subsample
from adaptune.data.loading import load_task_data
from adaptune.data.tasks import get_task
from adaptune.data.token_cache import tokenize_task
from adaptune.fused.settings import StepSettings
from adaptune.model.backbone import load_model, load_tokenizer
from adaptune.model.checkpoint import WEIGHTS_FILE, save_task_checkpoint
from adaptune.model.methods import apply_method, method_from_dict
from adaptune.train.optimizer_step import training_step
from bench.fused import measure_cpu_bf16, measure_fused_groups, measure_group_runs
from bench.step_cost import interleaved

BATCH_SIZE = 32
PAD_LENGTH = 128
METHODS = {
    "adapters64": {"name": "adapters", "size": 64},
    "full": {"name": "full"},
    "top_k3": {"name": "top_k", "k": 3},
    "layernorm": {"name": "layernorm"},
}
Batch = dict[str, torch.Tensor]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.cpu", description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench/results.json")
    parser.add_argument("--data-dir", default=None, help="local data mirror (default: found automatically)")
    parser.add_argument("--cache-dir", default=None)
    parser.add_argument("--repeats", type=int, default=3, help="interleaved repetitions per measurement")
    parser.add_argument(
        "--threads", type=int, default=1, help="CPU threads (0: torch's default); 1 by default because on shared cores "
        "multi-threaded steps stall whenever one thread is descheduled, and timings become noise"
    )
    parser.add_argument("--only-fused", action="store_true", help="only the fused run groups and bf16 entries (make bench-fused)")
    parser.add_argument("--only-bf16", action="store_true", help="only the bf16 frozen backbone against float32 (make bench-bf16)")
    parser.add_argument("--only-data", action="store_true", help="only the time a run takes to prepare its data, per task")
    args = parser.parse_args(argv)
    settings = StepSettings.from_environment()  # read once, here: a bad setting fails before anything is measured
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    started = time.perf_counter()
    if args.only_data:
        results = data_preparation_times(args.data_dir, args.cache_dir)
    else:
        results = run_benchmark(args.data_dir, args.cache_dir, args.repeats, only_fused=args.only_fused, only_bf16=args.only_bf16,
                                settings=settings)
    results["elapsed_s"] = round(time.perf_counter() - started, 1)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps({key: value for key, value in results.items() if not isinstance(value, dict)}, indent=2))
    print(f"bench: wrote {out}", file=sys.stderr)
    return 0


def run_benchmark(data_dir: str | None, cache_dir: str | None, repeats: int, sample_size: int = 128,
                  only_fused: bool = False, only_bf16: bool = False, settings: StepSettings = StepSettings()) -> dict[str, Any]:
    # Float32 whatever the CPU's bf16 (the default where it is native): the figures stay comparable
    # across machines, and bf16 is measured beside float32 in its own entry (measure_cpu_bf16).
    device = pick_device(cpu_precision="float32")
    tokenizer = load_tokenizer(DEFAULT_BACKBONE)
    task = get_task("sst2")
    raw = load_task_data(task, data_dir, splits=("train",))
    sample = DatasetDict(train=subsample(raw["train"], sample_size))  # a seeded random sample of real sentences
    rows = model_rows(tokenize_task(task, sample, tokenizer, PAD_LENGTH, cache_dir)["train"])
    # Length grouping as in training (shuffle, sort within mega-batches); the sample is one mega-batch,
    # as a large task's 50-batch mega-batches would be, had the sample not been this small.
    order = get_length_grouped_indices(
        [len(row["input_ids"]) for row in rows], BATCH_SIZE, mega_batch_mult=len(rows) // BATCH_SIZE, generator=torch.Generator().manual_seed(0)
    )
    dynamic = make_collator(tokenizer, pad_to_multiple_of=device.pad_multiple)
    padded = make_collator(tokenizer, pad_to_length=PAD_LENGTH)
    grouped_batches = [dynamic([rows[i] for i in order[k : k + BATCH_SIZE]]) for k in range(0, len(rows), BATCH_SIZE)]
    padded_batches = [padded(rows[k : k + BATCH_SIZE]) for k in range(0, len(rows), BATCH_SIZE)]

    results: dict[str, Any] = {
        "device": device.name,
        "torch_threads": torch.get_num_threads(),
        "backbone": DEFAULT_BACKBONE,
        "task": f"sst2: {len(rows)} random train sentences",
        "batch_size": BATCH_SIZE,
        "repeats": repeats,
    }
    if only_bf16:
        return {**results, **measure_cpu_bf16(grouped_batches[0], device, repeats, whole_runs=True, data_dir=data_dir, settings=settings)}
    if only_fused:
        return {**results, **measure_fused_groups(grouped_batches[0], device, repeats, settings)}
    results.update(_method_step_times(device, grouped_batches, repeats))
    results.update(_padding_speedup(device, grouped_batches, padded_batches, repeats))
    results.update(_checkpoint_sizes())
    results.update(measure_fused_groups(grouped_batches[0], device, repeats, settings))
    results.update(measure_group_runs(data_dir, settings=settings))
    results.update(data_preparation_times(data_dir, cache_dir))
    return results


DATA_PREPARATION_TASKS = (("rte", None), ("mrpc", None), ("sst2", 8000), ("sst2", None))


def data_preparation_times(data_dir: str | None, cache_dir: str | None) -> dict[str, Any]:
    """Seconds a run spends preparing its data (every split turned into rows; the tokenized cache warm, as
    for every run after a task's first), per task: host time that every run pays, on a GPU machine too."""
    from adaptune.train.run_data import prepare_run_data

    tokenizer = load_tokenizer(DEFAULT_BACKBONE)
    times = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, rows in DATA_PREPARATION_TASKS:
            arguments = (get_task(name), tokenizer, 128, 128, rows, None)
            options = dict(data_dir=data_dir, cache_dir=cache_dir or tmp, eval_only=("validation", "test"))
            prepare_run_data(*arguments, **options)  # the task's first run: tokenizes and caches
            started = time.perf_counter()
            prepared = prepare_run_data(*arguments, **options)
            times.append({"task": name, "train_rows": len(prepared.train_rows), "seconds": round(time.perf_counter() - started, 3)})
    return {"run_data_preparation": times}


def _method_step_times(device: Device, batches: list[Batch], repeats: int) -> dict[str, Any]:
    """Median step time of each method on the same dynamically padded, length-grouped batches."""
    trainers = {label: _trainer(_build(method, device), device) for label, method in METHODS.items()}
    examples = sum(len(batch["input_ids"]) for batch in batches)
    pass_times = interleaved({label: (lambda t=trainer: _timed_pass(t, batches, device)) for label, trainer in trainers.items()}, repeats)
    step_time = {label: statistics.median(times) / len(batches) for label, times in pass_times.items()}
    return {
        "step_time_s": {label: round(t, 5) for label, t in step_time.items()},
        "train_examples_per_s": {label: round(examples / statistics.median(times), 1) for label, times in pass_times.items()},
        "mean_tokens_per_example": round(sum(int(b["attention_mask"].sum()) for b in batches) / examples, 1),
        "adapters_vs_full_step_ratio": round(step_time["adapters64"] / step_time["full"], 3),
    }


def _padding_speedup(device: Device, grouped_batches: list[Batch], padded_batches: list[Batch], repeats: int) -> dict[str, Any]:
    """Adapter training examples/s on the same rows: dynamic padding + length grouping versus padding to 128."""
    trainer = _trainer(_build(METHODS["adapters64"], device), device)
    examples = sum(len(batch["input_ids"]) for batch in grouped_batches)
    times = interleaved(
        {"dynamic_grouped": lambda: _timed_pass(trainer, grouped_batches, device), "pad128": lambda: _timed_pass(trainer, padded_batches, device)},
        repeats,
    )
    per_s = {name: examples / statistics.median(values) for name, values in times.items()}
    return {
        "padding_examples_per_s": {name: round(value, 1) for name, value in per_s.items()},
        "dynamic_padding_speedup": round(per_s["dynamic_grouped"] / per_s["pad128"], 2),
    }


def _checkpoint_sizes() -> dict[str, Any]:
    sizes = {}
    with tempfile.TemporaryDirectory() as tmp:
        for label in ("adapters64", "full"):
            model = load_model(DEFAULT_BACKBONE, "classification", num_labels=2)
            method = method_from_dict(METHODS[label])
            apply_method(model, method)
            directory = save_task_checkpoint(model, method, DEFAULT_BACKBONE, Path(tmp) / label)
            sizes[label] = (directory / WEIGHTS_FILE).stat().st_size
    return {"checkpoint_bytes": sizes, "adapters_vs_full_checkpoint_size_ratio": round(sizes["adapters64"] / sizes["full"], 4)}


def _build(method: dict[str, Any], device: Device) -> nn.Module:
    torch.manual_seed(0)
    model = load_model(DEFAULT_BACKBONE, "classification", num_labels=2)
    apply_method(model, method_from_dict(method))
    return model.to(device.torch_device)  # float32, as a run trains there: no frozen matmuls cast, no projections stacked


def _trainer(model: nn.Module, device: Device) -> Callable[[Batch], None]:
    """One training step exactly as a run takes it (adaptune.train.optimizer_step.training_step)."""
    model.train()
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=1e-5, weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)  # constant: only the cost matters

    def step(batch: Batch) -> None:
        training_step(model, batch, optimizer, scheduler, trainable, device, max_grad_norm=1.0)

    return step


def _timed_pass(step: Callable[[Batch], None], batches: list[Batch], device: Device) -> float:
    device.synchronize()
    started = time.perf_counter()
    for batch in batches:
        step({name: tensor.to(device.torch_device) for name, tensor in batch.items()})
    device.synchronize()
    return time.perf_counter() - started


if __name__ == "__main__":
    sys.exit(main())
