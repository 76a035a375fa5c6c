"""`make bench-gpu`: BERT-base and BERT-large training speed on a CUDA GPU, step variants compared; JSON out.

    python -m bench.gpu --out bench/gpu.json [--data-dir DIR] [--tokenizer DIR] [--variants before,now,preset]

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
Then the fused groups (bench.gpu_fused), each variant's StepSettings made from the --fused-* flags, and sweep
throughput: one realistic shard trained one run at a time and fused g runs per group on the one GPU (bench.gpu_shard,
its runs' settings read from the environment under the H100 preset as run_shard reads them), runs finished per hour and
how far each result moved. The batches and scales: bench.gpu_batches.
Not a test: no pass/fail here.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import math
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from adaptune.core.devices import Device, pick_device
from adaptune.fused.settings import LAYER_SETTINGS, VALUES, StepSettings
from bench.gpu_batches import (
    BATCH_SIZE,
    CONFIGS,
    CUDA_PAD_MULTIPLE,
    FULL_SCALE,
    MAX_LENGTH,
    REHEARSAL,
    SQUAD_LENGTHS_FILE,
    TASKS,
    Batch,
    Scale,
    cached_batches,
    describe,
    fixed_length_sets,
    log,
)
from bench.gpu_shard import embedded_tokenizer_dir, shard_throughput
from bench.squad_lengths import write_squad_lengths
from bench.step_cost import interleaved, timed_pass, training_flops

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



def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.gpu", description=__doc__.splitlines()[0])
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
    return parser


def checked_args(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """The arguments, each --fused-* and --variants value one the step settings know (else the parser's error, exit 2)."""
    args = parser.parse_args(argv)
    for flag, field in (("--fused-masks", "dropout_masks"), ("--fused-compile", "compile"), *((f"--fused-{field.replace('_', '-')}", field)
                                                                                           for field in LAYER_SETTINGS)):
        wrong = [name for name in _names(getattr(args, flag[2:].replace("-", "_"))) if name not in VALUES[field]]
        if wrong:
            parser.error(f"{flag}: {', '.join(wrong)} not one of {', '.join(VALUES[field])}")
    if any(variant not in VARIANTS for variant in _names(args.variants)):
        parser.error(f"--variants: use some of {', '.join(VARIANTS)}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = checked_args(build_parser(), argv)
    device = pick_device()
    if args.write_squad_lengths or args.write_batches:
        return write_carried(args, device)
    settings = StepSettings.from_environment()  # the `preset` variant's, read once here: a bad setting fails before anything runs
    scale = REHEARSAL if args.rehearse else FULL_SCALE
    if args.rehearse:  # one thread: beside a busy process, two OpenMP threads on 2 cores ran a fused step 60x slower
        torch.set_num_threads(1)
    if device.kind != "cuda" and not args.rehearse:
        print("bench_gpu: no CUDA device here; `make bench` measures the CPU (or --rehearse checks this benchmark's flow)", file=sys.stderr)
        return 2
    call = Call.start(args, device, scale)
    measure_solo(call, settings)
    if args.fused:
        measure_fused_groups(call)
    if _counts(args.graph_check):
        check_graphs(call)
    check_kernels(call)
    if _counts(args.fused_profile):
        profile_groups(call)
    if args.shard or args.shard_groups:
        measure_shard(call)
    print_table(call.results["runs"])
    print(json.dumps({"summary": call.results.get("summary"), "shard": call.results.get("shard")}, indent=2))
    print(f"bench_gpu: wrote {call.out}", file=sys.stderr)
    return 0


def write_carried(args: argparse.Namespace, device: Device) -> int:
    """--write-squad-lengths or --write-batches (make gpu-carry): only that file, tokenized here, no device time spent."""
    if args.write_squad_lengths:
        written = write_squad_lengths(args.write_squad_lengths, args.data_dir, args.tokenizer, CUDA_PAD_MULTIPLE)
        print(json.dumps({key: value for key, value in written.items() if key != "padded_lengths"}), file=sys.stderr)
        return 0
    batch_sets = cached_batches(args.write_batches, args.data_dir, args.tokenizer, device, pad_multiple=CUDA_PAD_MULTIPLE)
    print(json.dumps({name: describe(batches) for name, batches in batch_sets.items()}), file=sys.stderr)
    return 0


@dataclass
class Call:
    """One bench-gpu call: its arguments, device, scale and batches, and the results written to --out after every
    measurement (a cut-off call keeps what it measured)."""

    args: argparse.Namespace
    device: Device
    scale: Scale
    batch_sets: dict[str, list[Batch]]
    results: dict[str, Any]
    out: Path
    started: float  # time.perf_counter() when the call began

    @classmethod
    def start(cls, args: argparse.Namespace, device: Device, scale: Scale) -> Call:
        """The call's batches (tokenized, or read from --batches-cache) and its results' header; --out's folder made."""
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
        return cls(args, device, scale, batch_sets, results, out, started)

    def save(self) -> None:
        """After every measurement: a cut-off call keeps what it measured."""
        self.results["elapsed_s"] = round(time.perf_counter() - self.started, 1)
        self.out.write_text(json.dumps(self.results, indent=2) + "\n")

    def backbones(self) -> list[str]:
        return self.args.backbones.split(",")

    def first_method(self) -> str:
        return _names(self.args.fused_methods)[0]

    def first_layer_settings(self) -> dict[str, str]:
        """Each layer flag's first value (--fused-attention, --fused-dropout, --fused-layer-norm)."""
        return {field: (_names(getattr(self.args, f"fused_{field}")) or VALUES[field])[0] for field in LAYER_SETTINGS}


def measure_solo(call: Call, settings: StepSettings) -> None:
    """The solo step's variants for each backbone, batch set and method (--variants, --batch-sets, --methods)."""
    args, variants = call.args, _names(call.args.variants)
    for backbone in call.backbones() if variants else ():
        for batches_name in args.batch_sets.split(","):
            for method in _names(args.methods):
                call.results["runs"] += measure(call.scale.configs[backbone], backbone, method, batches_name, call.batch_sets[batches_name],
                                                variants, call.device, args.repeats, settings)
                call.results["summary"] = summarize(call.results["runs"])
                call.save()
                log(f"{backbone} {method} {batches_name}: "
                    + ", ".join(f"{r['variant']} {r['step_ms']} ms MFU {r['mfu']}" for r in call.results["runs"][-len(variants):]))


def measure_fused_groups(call: Call) -> None:
    """The fused step at each group size (--fused) for each backbone, fused method and batch set, the --fused-* values crossed."""
    from bench.gpu_fused import measure_fused

    args, results = call.args, call.results
    results["fused"] = []

    def keep(row: dict[str, Any]) -> None:
        results["fused"].append(row)
        call.save()
        log(f"fused {row['backbone']} {row['method']} {row['batches']} k={row['k']} {row['optimizer_step']} {row['masks']} {row['compile']} "
            + " ".join(f"{field} {row[field]}" for field in LAYER_SETTINGS) + ": "
            f"{row.get('examples_per_s', row.get('error'))} ex/s, MFU {row.get('mfu')}, peak {row.get('peak_gib')} GiB")

    for backbone, method, batches_name in itertools.product(call.backbones(), args.fused_methods.split(","), _names(args.fused_batch_sets)):
        rows = measure_fused(call.scale.configs[backbone], backbone, method, call.batch_sets[batches_name], _counts(args.fused), call.device,
                             args.repeats, peak_flops(call.device), optimizer_steps=_names(args.fused_optimizer),
                             mask_schemes=_names(args.fused_masks), compile_modes=_names(args.fused_compile), on_row=keep,
                             task_count=len(TASKS), batches_name=batches_name,
                             layer_settings={field: _names(getattr(args, f"fused_{field}")) for field in LAYER_SETTINGS})
        call.save()  # `keep` holds the same rows, now with their speedups against k = 1
        log(f"{backbone} {method} {batches_name} fused: " + ", ".join(
            f"k={r['k']} {r['optimizer_step']} {r['masks']} {r['compile']} {r.get('examples_per_s', r.get('error'))} ex/s MFU {r.get('mfu')}"
            for r in rows))


def check_graphs(call: Call) -> None:
    """--graph-check: whether the step replayed as CUDA graphs trains as it does uncaptured, at each group size."""
    from bench.gpu_fused import check_step_graphs

    call.results["step_graphs_check"] = []
    for backbone in call.backbones():
        for k in _counts(call.args.graph_check):
            row = check_step_graphs(call.scale.configs[backbone], backbone, call.first_method(), call.batch_sets["length_grouped"], k,
                                    call.device, task_count=len(TASKS))
            call.results["step_graphs_check"].append(row)
            call.save()
            log(f"step graphs check {backbone} k={k}: graphs {row['graphs']}, eager {row['eager']}")


def run_checks(call: Call, name: str, counts: list[int], check: Callable[..., dict[str, Any]], describe: Callable[[dict[str, Any]], str],
               **held: str) -> None:
    """A kernel's check at each group size and backbone: the first fused method, counter masks, the first --fused-compile
    mode and the `held` layer settings (the kernels checked before it, as the call gives them), the rest at their defaults."""
    settings = StepSettings(compile=_names(call.args.fused_compile)[0], dropout_masks="counter", **held)
    call.results[name] = []
    for backbone in call.backbones():
        for k in counts:
            row = check(call.scale.configs[backbone], backbone, call.first_method(), call.batch_sets["length_grouped"], k, call.device,
                        task_count=len(TASKS), settings=settings)
            call.results[name].append(row)
            call.save()
            log(f"{name} {backbone} k={k}: {describe(row)}")


def check_kernels(call: Call) -> None:
    """--attention-check, --dropout-check, --layer-norm-check: each kernel against what it replaces, in that order."""
    args, first = call.args, call.first_layer_settings()
    if _counts(args.attention_check):
        from bench.gpu_fused import check_attention_kernel

        run_checks(call, "attention_check", _counts(args.attention_check), check_attention_kernel,
                   lambda row: f"one call {row['attention_call']}, trained {row['kernel']}, {row['kernel_calls']} kernel calls")
    if _counts(args.dropout_check):
        from bench.gpu_fused import check_dropout_kernel

        run_checks(call, "dropout_check", _counts(args.dropout_check), check_dropout_kernel,
                   lambda row: f"calls {row['dropout_call']}, trained {row['kernel']}, {row['dropout_kernel_calls']} kernel launches",
                   attention=first["attention"])
    if _counts(args.layer_norm_check):
        from bench.gpu_fused import check_layer_norm_kernel

        run_checks(call, "layer_norm_check", _counts(args.layer_norm_check), check_layer_norm_kernel,
                   lambda row: f"calls {row['layer_norm_call']}, trained {row['kernel']}, "
                               f"{row['layer_norm_kernel_calls']} + {row['layer_norm_backward_calls']} kernel launches",
                   attention=first["attention"], dropout=first["dropout"])


def profile_groups(call: Call) -> None:
    """--fused-profile: where the fused step's time goes at each group size, each flag's first value."""
    from bench.gpu_fused import group_settings, profile_fused

    profiled = group_settings(_names(call.args.fused_masks)[0], _names(call.args.fused_compile)[0], **call.first_layer_settings())
    call.results["fused_profile"] = []
    for backbone in call.backbones():
        for k in _counts(call.args.fused_profile):
            row = profile_fused(call.scale.configs[backbone], backbone, call.first_method(), call.batch_sets["length_grouped"], k, call.device,
                                settings=profiled, task_count=len(TASKS))
            call.results["fused_profile"].append(row)
            call.save()
            log(f"profile {backbone} k={k}: {row['step_ms']} ms a step, {row['kernels_per_step']} kernels, "
                f"device busy {row['device_busy_share']}, heaviest {row['top'][0]['name']}")


def measure_shard(call: Call) -> None:
    """--shard, --shard-groups: runs per GPU-hour on a realistic shard through the real trainer (bench.gpu_shard)."""
    import tempfile

    from bench.gpu_fused import FUSED_METHODS

    args = call.args
    with tempfile.TemporaryDirectory() as work:
        def keep_shard(shard: dict[str, Any]) -> None:
            call.results["shard"] = shard
            call.save()

        rows = call.scale.shard_train_rows or args.shard_train_rows
        shard_throughput(args.data_dir, args.tokenizer or embedded_tokenizer_dir(), bool(_counts(args.shard)), Path(work),
                         group_sizes=_group_attempts(args.shard_groups), max_train_examples=rows, on_attempt=keep_shard,
                         config=call.scale.configs["bert-base"], tasks=_names(args.shard_tasks),
                         methods=[FUSED_METHODS[name] for name in _names(args.shard_methods)],
                         host_profile=args.shard_host_profile)


def measure(config: dict[str, int], backbone: str, method: str, batches_name: str, batches: list[Batch], variants: list[str], device: Device,
            repeats: int, settings: StepSettings = StepSettings()) -> list[dict]:
    """Each solo step variant on the batches, interleaved; `settings` are the `preset` variant's."""
    rows = []
    steps = {variant: build_step(config, method, variant, device, settings) for variant in variants}
    times = interleaved({v: (lambda s=step: timed_pass(s, batches, device)) for v, (step, _, _) in steps.items()}, repeats)
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


def build_step(config: dict[str, int], method: str, variant: str, device: Device, settings: StepSettings = StepSettings()
               ) -> tuple[Callable[[Batch], None], nn.Module, Any]:
    """A solo step `variant` (the module docstring's), `preset` with the trainer's run dropout under `settings`."""
    from transformers import BertConfig, BertForSequenceClassification

    from adaptune.fused.run_dropout import dropout_stream, use_run_dropout
    from adaptune.model.methods import apply_method, method_from_dict
    from adaptune.train.loop import frozen_backbone_for_autocast
    from adaptune.train.optimizer_step import model_adamw, training_step

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
    optimizer = model_adamw(model, 1e-5, 0.01)
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
    """adaptune.train.optimizer_step.training_step as it was before the GPU work: two host syncs per step."""
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


def print_table(runs: list[dict]) -> None:
    print(f"{'backbone':11} {'method':10} {'variant':9} {'batches':15} {'step ms':>8} {'real tok/s':>11} {'TFLOP/s':>8} {'MFU':>6} {'peak GiB':>8}")
    for r in runs:
        print(f"{r['backbone']:11} {r['method']:10} {r['variant']:9} {r['batches']:15} {r['step_ms']:8.2f} {r['real_tokens_per_s']:11d} "
              f"{r['model_tflops_per_s']:8.1f} {r['mfu'] or 0:6.3f} {r['peak_gib'] or 0:8.2f}")


if __name__ == "__main__":
    sys.exit(main())
