"""`make bench-gpu`: BERT-base and BERT-large training speed on a CUDA GPU, step variants compared; JSON out.

    python -m adaptune.bench.gpu --out bench/gpu.json [--data-dir DIR] [--tokenizer DIR] [--variants before,now,preset]

Randomly initialised BERT-base and BERT-large (speed does not depend on the weights) at the paper's
batch of 32 and max length 128, on real batches: GLUE training sentences (CoLA, SST-2, MRPC, RTE)
tokenized with BERT's uncased WordPiece vocabulary (the embedded MiniLM's), length-grouped and
dynamically padded to a multiple of 8 exactly as training does, plus the same rows padded to 128.
For full fine-tuning and adapters (m=64): tokens/s, model FLOP utilisation (MFU: the model's
training FLOPs over time, against the GPU's dense bf16 peak), peak memory, and the adapters/full
step-time ratio. Step variants, timed with interleaved repetitions (medians):
  - `before`: the step as it was: float32 frozen weights (autocast re-casts them every step),
    AdamW's multi-tensor kernels, two host syncs per step;
  - `now`: adaptune.train.loop's step: frozen matmuls stored in bf16, fused AdamW, no host sync;
  - `preset`: `now` with the trainer's run dropout under the step settings of this process's environment
    (StepSettings.from_environment, read once at the start), as a pipeline task trains a run alone.
Then the fused groups (adaptune.bench.gpu_fused), each variant's StepSettings made from the --fused-* flags, and sweep
throughput: one realistic shard trained one run at a time and fused g runs per group on the one GPU (`shard_throughput`,
its runs' settings read from the environment under the H100 preset as run_shard reads them), runs finished per hour and
how far each result moved.
Not a test: no pass/fail here.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import itertools
import json
import math
import re
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from adaptune.bench.cpu import _interleaved
from adaptune.bench.squad_lengths import batches_at_lengths, read_padded_lengths, write_squad_lengths
from adaptune.bench.step_cost import timed_pass, training_flops
from adaptune.core.devices import Device, pick_device
from adaptune.fused.settings import LAYER_SETTINGS, VALUES, StepSettings
from adaptune.train import phase_times

BATCH_SIZE = 32
MAX_LENGTH = 128
SQUAD_LENGTH = 384  # the paper's SQuAD windows (max_length 384, doc stride 128)
SQUAD_LENGTHS_FILE = ".devcarry/squad_lengths.json"  # make gpu-carry
TASKS = ("cola", "sst2", "mrpc", "rte")
BATCHES_PER_TASK = 16
CUDA_PAD_MULTIPLE = 8  # adaptune.core.devices.Device.pad_multiple on a GPU
SAMPLE_ROWS = 8192  # per task: a seeded random sample, many length-grouped mega-batches of 50 batches


@dataclass(frozen=True)
class Scale:
    """The backbones' shapes and how many real rows feed them: the paper's, or a rehearsal's."""

    configs: dict[str, dict[str, int]]
    sample_rows: int
    batches_per_task: int
    shard_train_rows: int | None = None  # None: the option's value


CONFIGS = {
    "bert-base": {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 3072},
    "bert-large": {"hidden_size": 1024, "num_hidden_layers": 24, "num_attention_heads": 16, "intermediate_size": 4096},
}
FULL_SCALE = Scale(CONFIGS, SAMPLE_ROWS, BATCHES_PER_TASK)
# Every part on this machine (the CPU too) in a minute or two: a check that the benchmark runs before a
# lent GPU's minutes go to it; its figures measure nothing.
# 12 layers, as BERT-base: every top_k depth a part asks for exists.
_TINY = {"hidden_size": 32, "num_hidden_layers": 12, "num_attention_heads": 2, "intermediate_size": 64}
REHEARSAL = Scale({name: _TINY for name in CONFIGS}, sample_rows=256, batches_per_task=2, shard_train_rows=32)
METHODS = {"full": {"name": "full"}, "adapters64": {"name": "adapters", "size": 64},
           **{f"top_k{depth}": {"name": "top_k", "k": depth} for depth in (1, 3, 6, 11, 12)}}
# Dense bf16 tensor-core peaks (FLOP/s) from the vendors' data sheets, matched on the device name.
PEAK_BF16_FLOPS = (
    ("H200", 989e12),
    ("H100 PCIe", 756e12),
    ("H100", 989e12),
    ("A100", 312e12),
    ("L40S", 362e12),
    ("L4", 121e12),
    ("A10G", 70e12),
    ("A10", 125e12),
)
Batch = dict[str, torch.Tensor]
VARIANTS = ("before", "now", "preset")  # the solo step's (the module docstring's)


# bench-gpu's --fused-<field> flags, one per layer setting (adaptune.fused.settings.LAYER_SETTINGS): their values.
_LAYER_SETTING_FLAGS = {
    "attention": "eager, kernel (adaptune.fused.kernels.attention: counter masks drawn inside one attention kernel; groups drawing "
                 "generator masks stay eager)",
    "dropout": "mask, kernel (adaptune.fused.kernels.dropout: each hidden-state dropout site's counter mask drawn and applied in one "
               "kernel; groups drawing generator masks apply masks)",
    "layer_norm": "torch (the runs' trained LayerNorms with torch's operators), kernel (adaptune.fused.kernels.layer_norm: each run's "
                  "LayerNorm in one kernel each way)",
}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m adaptune.bench.gpu", description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench/gpu.json")
    parser.add_argument("--data-dir", default=None, help="local data mirror (default: found automatically)")
    parser.add_argument("--tokenizer", default=None, help="a BERT uncased tokenizer (default: the embedded MiniLM's)")
    parser.add_argument("--backbones", default=",".join(CONFIGS), help=f"comma-separated, of {', '.join(CONFIGS)}")
    parser.add_argument("--variants", default="before,now", help="comma-separated, of before, now, preset (now with the trainer's "
                        "run dropout, so that the step settings in the environment reach it as in a pipeline task)")
    parser.add_argument("--methods", default="full,adapters64", help=f"the solo step's methods, comma-separated, of {', '.join(METHODS)}")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch-sets", default="length_grouped,padded_128",
                        help="the solo step's batches, comma-separated: as --fused-batch-sets")
    parser.add_argument("--shard", default="1", help="1: train the shard one run at a time first, the baseline (empty: skip)")
    parser.add_argument("--shard-groups", default="4,16", help="runs fused per group to compare on the same shard, comma-separated; "
                        "empty: skip")
    parser.add_argument("--fused", default="1,4,8,16", help="group sizes of the fused step to measure (empty: skip)")
    parser.add_argument("--fused-methods", default="adapters64,layernorm",
                        help="comma-separated, of adapters64, layernorm, top_k1, top_k3, top_k6, top_k11, top_k12, full")
    parser.add_argument("--fused-optimizer", default="together,per_run",
                        help="the fused step's optimizer steps to compare: together (the trainer's), per_run")
    parser.add_argument("--fused-masks", default="generator,counter",
                        help="the fused step's dropout mask schemes to compare: generator (the default), counter")
    parser.add_argument("--fused-batch-sets", default="length_grouped",
                        help="the fused step's batches, comma-separated, of length_grouped, padded_128 (the latter: MFU at full length), "
                             "padded_384 (SQuAD's longest step), squad_lengths (SQuAD's own batch lengths, where --squad-lengths is), "
                             "tokens_<L> (every step L tokens, all attended)")
    parser.add_argument("--fused-compile", default="eager",
                        help="comma-separated, of eager, step_graphs (the whole step as CUDA graphs, counter masks only: groups "
                             "drawing generator masks stay eager)")
    for field in LAYER_SETTINGS:  # --fused-attention, --fused-dropout, --fused-layer-norm: a flag for every layer setting
        parser.add_argument(f"--fused-{field.replace('_', '-')}", default=VALUES[field][0],
                            help=f"comma-separated, of {_LAYER_SETTING_FLAGS[field]}")
    parser.add_argument("--attention-check", default="", help="group sizes at which to check that the attention kernel computes "
                        "what eager attention does (one call: mask bits, output, gradients; a group trained both ways), first fused "
                        "method, first --fused-compile mode (empty: skip)")
    parser.add_argument("--dropout-check", default="", help="group sizes at which to check that the dropout kernel computes what "
                        "the masks do (calls: mask bits, values, gradients; a group trained both ways), first fused method, first "
                        "--fused-compile mode, first --fused-attention mode (empty: skip)")
    parser.add_argument("--layer-norm-check", default="", help="group sizes at which to check that the grouped LayerNorm kernel "
                        "computes what torch's operators do (calls; a group trained both ways), first fused method, first --fused-compile, "
                        "--fused-attention and --fused-dropout modes (empty: skip)")
    parser.add_argument("--graph-check", default="", help="group sizes at which to check that the step replayed as CUDA graphs "
                        "(step_graphs) trains as it does uncaptured, first fused method (empty: skip)")
    parser.add_argument("--fused-profile", default="", help="group sizes at which to profile the fused step of the first fused "
                        "method (empty: skip): kernels per step, the device's busy share, the heaviest operators")
    parser.add_argument("--shard-tasks", default="rte", help="the shard's tasks, comma-separated (the issue's realistic shard: "
                        "rte,mrpc,cola; .devcarry/data holds them and SST-2)")
    parser.add_argument("--shard-methods", default="adapters64", help="the shard's methods, comma-separated, of the fused "
                        "methods (adapters64, layernorm, ...)")
    parser.add_argument("--shard-train-rows", type=int, default=None,
                        help="the shard's training rows per run (default: all of RTE's 2,490): fewer fit a short GPU lease")
    parser.add_argument("--shard-host-profile", type=int, default=0, metavar="N",
                        help="profile each shard attempt's host with cProfile and keep its N heaviest functions by cumulative and "
                             "by own time (0: none): what a group's eager steps, captures and saves spend; the attempt's seconds then "
                             "carry cProfile's overhead")
    parser.add_argument("--batches-cache", default=None,
                        help="a file to keep the tokenized batches in: read if there, else written (saves re-tokenizing per call)")
    parser.add_argument("--write-batches", default=None, metavar="PATH",
                        help="only tokenize the batches, padded as on a CUDA device, into PATH (make gpu-carry: no device minutes spent on it)")
    parser.add_argument("--squad-lengths", default=SQUAD_LENGTHS_FILE,
                        help="SQuAD's padded batch lengths (make gpu-carry writes them): the `squad_lengths` batch set, where the file is")
    parser.add_argument("--write-squad-lengths", default=None, metavar="PATH",
                        help="only write one epoch's padded batch lengths of a SQuAD run from the local data into PATH (make gpu-carry)")
    parser.add_argument("--rehearse", action="store_true",
                        help="every part on this machine (the CPU too) with a 12-layer width-32 BERT and few rows: a check that the "
                             "benchmark runs, before a lent GPU's minutes go to it; its figures measure nothing")
    args = parser.parse_args(argv)
    for flag, field in (("--fused-masks", "dropout_masks"), ("--fused-compile", "compile"), *((f"--fused-{field.replace('_', '-')}", field)
                                                                                           for field in LAYER_SETTINGS)):
        wrong = [name for name in _names(getattr(args, flag[2:].replace("-", "_"))) if name not in VALUES[field]]
        if wrong:
            parser.error(f"{flag}: {', '.join(wrong)} not one of {', '.join(VALUES[field])}")
    if any(variant not in VARIANTS for variant in _names(args.variants)):
        parser.error(f"--variants: use some of {', '.join(VARIANTS)}")
    device = pick_device()
    if args.write_squad_lengths:
        written = write_squad_lengths(args.write_squad_lengths, args.data_dir, args.tokenizer, CUDA_PAD_MULTIPLE)
        print(json.dumps({key: value for key, value in written.items() if key != "padded_lengths"}), file=sys.stderr)
        return 0
    if args.write_batches:
        batch_sets = cached_batches(args.write_batches, args.data_dir, args.tokenizer, device, pad_multiple=CUDA_PAD_MULTIPLE)
        print(json.dumps({name: describe(batches) for name, batches in batch_sets.items()}), file=sys.stderr)
        return 0
    settings = StepSettings.from_environment()  # the `preset` variant's, read once here: a bad setting fails before anything runs
    scale = REHEARSAL if args.rehearse else FULL_SCALE
    if args.rehearse:  # one thread: beside a busy process, two OpenMP threads on 2 cores ran a fused step 60x slower
        torch.set_num_threads(1)
    if device.kind != "cuda" and not args.rehearse:
        print("bench_gpu: no CUDA device here; `make bench` measures the CPU (or --rehearse checks this benchmark's flow)", file=sys.stderr)
        return 2
    started = time.perf_counter()
    variants = _names(args.variants)  # none: the solo step is not measured
    needs_batches = bool(variants or args.fused or _counts(args.fused_profile) or _counts(args.graph_check)
                         or _counts(args.attention_check) or _counts(args.dropout_check)
                         or _counts(args.layer_norm_check))  # the shard tokenizes its own task
    batch_sets = cached_batches(args.batches_cache, args.data_dir, args.tokenizer, device, scale,
                                squad_lengths=args.squad_lengths) if needs_batches else {}
    batch_sets.update(fixed_length_sets([*_names(args.batch_sets), *_names(args.fused_batch_sets)], batch_sets))
    results: dict[str, Any] = {
        "device": device.name,
        "torch": torch.__version__,
        "peak_bf16_flops": peak_flops(device),
        "batch_size": BATCH_SIZE,
        "max_length": MAX_LENGTH,
        "batches": {name: describe(batches) for name, batches in batch_sets.items()},
        "repeats": args.repeats,
        "runs": [],
        **({"rehearsal": "a 12-layer width-32 BERT on few rows: a check of the flow, not a measurement"} if args.rehearse else {}),
    }
    log(f"batches ready after {time.perf_counter() - started:.0f} s")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)

    def save() -> None:  # after every measurement: a cut-off run keeps what it measured
        results["elapsed_s"] = round(time.perf_counter() - started, 1)
        out.write_text(json.dumps(results, indent=2) + "\n")

    for backbone in args.backbones.split(",") if variants else ():
        for batches_name in args.batch_sets.split(","):
            for method in _names(args.methods):
                results["runs"] += measure(scale.configs[backbone], backbone, method, batches_name, batch_sets[batches_name], variants, device,
                                           args.repeats, settings)
                results["summary"] = summarize(results["runs"])
                save()
                log(f"{backbone} {method} {batches_name}: "
                    + ", ".join(f"{r['variant']} {r['step_ms']} ms MFU {r['mfu']}" for r in results["runs"][-len(variants):]))
    if args.fused:
        from adaptune.bench.gpu_fused import measure_fused

        results["fused"] = []

        def keep(row: dict[str, Any]) -> None:
            results["fused"].append(row)
            save()
            log(f"fused {row['backbone']} {row['method']} {row['batches']} k={row['k']} {row['optimizer_step']} {row['masks']} {row['compile']} "
                + " ".join(f"{field} {row[field]}" for field in LAYER_SETTINGS) + ": "
                f"{row.get('examples_per_s', row.get('error'))} ex/s, MFU {row.get('mfu')}, peak {row.get('peak_gib')} GiB")

        for backbone, method, batches_name in itertools.product(args.backbones.split(","), args.fused_methods.split(","),
                                                                _names(args.fused_batch_sets)):
            rows = measure_fused(scale.configs[backbone], backbone, method, batch_sets[batches_name], _counts(args.fused), device,
                                 args.repeats, peak_flops(device), optimizer_steps=_names(args.fused_optimizer),
                                 mask_schemes=_names(args.fused_masks), compile_modes=_names(args.fused_compile), on_row=keep,
                                 task_count=len(TASKS), batches_name=batches_name,
                                 layer_settings={field: _names(getattr(args, f"fused_{field}")) for field in LAYER_SETTINGS})
            save()  # `keep` holds the same rows, now with their speedups against k = 1
            log(f"{backbone} {method} {batches_name} fused: " + ", ".join(
                f"k={r['k']} {r['optimizer_step']} {r['masks']} {r['compile']} {r.get('examples_per_s', r.get('error'))} ex/s MFU {r.get('mfu')}"
                for r in rows))
    if _counts(args.graph_check):
        from adaptune.bench.gpu_fused import check_step_graphs

        results["step_graphs_check"] = []
        for backbone in args.backbones.split(","):
            for k in _counts(args.graph_check):
                row = check_step_graphs(scale.configs[backbone], backbone, _names(args.fused_methods)[0], batch_sets["length_grouped"], k,
                                        device, task_count=len(TASKS))
                results["step_graphs_check"].append(row)
                save()
                log(f"step graphs check {backbone} k={k}: graphs {row['graphs']}, eager {row['eager']}")
    first = {field: (_names(getattr(args, f"fused_{field}")) or VALUES[field])[0] for field in LAYER_SETTINGS}  # each layer flag's first value

    def run_checks(name: str, counts: list[int], check: Callable[..., dict[str, Any]], describe: Callable[[dict[str, Any]], str],
                   **held: str) -> None:
        """A kernel's check at each group size and backbone: the first fused method, counter masks, the first --fused-compile
        mode and the `held` layer settings (the kernels checked before it, as the call gives them), the rest at their defaults."""
        settings = StepSettings(compile=_names(args.fused_compile)[0], dropout_masks="counter", **held)
        results[name] = []
        for backbone in args.backbones.split(","):
            for k in counts:
                row = check(scale.configs[backbone], backbone, _names(args.fused_methods)[0], batch_sets["length_grouped"], k, device,
                            task_count=len(TASKS), settings=settings)
                results[name].append(row)
                save()
                log(f"{name} {backbone} k={k}: {describe(row)}")

    if _counts(args.attention_check):
        from adaptune.bench.gpu_fused import check_attention_kernel

        run_checks("attention_check", _counts(args.attention_check), check_attention_kernel,
                   lambda row: f"one call {row['attention_call']}, trained {row['kernel']}, {row['kernel_calls']} kernel calls")
    if _counts(args.dropout_check):
        from adaptune.bench.gpu_fused import check_dropout_kernel

        run_checks("dropout_check", _counts(args.dropout_check), check_dropout_kernel,
                   lambda row: f"calls {row['dropout_call']}, trained {row['kernel']}, {row['dropout_kernel_calls']} kernel launches",
                   attention=first["attention"])
    if _counts(args.layer_norm_check):
        from adaptune.bench.gpu_fused import check_layer_norm_kernel

        run_checks("layer_norm_check", _counts(args.layer_norm_check), check_layer_norm_kernel,
                   lambda row: f"calls {row['layer_norm_call']}, trained {row['kernel']}, "
                               f"{row['layer_norm_kernel_calls']} + {row['layer_norm_backward_calls']} kernel launches",
                   attention=first["attention"], dropout=first["dropout"])
    if _counts(args.fused_profile):
        from adaptune.bench.gpu_fused import group_settings, profile_fused

        profiled = group_settings(_names(args.fused_masks)[0], _names(args.fused_compile)[0], **first)  # each flag's first value
        results["fused_profile"] = []
        for backbone in args.backbones.split(","):
            for k in _counts(args.fused_profile):
                row = profile_fused(scale.configs[backbone], backbone, _names(args.fused_methods)[0], batch_sets["length_grouped"], k, device,
                                    settings=profiled, task_count=len(TASKS))
                results["fused_profile"].append(row)
                save()
                log(f"profile {backbone} k={k}: {row['step_ms']} ms a step, {row['kernels_per_step']} kernels, "
                    f"device busy {row['device_busy_share']}, heaviest {row['top'][0]['name']}")
    if args.shard or args.shard_groups:
        import tempfile

        from adaptune.bench.gpu_fused import FUSED_METHODS

        with tempfile.TemporaryDirectory() as work:
            def keep_shard(shard: dict[str, Any]) -> None:
                results["shard"] = shard
                save()

            rows = scale.shard_train_rows or args.shard_train_rows
            shard_throughput(args.data_dir, args.tokenizer or _embedded_tokenizer_dir(), bool(_counts(args.shard)), Path(work),
                             group_sizes=_group_attempts(args.shard_groups), max_train_examples=rows, on_attempt=keep_shard,
                             config=scale.configs["bert-base"], tasks=_names(args.shard_tasks),
                             methods=[FUSED_METHODS[name] for name in _names(args.shard_methods)],
                             host_profile=args.shard_host_profile)
    print_table(results["runs"])
    print(json.dumps({"summary": results.get("summary"), "shard": results.get("shard")}, indent=2))
    print(f"bench_gpu: wrote {out}", file=sys.stderr)
    return 0


def cached_batches(cache: str | None, data_dir: str | None, tokenizer_name: str | None, device: Device, scale: Scale = FULL_SCALE,
                   pad_multiple: int | None = None, squad_lengths: str | None = None) -> dict[str, list[Batch]]:
    """real_batches, kept in `cache` (a torch file) when one is named: the same batches for every call; and
    "padded_384", the padded rows padded on to SQuAD's 384 tokens, and where the file `squad_lengths` is,
    "squad_lengths", the padded rows cut or padded to SQuAD's own batch lengths (adaptune.bench.squad_lengths;
    both made on loading, never cached)."""
    if cache and Path(cache).is_file():
        batch_sets = {name: [{k: v.to(device.torch_device) for k, v in b.items()} for b in batches]
                      for name, batches in torch.load(cache, weights_only=True).items()}
    else:
        batch_sets = real_batches(data_dir, tokenizer_name, device, scale, pad_multiple)
        if cache:
            torch.save({name: [{k: v.cpu() for k, v in b.items()} for b in batches] for name, batches in batch_sets.items()}, cache)
    padded_lengths = read_padded_lengths(squad_lengths) if squad_lengths else None
    squad = {"squad_lengths": batches_at_lengths(batch_sets["padded_128"], padded_lengths)} if padded_lengths else {}
    return {**batch_sets, "padded_384": padded_on(batch_sets["padded_128"], SQUAD_LENGTH), **squad}


def fixed_length_sets(names: Sequence[str], batch_sets: dict[str, list[Batch]]) -> dict[str, list[Batch]]:
    """The `tokens_<L>` batch sets named: every step of padded_128's rows cut or padded to L tokens, every position
    attended, so that a step's time can be read against its tokens alone (a device-bound step grows with them)."""
    wanted = [name for name in names if re.fullmatch(r"tokens_\d+", name)]
    if not wanted or "padded_128" not in batch_sets:
        return {}
    return {name: batches_at_lengths(batch_sets["padded_128"], [int(name.removeprefix("tokens_"))]) for name in wanted}


def padded_on(batches: list[Batch], length: int) -> list[Batch]:
    """The batches padded with zeros (BERT's [PAD] id, no attention, segment 0) to `length` tokens: at 384, SQuAD's
    longest step (its windows are mostly far shorter: `squad_lengths`) on the same real rows, for its speed and memory."""
    return [{name: torch.nn.functional.pad(tensor, (0, length - tensor.shape[1])) if tensor.dim() == 2 else tensor
             for name, tensor in batch.items()} for batch in batches]


def real_batches(data_dir: str | None, tokenizer_name: str | None, device: Device, scale: Scale = FULL_SCALE,
                 pad_multiple: int | None = None) -> dict[str, list[Batch]]:
    """Length-grouped, dynamically padded batches of real training rows (as training draws them, to the
    device's pad multiple or `pad_multiple`), and the same rows padded to MAX_LENGTH."""
    from datasets import DatasetDict

    from adaptune.core.backbones import DEFAULT_BACKBONE
    from adaptune.data.batching import epoch_batches, make_collator, model_rows, subsample
    from adaptune.data.loading import load_task_data, tokenize_task
    from adaptune.data.tasks import get_task
    from adaptune.model.backbone import load_tokenizer

    tokenizer = load_tokenizer(tokenizer_name or DEFAULT_BACKBONE)
    dynamic = make_collator(tokenizer, pad_to_multiple_of=pad_multiple or device.pad_multiple)
    padded = make_collator(tokenizer, pad_to_length=MAX_LENGTH)
    grouped, fixed = [], []
    generator = torch.Generator().manual_seed(0)
    for name in TASKS:
        task = get_task(name)
        raw = subsample(load_task_data(task, data_dir, splits=("train",))["train"], scale.sample_rows)
        rows = model_rows(tokenize_task(task, DatasetDict(train=raw), tokenizer, MAX_LENGTH, None)["train"])
        order = epoch_batches([len(row["input_ids"]) for row in rows], BATCH_SIZE, seed=0, epoch=0)
        order = [b for b in order if len(b) == BATCH_SIZE]
        for index in torch.randperm(len(order), generator=generator)[: scale.batches_per_task].tolist():
            chosen = [rows[i] for i in order[index]]
            grouped.append(dynamic(chosen))
            fixed.append(padded(chosen))
        log(f"{name}: {len(rows)} rows tokenized")
    move = lambda batches: [{k: v.to(device.torch_device) for k, v in b.items()} for b in batches]  # noqa: E731
    return {"length_grouped": move(grouped), "padded_128": move(fixed)}


def describe(batches: list[Batch]) -> dict[str, Any]:
    computed = sum(b["input_ids"].numel() for b in batches)
    real = sum(int(b["attention_mask"].sum()) for b in batches)
    return {"count": len(batches), "tasks": list(TASKS), "real_tokens": real, "computed_tokens": computed,
            "mean_padded_length": round(computed / len(batches) / BATCH_SIZE, 1)}


def measure(config: dict[str, int], backbone: str, method: str, batches_name: str, batches: list[Batch], variants: list[str], device: Device,
            repeats: int, settings: StepSettings = StepSettings()) -> list[dict]:
    """Each solo step variant on the batches, interleaved; `settings` are the `preset` variant's."""
    rows = []
    steps = {variant: build_step(config, method, variant, device, settings) for variant in variants}
    times = _interleaved({v: (lambda s=step: timed_pass(s, batches, device)) for v, (step, _, _) in steps.items()}, repeats)
    for variant, (step, model, optimizer) in steps.items():
        seconds = statistics.median(times[variant])
        flops = sum(training_flops(model, b) for b in batches)
        rows.append({
            "backbone": backbone, "method": method, "variant": variant, "batches": batches_name,
            "step_ms": round(1000 * seconds / len(batches), 2),
            "real_tokens_per_s": round(sum(int(b["attention_mask"].sum()) for b in batches) / seconds),
            "computed_tokens_per_s": round(sum(b["input_ids"].numel() for b in batches) / seconds),
            "model_tflops_per_s": round(flops / seconds / 1e12, 1),
            "mfu": round(flops / seconds / peak_flops(device), 3) if peak_flops(device) else None,
            **memory_gib(step, model, optimizer, batches, device),
        })
    del steps
    gc.collect()
    torch.cuda.empty_cache()
    return rows


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def build_step(config: dict[str, int], method: str, variant: str, device: Device, settings: StepSettings = StepSettings()
               ) -> tuple[Callable[[Batch], None], nn.Module, Any]:
    """A solo step `variant` (the module docstring's), `preset` with the trainer's run dropout under `settings`."""
    from transformers import BertConfig, BertForSequenceClassification

    from adaptune.fused.run_dropout import dropout_stream, use_run_dropout
    from adaptune.model.methods import apply_method, method_from_dict
    from adaptune.train.loop import _adamw, frozen_backbone_for_autocast, training_step

    torch.manual_seed(0)
    with device.torch_device:  # initialised on the GPU: seconds, not a minute of CPU per BERT-large
        model = BertForSequenceClassification(BertConfig(**config, num_labels=2, attn_implementation="sdpa"))
        apply_method(model, method_from_dict(METHODS[method]))
    if variant == "preset":  # the trainer's dropout, as loop.py sets it: its scheme and kernels from the step settings
        use_run_dropout(model, [dropout_stream(0, device.torch_device, settings.dropout_masks)], settings)
    model.to(device.torch_device).train()
    trainable = [p for p in model.parameters() if p.requires_grad]
    if variant == "before":
        optimizer = torch.optim.AdamW(trainable, lr=1e-5, weight_decay=0.01, foreach=True)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
        return (lambda batch: _step_before(model, batch, optimizer, scheduler, trainable, device)), model, optimizer
    frozen_backbone_for_autocast(model, device.autocast_dtype)  # as the trainer does
    optimizer = _adamw(model, 1e-5, 0.01)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    return (lambda batch: training_step(model, batch, optimizer, scheduler, trainable, device, 1.0)), model, optimizer


def memory_gib(step: Callable[[Batch], None], model: nn.Module, optimizer: Any, batches: list[Batch], device: Device) -> dict[str, float]:
    """This variant's own memory, though other variants' models share the GPU: weights and optimizer
    state by their tensors, plus the peak a pass adds on top (activations, gradients, workspaces)."""
    tensors = [*model.parameters(), *(t for state in optimizer.state.values() for t in state.values() if torch.is_tensor(t))]
    static = sum(t.numel() * t.element_size() for t in tensors)
    if device.kind != "cuda":
        return {"weights_and_optimizer_gib": round(static / 2**30, 2), "peak_gib": None}
    device.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    for batch in batches:
        step(batch)
    device.synchronize()
    transient = torch.cuda.max_memory_allocated() - before
    return {"weights_and_optimizer_gib": round(static / 2**30, 2), "peak_gib": round((static + transient) / 2**30, 2)}


def _step_before(model: nn.Module, batch: Batch, optimizer: Any, scheduler: Any, trainable: list[nn.Parameter], device: Device) -> None:
    """adaptune.train.loop.training_step as it was before the GPU work: two host syncs per step."""
    with device.autocast():
        loss = model(**batch).loss
    if not math.isfinite(float(loss.detach())):
        raise RuntimeError("non-finite loss")
    loss.backward()
    if not math.isfinite(float(torch.nn.utils.clip_grad_norm_(trainable, 1.0))):
        raise RuntimeError("non-finite gradient norm")
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)


def peak_flops(device: Device) -> float | None:
    if device.kind != "cuda":
        return None
    name = torch.cuda.get_device_name(device.torch_device)
    return next((flops for fragment, flops in PEAK_BF16_FLOPS if fragment in name), None)


def summarize(runs: list[dict]) -> dict[str, Any]:
    """The figures the README quotes: best MFU per backbone and method, and adapters/full step ratios."""
    summary: dict[str, Any] = {}
    for row in runs:
        if row["batches"] != "length_grouped":
            continue
        key = f"{row['backbone']}/{row['method']}"
        summary.setdefault(key, {})[row["variant"]] = {"mfu": row["mfu"], "real_tokens_per_s": row["real_tokens_per_s"], "step_ms": row["step_ms"]}
    for backbone in CONFIGS:
        for variant in VARIANTS:
            full, adapters = summary.get(f"{backbone}/full", {}).get(variant), summary.get(f"{backbone}/adapters64", {}).get(variant)
            if full and adapters:
                summary.setdefault("adapters_vs_full_step_ratio", {})[f"{backbone}/{variant}"] = round(adapters["step_ms"] / full["step_ms"], 3)
    return summary


def _names(text: str) -> list[str]:
    return [name.strip() for name in text.split(",") if name.strip()]


def _counts(text: str) -> list[int]:
    return [int(k) for k in text.split(",") if k.strip()]


def _group_attempts(text: str) -> list[int]:
    """--shard-groups' attempts: runs per group ("8")."""
    return [int(item) for item in _names(text)]


def shard_throughput(data_dir: str | None, tokenizer_dir: str, one_at_a_time: bool, work: Path, size: str = "bert-base",
                     max_train_examples: int | None = None, group_sizes: Sequence[int] = (),
                     on_attempt: Callable[[dict[str, Any]], None] | None = None, config: dict[str, int] | None = None,
                     tasks: Sequence[str] = ("rte",), methods: Sequence[dict[str, Any]] = ({"name": "adapters", "size": 64},),
                     host_profile: int = 0) -> dict[str, Any]:
    """Runs finished per hour on one realistic shard (by default BERT-base adapters m=64 on RTE; `tasks` x
    `methods` as the plan shards them, a shard per task, trained in turn) at the paper's three adapter learning rates x 3
    seeds, 3 epochs, more seeds where a group needs more runs; randomly initialised, which is all speed needs),
    trained one at a time, then fused g runs per group, each into its own run store; and how far each fused run's result
    moved (float reduction order differs). `host_profile` > 0: each attempt under cProfile, its that many heaviest functions kept
    (heaviest_functions)."""
    import cProfile
    import dataclasses
    import shutil
    from collections import Counter

    from transformers import BertConfig, BertForSequenceClassification

    from adaptune.sweep.experiments import DEFAULTS, GLUE_LRS, H100, Sweep
    from adaptune.sweep.plan import plan
    from adaptune.sweep.shard_runner import run_shard
    from adaptune.sweep.store import RunStore
    from adaptune.train.config import method_label

    seeds = max(3, math.ceil(max(group_sizes, default=0) / len(GLUE_LRS)))
    backbone = work / "bert-base-random"
    torch.manual_seed(0)
    BertForSequenceClassification(BertConfig(**(config or CONFIGS[size]))).bert.save_pretrained(backbone)
    for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (Path(tokenizer_dir) / name).is_file():
            shutil.copy(Path(tokenizer_dir) / name, backbone / name)
    spec = dataclasses.replace(
        DEFAULTS, name="gpu_shard_bench", backbone=str(backbone), accelerator=H100, shard_size=len(GLUE_LRS) * seeds, max_train_examples=max_train_examples,
        sweeps=(Sweep(tasks=tuple(tasks), methods=tuple(methods), learning_rates=GLUE_LRS, epochs=(3,), seeds=tuple(range(seeds))),),
    )
    shards = plan(spec).shards  # a shard per task: trained one after another, as one pod would take them
    runs = [run for shard in shards for run in shard.runs]
    labels = ", ".join(method_label(method) for method in methods)
    results: dict[str, Any] = {"shard": f"{len(runs)} runs: {size} (random init) {labels} on {', '.join(tasks)}, lr {GLUE_LRS}, "
                                          f"3 epochs, {seeds} seeds, {max_train_examples or 'all'} training rows per run"
                                          + (f", {len(shards)} shards in turn" if len(shards) > 1 else "")}
    records = {}
    attempts = [("1_at_a_time", 1)] * one_at_a_time + [(f"fused_{group}", group) for group in group_sizes]
    for label, group in attempts:
        store = RunStore(work / f"store-{label}")
        started = time.perf_counter()
        outcomes: Counter[str] = Counter()
        profiler = cProfile.Profile() if host_profile else None
        with profiler or contextlib.nullcontext():
            for shard in shards:
                outcomes += run_shard(spec, shard.id, store, data_dir=data_dir, group_size=group)
        seconds = time.perf_counter() - started
        records[label] = {run.run_id: store.record(run.run_id) for run in runs}
        failures = {run_id: {"reason": record["reason"], "traceback": _traceback_text(work / f"store-{label}", run_id)}
                    for run_id, record in records[label].items() if record["status"] == "failed"}
        by_phase = phase_times.summed(list(records[label].values()))
        results[label] = {"seconds": round(seconds, 1), "runs_per_hour": round(len(runs) / seconds * 3600),
                          "outcomes": dict(outcomes), "failures": failures,
                          # where the attempt's time went (the records' time_s); "other": planning, leases, the store
                          "seconds_by_phase": {**by_phase, "other": round(seconds - sum(by_phase.values()), 1)},
                          "step_graphs": _graph_counts(list(records[label].values()))}
        if profiler is not None:
            results[label]["host_profile"] = heaviest_functions(profiler, host_profile)
        for run_id, failure in failures.items():
            log(f"{run_id} failed: {failure['reason']}\n{failure['traceback'] or ''}")
        log(f"shard, {label}: {seconds:.0f} s, {dict(outcomes)}")
        _compare(results, records, attempts)
        if on_attempt:
            on_attempt(results)
    return results


def heaviest_functions(profiler: Any, count: int) -> dict[str, list[dict[str, Any]]]:
    """A cProfile's `count` heaviest functions by cumulative and by own time (the main thread's; a GPU's kernels are
    in the host calls that wait for them), each as where it is (path from site-packages or the repository), calls and
    seconds."""
    import pstats

    def where(file: str, line: int, name: str) -> str:
        for marker in ("site-packages/", f"{Path.cwd()}/"):
            file = file.split(marker, 1)[-1]
        return f"{file}:{line}({name})" if line else name

    rows = [{"function": where(*key), "calls": calls, "own_s": round(own, 3), "cumulative_s": round(cumulative, 3)}
            for key, (_, calls, own, cumulative, _) in pstats.Stats(profiler).stats.items()]
    return {"by_cumulative": sorted(rows, key=lambda row: -row["cumulative_s"])[:count],
            "by_own": sorted(rows, key=lambda row: -row["own_s"])[:count]}


def _compare(results: dict[str, Any], records: dict[str, dict[str, Any]], attempts: list[tuple[str, int]]) -> None:
    """Each finished attempt against the first: speedup, and how far the test score moved (fused: float reduction order
    differs)."""
    first = attempts[0][0]
    for label, _group in attempts[1:]:
        if label not in records:
            continue
        results[f"speedup_{label}_vs_{first}"] = round(results[first]["seconds"] / results[label]["seconds"], 2)
        changes = [abs(_score(records[label][run_id]) - _score(records[first][run_id])) for run_id in records[first]
                   if _score(records[label][run_id]) is not None and _score(records[first][run_id]) is not None]
        results[f"max_test_score_change_{label}_vs_{first}"] = max(changes, default=None)


def _graph_counts(records: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The attempt's step-graph counts, each group's once, and the warm-up setting its groups had (a setting, not summed)."""
    counts = phase_times.summed(records, "step_graphs")
    if not counts:
        return None
    counts["warmup"] = sorted({record["step_graphs"]["warmup"] for record in records if record.get("step_graphs")})
    return counts


def _score(record: dict[str, Any]) -> float | None:
    return (record.get("test_metrics") or {}).get(record.get("primary_metric"))


def _traceback_text(store_root: Path, run_id: str) -> str | None:
    """The traceback a failed run left beside its record (adaptune.train.record.save_traceback), if any."""
    path = next(iter(store_root.rglob(f"{run_id}/traceback.txt")), None)
    return path.read_text()[-4000:] if path else None


def _embedded_tokenizer_dir() -> str:
    from adaptune.core.backbones import DEFAULT_BACKBONE
    from adaptune.model.backbone import resolve_backbone

    return resolve_backbone(DEFAULT_BACKBONE)


def print_table(runs: list[dict]) -> None:
    print(f"{'backbone':11} {'method':10} {'variant':9} {'batches':15} {'step ms':>8} {'real tok/s':>11} {'TFLOP/s':>8} {'MFU':>6} {'peak GiB':>8}")
    for r in runs:
        print(f"{r['backbone']:11} {r['method']:10} {r['variant']:9} {r['batches']:15} {r['step_ms']:8.2f} {r['real_tokens_per_s']:11d} "
              f"{r['model_tflops_per_s']:8.1f} {r['mfu'] or 0:6.3f} {r['peak_gib'] or 0:8.2f}")


if __name__ == "__main__":
    sys.exit(main())
