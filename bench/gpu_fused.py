"""Fused run groups on a GPU (`make bench-gpu`, its `fused` entries): for k = 1, 4, 8, 16 runs of one
method on a randomly initialised BERT-base or BERT-large, the fused training step (adaptune.train.group_loop
.fused_step: one forward and backward through the shared frozen backbone in bf16, every run's clipping
and AdamW at once) on real length-grouped batches, each run taking its own batch as in training. Per k:
step time, training examples/s over all runs, MFU against the dense bf16 peak, peak memory. Variants,
side by side: the optimizer step (every run's at once, or one run's after another), and the step settings
(adaptune.fused.settings.StepSettings, one instance per variant, passed down as the trainer passes them): the dropout
masks' scheme (adaptune.fused.run_dropout: one generator draw per run per site, or counter-based masks for all runs
at once), the step eager or replayed as CUDA graphs (adaptune.fused.step_graphs), and each layer setting's kernel.

FLOPs are each run's own (bench.step_cost.training_flops of the solo model at the fused step's
padded length) times k, so MFU is comparable with one run's; padding to the longest of the k batches
is counted as work, as it is for one run's padding.
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import itertools
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any
from unittest import mock

import torch

from adaptune.core.devices import Device, is_out_of_memory
from adaptune.fused.kernels import attention as attention_kernel
from adaptune.fused.kernels import dropout as dropout_kernel
from adaptune.fused.kernels import layer_norm as layer_norm_kernel
from adaptune.fused.kernels.counter_coordinates import keep_threshold
from adaptune.fused.run_dropout import CounterStream, RunRandomness, counter_keep_mask, fused_counter_keep_mask
from adaptune.fused.run_groups import GroupedLayerNorm, trained_tensors
from adaptune.fused.settings import LAYER_SETTINGS, VALUES, StepSettings
from adaptune.fused.step_graphs import STEP_GRAPHS, GraphedFusedStep, graph_warmup
from adaptune.model.methods import apply_method, method_from_dict
from adaptune.train.group_loop import fused_step, run_losses, stack_run_batches
from bench.fused import GroupedRun, grouped_runs
from bench.step_cost import timed_pass, training_flops

GROUP_SIZES = (1, 4, 8, 16)
# top_kN: the top N layers stacked per run (the plan's deepest BERT-base groups are top_k 11).
FUSED_METHODS = {"adapters64": {"name": "adapters", "size": 64}, "layernorm": {"name": "layernorm"},
                 **{f"top_k{depth}": {"name": "top_k", "k": depth} for depth in (1, 3, 6, 11, 12)},
                 "full": {"name": "full"}}  # whole models stacked per run (run_groups: each run's embedding tables too)
Batch = dict[str, torch.Tensor]
# The kernels' checks' default: what each check does not vary at its default, counter masks (every kernel's).
COUNTER_MASKS = StepSettings(dropout_masks="counter")


def group_settings(masks: str = "generator", compile: str = "eager", attention: str = "eager", dropout: str = "mask",
                  layer_norm: str = "torch") -> StepSettings:
    """The settings a group drawing `masks` trains under when the rest are asked for: what needs counter masks takes its
    eager form in a group drawing generator masks (StepSettings.for_masks), as a run that keeps generator masks does."""
    return StepSettings(compile=compile, dropout_masks="counter", attention=attention, dropout=dropout,
                        layer_norm=layer_norm).for_masks(masks)


def crossed_settings(mask_schemes: Sequence[str] = ("generator",), compile_modes: Sequence[str] = ("eager",),
                     layer_settings: Mapping[str, Sequence[str]] | None = None) -> list[StepSettings]:
    """Every mask scheme x compile mode x each layer setting's values in `layer_settings` (by its field in
    settings.LAYER_SETTINGS, its default where not given), in that order, as group_settings makes each; a combination
    that comes out as one before it (a kernel asked of generator masks) is left out: it would time that one again."""
    unknown = set(layer_settings or {}) - set(LAYER_SETTINGS)
    if unknown:
        raise ValueError(f"not layer settings: {sorted(unknown)}; use {', '.join(LAYER_SETTINGS)}")
    choices = {field: tuple((layer_settings or {}).get(field, VALUES[field][:1])) for field in LAYER_SETTINGS}
    crossed: list[StepSettings] = []
    for masks, compile_mode, *values in itertools.product(mask_schemes, compile_modes, *choices.values()):
        settings = group_settings(masks, compile_mode, **dict(zip(choices, values, strict=True)))
        if settings not in crossed:
            crossed.append(settings)
    return crossed


def measure_fused(config: dict[str, Any], size: str, method: str, batches: list[Batch], group_sizes: Sequence[int],
                  device: Device, repeats: int, peak: float | None, steps: int = 8,
                  optimizer_steps: Sequence[str] = ("together",), mask_schemes: Sequence[str] = ("generator",),
                  compile_modes: Sequence[str] = ("eager",), on_row: Callable[[dict[str, Any]], None] | None = None,
                  task_count: int = 1, batches_name: str = "length_grouped",
                  layer_settings: Mapping[str, Sequence[str]] | None = None) -> list[dict[str, Any]]:
    """One row per group size and variant: optimizer step ("together": the trainer's one multi-tensor
    step for all runs; "per_run": each run's own clipping and torch AdamW, fused on a GPU, in turn;
    which launches fewer kernels on a GPU depends on how many tensors one multi-tensor launch takes, so
    it is measured) x the step settings crossed_settings makes of the dropout mask schemes, the compile modes ("eager",
    or "step_graphs": the whole step replayed as CUDA graphs, counter masks only) and each layer setting's values in
    `layer_settings`: attention (adaptune.fused.kernels.attention: "eager", or the "kernel", counter masks only), dropout
    (adaptune.fused.kernels.dropout: "mask", or "kernel", the hidden-state sites' masks drawn and applied in one kernel,
    counter masks only), layer_norm (adaptune.fused.kernels.layer_norm: the runs' trained LayerNorms with torch's
    operators, "torch", or in one "kernel" each way). Each row gives the settings its group trained under (the frozen
    query, key and value always stacked, as the trainers do under autocast). A size that runs out of memory is recorded
    so and ends the sweep."""
    variants = crossed_settings(mask_schemes, compile_modes, layer_settings)
    rows: list[dict[str, Any]] = []
    cuda = device.kind == "cuda"  # the CPU runs it too, for a check, without memory figures

    def keep(row: dict[str, Any]) -> None:
        rows.append(row)
        if on_row:
            on_row(row)

    for k in group_sizes:
        fused = _fused_steps(batches, task_count, k, steps, device)
        examples = sum(sum(layout.rows) for *_, layout in fused)
        # A fresh group for each variant: its own optimizer state and memory peak.
        for optimizer_step, settings in itertools.product(optimizer_steps, variants):
            variant = {"batches": batches_name, "optimizer_step": optimizer_step, **_labels(settings)}
            model = randomness = runs = runner = one_pass = None
            with KernelLaunches() as kernel_calls:
                try:
                    model, randomness, runs, run_flops = initialised_group(config, FUSED_METHODS[method], k, device, fused, settings)
                    runner = _step_function(model, randomness, settings, device, optimizer_step == "together")
                    one_pass = functools.partial(_train_pass, runner, runs, fused)
                    for _ in range(_warmup_passes(settings)):  # kernels chosen, AdamW state allocated, graphs captured
                        one_pass()
                    if cuda and not settings.step_graphs:  # a graph's memory was taken at capture: its peak is the warm-up's
                        torch.cuda.reset_peak_memory_stats()
                    seconds = statistics.median(timed_pass(lambda _, step=one_pass: step(), [None], device) for _ in range(repeats))
                    keep({"backbone": size, "method": method, "k": k, **variant,
                          "step_ms": round(1000 * seconds / steps, 2), "examples_per_s": round(examples / seconds, 1),
                          "model_tflops_per_s": round(k * run_flops / seconds / 1e12, 1),
                          "mfu": round(k * run_flops / seconds / peak, 3) if peak else None,
                          "peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if cuda else None,
                          **({"graphs_captured": runner.captured} if isinstance(runner, GraphedFusedStep) else {}),
                          **({"kernel_calls": kernel_calls.forward} if settings.attention == "kernel" else {}),
                          **({"dropout_kernel_calls": kernel_calls.dropout} if settings.dropout == "kernel" else {}),
                          **({"layer_norm_kernel_calls": kernel_calls.layer_norm} if settings.layer_norm == "kernel" else {})})
                except Exception as error:
                    if not is_out_of_memory(error):
                        raise
                    keep({"backbone": size, "method": method, "k": k, **variant, "error": "out of memory"})
                    return _with_speedups(rows)
                finally:
                    del model, randomness, runs, one_pass, runner  # the partial holds the group too
                    gc.collect()
                    if cuda:
                        torch.cuda.empty_cache()
    return _with_speedups(rows)


def profile_fused(config: dict[str, Any], size: str, method: str, batches: list[Batch], k: int, device: Device, steps: int = 4,
                  settings: StepSettings = StepSettings(), task_count: int = 1, top: int = 25) -> dict[str, Any]:
    """Where a fused step's time goes: one warm pass of `steps` fused steps at k, the group trained under `settings`,
    under torch.profiler. Per step: kernels launched and the share of the wall time the device was busy (low:
    launch-bound), aten operators, and the `top` operators by self device time (CPU time on a CPU)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    cuda = device.kind == "cuda"
    fused = _fused_steps(batches, task_count, k, steps, device)
    model, randomness, runs, _ = initialised_group(config, FUSED_METHODS[method], k, device, fused, settings)
    one_pass = functools.partial(_train_pass, _step_function(model, randomness, settings, device, True), runs, fused)
    for _ in range(_warmup_passes(settings)):  # warm-up (and capture)
        one_pass()
    device.synchronize()
    with profile(activities=[ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]) as profiler:
        started = time.perf_counter()
        one_pass()
        device.synchronize()
        wall = time.perf_counter() - started
    events = profiler.events()
    kernels = [event for event in events if event.device_type == DeviceType.CUDA]
    operators = [event for event in events if event.device_type == DeviceType.CPU and event.name.startswith("aten::")]
    self_time = (lambda event: event.self_device_time_total) if cuda else (lambda event: event.self_cpu_time_total)  # noqa: E731
    heaviest = sorted(profiler.key_averages(), key=self_time, reverse=True)[:top]
    return {"backbone": size, "method": method, "k": k, **_labels(settings), "steps": steps, "step_ms": round(1000 * wall / steps, 2),
            "kernels_per_step": round(len(kernels) / steps) if cuda else None,
            "device_busy_share": round(sum(kernel.device_time_total for kernel in kernels) / 1e6 / wall, 3) if cuda else None,
            "aten_ops_per_step": round(len(operators) / steps),
            "top": [{"name": event.key[:120], "calls_per_step": round(event.count / steps, 1),
                     "self_ms_per_step": round(self_time(event) / 1000 / steps, 3)} for event in heaviest]}


def _fused_steps(batches: list[Batch], task_count: int, k: int, steps: int, device: Device) -> list[tuple]:
    """`steps` fused steps' stacked inputs for a group of k, as group_loop stacks them."""
    return [stack_run_batches(group_batches(batches, task_count, step, k), 0, device.torch_device) for step in range(steps)]


def _labels(settings: StepSettings) -> dict[str, str]:
    """A row's names for the settings its group trained under: "masks" (the dropout masks' scheme), "compile", and each
    layer setting's field."""
    return {"masks": settings.dropout_masks, "compile": settings.compile, **{field: getattr(settings, field) for field in LAYER_SETTINGS}}


def _step_function(model: Any, randomness: Any, settings: StepSettings, device: Device, together: bool) -> Callable[..., Any]:
    """The group's step as the trainer runs it under `settings` (group_loop): (inputs, labels, weights, layout, runs) -> results."""
    if settings.step_graphs:
        return GraphedFusedStep(model, randomness, "classification", device, run_losses)
    return functools.partial(_eager_step, model, randomness, device, together)


def _eager_step(model: Any, randomness: Any, device: Device, together: bool, inputs: Any, labels: Any, weights: Any, layout: Any,
                runs: Any) -> Any:
    return fused_step(model, randomness, inputs, labels, weights, layout, "classification", runs, device, together)


def _warmup_passes(settings: StepSettings) -> int:
    """Untimed passes first: one, or, for step graphs, enough for every shape's eager steps and its capture."""
    return graph_warmup() + 1 if settings.step_graphs else 1


def _train_pass(step: Callable[..., Any], runs: list[GroupedRun], fused: list[tuple]) -> list[Any]:
    """One training pass of the group over the fused steps, as the trainer steps it; each step's results."""
    return [step(inputs, labels, weights, layout, runs) for inputs, labels, weights, layout in fused]


def check_step_graphs(config: dict[str, Any], size: str, method: str, batches: list[Batch], k: int, device: Device,
                      steps: int = 8, passes: int = 4, task_count: int = 1) -> dict[str, Any]:
    """Whether replaying the step as CUDA graphs (compile "step_graphs") trains as the same step does without
    capture: three groups from the same initial tensors, counter masks, over `passes` passes of `steps` fused
    steps: (a) the step-graph step with capture turned off (the same padding and optimizer path, run as they
    are), (b) with capture, (c) the default eager fused step (no padding, every run's AdamW at once). Largest
    differences of the step losses and of the trained tensors at the end, (b) and (c) against (a)."""
    fused = _fused_steps(batches, task_count, k, steps, device)
    graphs = dataclasses.replace(COUNTER_MASKS, compile=STEP_GRAPHS)
    reference = _trained(config, method, k, device, fused, graphs, passes, capture=False)
    return {"backbone": size, "method": method, "k": k, "steps": steps * passes, "masks": "counter", "compile": STEP_GRAPHS,
            "fused_mask_equals_eager": _fused_mask_equals_eager(k, device),
            "reference": "uncaptured", "graphs": _differences(_trained(config, method, k, device, fused, graphs, passes), reference),
            "eager": _differences(_trained(config, method, k, device, fused, COUNTER_MASKS, passes), reference),
            "first_losses": reference[0][:k], "last_losses": reference[0][-k:]}


def check_attention_kernel(config: dict[str, Any], size: str, method: str, batches: list[Batch], k: int, device: Device,
                           steps: int = 8, passes: int = 2, task_count: int = 1, settings: StepSettings = COUNTER_MASKS,
                           one_call: bool = True) -> dict[str, Any]:
    """Whether the attention kernel (adaptune.fused.kernels.attention) computes what eager attention does:
    (1) on one attention call, the kept positions bit for bit (counter_keep_mask's), and the output and
    gradients against eager attention in float32 from the same inputs; (2) two groups from the same
    initial tensors, counter masks, trained `passes` passes of `steps` fused steps under `settings` (its compile
    mode and other kernels; its attention is what varies), eager attention and the kernel: the largest differences
    of their step losses and trained tensors (`one_call` False: (2) only)."""
    fused = _fused_steps(batches, task_count, k, steps, device)
    settings = settings.for_masks("counter")
    trained, kernel_calls = _trained_each_way(config, method, k, device, fused, settings, passes, "attention")
    return {"backbone": size, "method": method, "k": k, "steps": steps * passes, "masks": "counter", "compile": settings.compile,
            **({"attention_call": attention_kernel_matches(device)} if one_call else {}), "reference": "eager attention",
            "kernel": _differences(trained["kernel"], trained["eager"]), "kernel_calls": kernel_calls.forward,
            "first_losses": trained["eager"][0][:k], "last_losses": trained["eager"][0][-k:]}


def check_dropout_kernel(config: dict[str, Any], size: str, method: str, batches: list[Batch], k: int, device: Device,
                         steps: int = 8, passes: int = 2, task_count: int = 1, settings: StepSettings = COUNTER_MASKS,
                         one_call: bool = True) -> dict[str, Any]:
    """Whether the dropout kernel (adaptune.fused.kernels.dropout) computes what the masks do: (1) on single calls,
    the kept positions bit for bit (counter_keep_mask's), the values and the gradients (dropout_kernel_matches);
    (2) two groups from the same initial tensors, counter masks, trained `passes` passes of `steps` fused steps under
    `settings` (its compile mode, its attention eager or the kernel, its LayerNorms; its dropout is what varies), dropout
    "mask" and "kernel": the largest differences of their step losses and trained tensors (`one_call` False: (2) only)."""
    fused = _fused_steps(batches, task_count, k, steps, device)
    settings = settings.for_masks("counter")
    each_way = (config, method, k, device, fused, settings, passes, "dropout")
    trained, launches = _trained_each_way(*each_way)
    # Where an H100's group trained apart from the masks' (2026-11-27: step losses 0.37 apart, single calls bit-equal):
    # the same pair uncaptured, and on a GPU the masks' compiled form against their definition at the training's inputs.
    uncaptured = _trained_each_way(*each_way, capture=False)[0] if settings.step_graphs else None
    return {"backbone": size, "method": method, "k": k, "steps": steps * passes, "masks": "counter", "compile": settings.compile,
            "attention": settings.attention,
            **({"dropout_call": dropout_kernel_matches(device)} if one_call else {}), "reference": "dropout masks",
            "kernel": _differences(trained["kernel"], trained["mask"]),
            **({"uncaptured": _differences(uncaptured["kernel"], uncaptured["mask"]),
                "masks_captured_vs_uncaptured": _differences(trained["mask"], uncaptured["mask"]),
                "kernel_captured_vs_uncaptured": _differences(trained["kernel"], uncaptured["kernel"])} if uncaptured else {}),
            **({"fused_mask_equals_eager_at_training_inputs": fused_mask_equals_eager_in_training(k, device, config["hidden_size"])}
               if device.kind == "cuda" else {}),
            "dropout_kernel_calls": launches.dropout, "first_losses": trained["mask"][0][:k], "last_losses": trained["mask"][0][-k:]}


def check_layer_norm_kernel(config: dict[str, Any], size: str, method: str, batches: list[Batch], k: int, device: Device,
                            steps: int = 8, passes: int = 2, task_count: int = 1, settings: StepSettings = COUNTER_MASKS,
                            one_call: bool = True) -> dict[str, Any]:
    """Whether the grouped LayerNorm kernel (adaptune.fused.kernels.layer_norm) computes what torch's operators do:
    (1) single calls against them (layer_norm_kernel_matches); (2) two groups from the same initial tensors, counter
    masks, trained `passes` passes of `steps` fused steps under `settings` (its compile mode, attention and dropout; its
    layer_norm is what varies), the LayerNorms "torch" and "kernel": the largest differences of their step losses and
    trained tensors (`one_call` False: (2) only)."""
    fused = _fused_steps(batches, task_count, k, steps, device)
    settings = settings.for_masks("counter")
    trained, launches = _trained_each_way(config, method, k, device, fused, settings, passes, "layer_norm")
    return {"backbone": size, "method": method, "k": k, "steps": steps * passes, "masks": "counter", "compile": settings.compile,
            "attention": settings.attention, "dropout": settings.dropout,
            **({"layer_norm_call": layer_norm_kernel_matches(device, config["hidden_size"])} if one_call else {}),
            "reference": "torch's LayerNorm operators", "kernel": _differences(trained["kernel"], trained["torch"]),
            "layer_norm_kernel_calls": launches.layer_norm, "layer_norm_backward_calls": launches.layer_norm_backward,
            "first_losses": trained["torch"][0][:k], "last_losses": trained["torch"][0][-k:]}


def layer_norm_kernel_matches(device: Device, features: int) -> dict[str, Any]:
    """Grouped LayerNorm calls in the kernel against torch's operators (GroupedLayerNorm's "torch" path), forward and
    backward, on 3 runs with unlike scales and shifts: float32 input (the trainers': the residual sum) and bf16 (on a GPU;
    torch's autocast normalises it in float32 too), a row count that no backward program's span divides, under autocast as
    the trainers call it. The largest differences of the output and of each gradient, with the largest magnitude of each."""
    cuda, target = device.kind == "cuda", device.torch_device
    generator = torch.Generator(device=target).manual_seed(0)
    runs, rows = 3, (4_099 if cuda else 37)
    module = GroupedLayerNorm(torch.nn.LayerNorm(features), *([torch.randn(features, generator=generator, device=target) for _ in range(runs)]
                                                              for _ in range(2))).to(target)
    checks = {}
    for dtype in (torch.float32, torch.bfloat16) if cuda else (torch.float32,):
        x = (torch.randn(runs * rows, features, device=target, generator=generator) * 4 + 1).to(dtype).requires_grad_()
        grad_out = torch.randn(runs * rows, features, device=target, generator=generator)
        results = {}
        for layer_norm in layer_norm_kernel.LAYER_NORM_MODES:
            module.kernel = layer_norm == "kernel"  # as group_model builds it under StepSettings.layer_norm
            with torch.autocast(target.type, dtype=torch.bfloat16, enabled=cuda):
                out = module(x)
            results[layer_norm] = [out.detach(), *torch.autograd.grad(out, (x, module.weight, module.bias), grad_out.to(out.dtype))]
        checks[str(dtype).removeprefix("torch.")] = {
            f"max_{name}_difference": float((kernel.float() - reference.float()).abs().max())
            for name, kernel, reference in zip(("out", "grad_x", "grad_weight", "grad_bias"), results["kernel"], results["torch"], strict=True)
        } | {f"max_{name}": float(reference.float().abs().max())
             for name, reference in zip(("out", "grad_x", "grad_weight", "grad_bias"), results["torch"], strict=True)}
    return {"runs": runs, "rows_per_run": rows, "features": features, **checks}


def dropout_kernel_matches(device: Device, p: float = 0.1) -> dict[str, Any]:
    """Dropout kernel calls against counter_keep_mask and the torch formula, in bf16 on a GPU and float32 on a CPU
    (Triton's interpreter), on 3 runs with unlike draws: a rank-2 block (the pooled output's: rows, features) and a
    rank-3 block (rows, tokens, features) each with enough rows that a row's index sets the hash index's top bit
    (2^19 rows of 20 bits, 2^10 of 11); on a CPU, rank 2's rows stop below that (the interpreter runs a program per
    1,024 elements). Bits: read exactly from a call on ones. Values: each kept one is x * (1 / (1 - p)) computed in
    float32 and rounded to x's dtype, each dropped one 0 ("values_equal"); eager's (x * mask) / (1 - p) is counted in
    units in the last place from it ("max_eager_ulps"). Gradients: the incoming gradient through the same formula."""
    cuda, target = device.kind == "cuda", device.torch_device
    dtype = torch.bfloat16 if cuda else torch.float32
    shapes = [(3, 524_300, 8), (3, 1030, 3, 768)] if cuda else [(3, 300, 40), (3, 1030, 1, 8)]
    keys = RunRandomness([CounterStream(seed) for seed in range(3)]).keys.to(target)  # int32 words, as a group holds them
    draws = torch.tensor([3, 70_001, 2**31 - 5], device=target, dtype=torch.int32)
    threshold, scale = keep_threshold(p), 1 / (1 - p)
    generator = torch.Generator(device=target).manual_seed(0)
    checks = []
    for shape in shapes:
        expected = counter_keep_mask(keys, draws, shape, p)
        bits = dropout_kernel.run_dropout(torch.ones(shape, device=target, dtype=dtype), keys, draws, threshold, p) != 0
        x = torch.randn(shape, device=target, generator=generator).to(dtype).requires_grad_()
        grad_out = torch.randn(shape, device=target, generator=generator).to(dtype)
        out = dropout_kernel.run_dropout(x, keys, draws, threshold, p)
        (grad,) = torch.autograd.grad(out, x, grad_out)
        eager = (x.detach() * expected) / (1 - p)
        checks.append({"mask_bits_equal": bool(torch.equal(bits, expected)), "kept_share": float(expected.float().mean()),
                       "values_equal": bool(torch.equal(out, torch.where(expected, x.detach().float() * scale, 0).to(dtype))),
                       "grads_equal": bool(torch.equal(grad, torch.where(expected, grad_out.float() * scale, 0).to(dtype))),
                       "max_eager_ulps": ulps_apart(eager, out.detach())})
    return {"shapes": [list(shape) for shape in shapes], "dtype": str(dtype).removeprefix("torch."),
            **{name: all(check[name] for check in checks) for name in ("mask_bits_equal", "values_equal", "grads_equal")},
            "max_eager_ulps": max(check["max_eager_ulps"] for check in checks), "kept_share": round(checks[0]["kept_share"], 4)}


def ulps_apart(a: torch.Tensor, b: torch.Tensor) -> int:
    """The most units in the last place between two tensors of one floating dtype, by their bit patterns (a
    value and its neighbour are one apart; +0 and -0 none)."""
    integer = {2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]

    def ordered(t: torch.Tensor) -> torch.Tensor:  # the floats' order as integers: negatives mirrored below zero
        bits = (t + 0.0).view(integer).long()  # + 0.0: -0 becomes +0
        return torch.where(bits < 0, -(bits & ((1 << (8 * a.element_size() - 1)) - 1)), bits)

    return int((ordered(a) - ordered(b)).abs().max()) if a.numel() else 0


def attention_kernel_matches(device: Device) -> dict[str, Any]:
    """Attention calls in the kernel against eager attention, in bf16 on a GPU and float32 on a CPU (Triton's
    interpreter), two shapes each: blocks of 130 rows, so that a row's index sets the hash input's top bit,
    at GLUE's longest length (128 tokens on a GPU, two tiles; 20 here, one); and a few rows at SQuAD's (384 on a
    GPU, six tiles; 150 here, three). The kept positions are read exactly ("mask_bits_equal"): with queries and keys 0 every
    probability is 1 / length, and one-hot values make the output the kept pattern itself, head_size keys at
    a time. Output and gradients: the largest differences from eager float32 attention with a padding mask."""
    cuda = device.kind == "cuda"
    shapes = [(130, 2, 128, 64), (3, 2, 384, 64)] if cuda else [(130, 1, 20, 16), (3, 1, 150, 32)]  # (block rows, heads, length, head size)
    checks = [_one_call_matches(device.torch_device, torch.bfloat16 if cuda else torch.float32, *shape) for shape in shapes]
    return {"shapes": [dict(zip(("block_rows", "heads", "length", "head_size"), shape, strict=True)) for shape in shapes],
            "dtype": "bfloat16" if cuda else "float32", "mask_bits_equal": all(check["mask_bits_equal"] for check in checks),
            **{name: max(check[name] for check in checks) for name in ("max_out_difference", "max_grad_difference", "max_grad")},
            "kept_share": checks[0]["kept_share"]}


def _one_call_matches(target: torch.device, dtype: torch.dtype, block: int, heads: int, length: int, head_size: int,
                      runs: int = 2, p: float = 0.1) -> dict[str, Any]:
    scaling, threshold, rows = head_size**-0.5, keep_threshold(p), runs * block
    keys = RunRandomness([CounterStream(seed) for seed in range(runs)]).keys.to(target)  # int32 words, as a group holds them
    draws = torch.tensor([3, 70_001], device=target, dtype=torch.int32)[:runs]
    zeros = torch.zeros(rows, heads, length, head_size, device=target, dtype=dtype)
    kept = []
    for start in range(0, length, head_size):
        count = min(head_size, length - start)
        one_hot = zeros.clone()
        one_hot[:, :, torch.arange(start, start + count, device=target), torch.arange(count, device=target)] = 1
        out = attention_kernel.run_dropout_attention(zeros, zeros, one_hot, None, keys, draws, threshold, p, scaling)
        kept.append(out.transpose(1, 2)[..., :count] > 0)
    expected = counter_keep_mask(keys, draws, (runs, block, heads, length, length), p).view(rows, heads, length, length)
    generator = torch.Generator(device=target).manual_seed(0)
    query, key, value = (torch.randn(rows, heads, length, head_size, device=target, generator=generator).to(dtype).requires_grad_()
                         for _ in range(3))
    padding = torch.arange(length, device=target) >= torch.randint(1, length + 1, (rows, 1), device=target, generator=generator)
    additive = torch.zeros(rows, 1, length, length, device=target).masked_fill(padding[:, None, None, :], torch.finfo(torch.float32).min)
    grad_out = torch.randn(rows, length, heads, head_size, device=target, generator=generator).to(dtype)
    out = attention_kernel.run_dropout_attention(query, key, value, additive, keys, draws, threshold, p, scaling)
    grads = torch.autograd.grad(out, (query, key, value), grad_out)
    upcast = [tensor.detach().float().requires_grad_() for tensor in (query, key, value)]
    scores = upcast[0] @ upcast[1].transpose(2, 3) * scaling + additive
    reference = ((torch.softmax(scores, -1) * expected / (1 - p)) @ upcast[2]).transpose(1, 2)
    reference_grads = torch.autograd.grad(reference, upcast, grad_out.float())
    return {"mask_bits_equal": bool(torch.equal(torch.cat(kept, dim=-1), expected)), "kept_share": round(float(expected.float().mean()), 4),
            "max_out_difference": float((out.detach().float() - reference.detach()).abs().max()),
            "max_grad_difference": max(float((a.float() - b).abs().max()) for a, b in zip(grads, reference_grads, strict=True)),
            "max_grad": max(float(b.abs().max()) for b in reference_grads)}


class KernelLaunches:
    """The attention kernel's forward launches (the first of attention_kernel._kernels()), the dropout kernel's
    launches, forward and backward (dropout_kernel._kernels()), and the grouped LayerNorm kernel's, forward and
    backward apart (layer_norm_kernel._kernels()), counted (a replayed graph launches nothing: count its capture),
    so that a row labelled "kernel" cannot be eager attention or torch's operators unawares."""

    def __init__(self) -> None:
        self.forward = self.dropout = self.layer_norm = self.layer_norm_backward = 0

    def __enter__(self) -> KernelLaunches:
        attention, dropout, layer_norm = attention_kernel._kernels, dropout_kernel._kernels, layer_norm_kernel._kernels
        self._patches = [
            mock.patch.object(attention_kernel, "_kernels", lambda: tuple(_Launcher(kernel, self, "forward" if index == 0 else None)
                                                                          for index, kernel in enumerate(attention()))),
            mock.patch.object(dropout_kernel, "_kernels", lambda: tuple(_Launcher(kernel, self, "dropout") for kernel in dropout())),
            mock.patch.object(layer_norm_kernel, "_kernels", lambda: tuple(
                _Launcher(kernel, self, counter) for kernel, counter in zip(layer_norm(), ("layer_norm", "layer_norm_backward"), strict=True)))]
        for patch in self._patches:
            patch.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        for patch in self._patches:
            patch.stop()


class _Launcher:
    def __init__(self, kernel: Any, launches: KernelLaunches, counter: str | None) -> None:
        self.kernel, self.launches, self.counter = kernel, launches, counter

    def __getitem__(self, grid: Any) -> Callable[..., Any]:
        def launch(*args: Any, **kwargs: Any) -> Any:
            if self.counter:
                setattr(self.launches, self.counter, getattr(self.launches, self.counter) + 1)
            return self.kernel[grid](*args, **kwargs)
        return launch


def _trained(config: dict[str, Any], method: str, k: int, device: Device, fused: list[tuple], settings: StepSettings, passes: int,
             capture: bool = True) -> tuple[list[float], list[torch.Tensor], int]:
    """A group of k runs trained `passes` passes over the fused steps under `settings` (counter masks; `capture`
    False: the step-graph step without its capture): its step losses, trained tensors and graphs captured."""
    settings = settings.for_masks("counter")
    model, randomness, runs, _ = initialised_group(config, FUSED_METHODS[method], k, device, fused, settings)
    step = _step_function(model, randomness, settings, device, True)
    if isinstance(step, GraphedFusedStep):
        step.capturing_allowed = capture
    losses = [float(loss) for _ in range(passes) for results in _train_pass(step, runs, fused) for loss, _ in results]
    tensors = [p.detach().float().cpu().clone() for run in runs for p in run.params.values()]
    captured = step.captured if isinstance(step, GraphedFusedStep) else 0
    del model, randomness, runs, step
    gc.collect()
    return losses, tensors, captured


def _trained_each_way(config: dict[str, Any], method: str, k: int, device: Device, fused: list[tuple], settings: StepSettings,
                      passes: int, field: str, capture: bool = True
                      ) -> tuple[dict[str, tuple[list[float], list[torch.Tensor], int]], KernelLaunches]:
    """A kernel's check: the same group (_trained) trained once per value of the layer setting `field` (VALUES'), the
    rest of `settings` held; and the kernels' launches over all of them (a torch-operator value launches none)."""
    trained = {}
    with KernelLaunches() as launches:
        for value in VALUES[field]:
            trained[value] = _trained(config, method, k, device, fused, dataclasses.replace(settings, **{field: value}), passes, capture)
    return trained, launches


def _differences(trained: tuple[list[float], list[torch.Tensor], int], reference: tuple[list[float], list[torch.Tensor], int]
                 ) -> dict[str, Any]:
    losses, tensors, captured = trained
    return {"graphs_captured": captured,
            "max_loss_difference": max(abs(a - b) for a, b in zip(losses, reference[0], strict=True)),
            "max_tensor_difference": max(float((a - b).abs().max()) for a, b in zip(tensors, reference[1], strict=True))}


def group_batches(batches: list[Batch], task_count: int, step: int, k: int) -> list[Batch]:
    """Step `step`'s k batches, all of one task (a group is one task's runs), the tasks taken in turn:
    `batches` holds task_count equal blocks, one per task. So every k meets every task alike, and a
    larger k is not timed on longer tasks' batches than a smaller one."""
    per_task = len(batches) // task_count
    task, turn = step % task_count, step // task_count
    return [batches[task * per_task + (turn * k + i) % per_task] for i in range(k)]


def _fused_mask_equals_eager(k: int, device: Device) -> bool | None:
    """Whether the counter masks' one-kernel form (run_dropout.fused_counter_keep_mask) draws the eager
    form's bits, at every block rank a BERT's dropout sites have; None off a GPU, where training draws
    them eagerly (tests/fused/test_run_dropout.py compares the two forms on the CPU)."""
    if device.kind != "cuda":
        return None
    keys = torch.randint(0, 2**32, (k, 2), dtype=torch.int64, device=device.torch_device)
    draws = torch.arange(k, dtype=torch.int64, device=device.torch_device) * 7919
    return _fused_masks_equal(keys, draws, [(k, 32, 768), (k, 32, 12, 64, 64), (k, 32, 48, 768), (k, 32)])


def _fused_masks_equal(keys: torch.Tensor, draws: torch.Tensor, shapes: Sequence[tuple[int, ...]]) -> bool:
    """Whether fused_counter_keep_mask draws counter_keep_mask's bits at every shape, in turn (p = 0.1, BERT's)."""
    return all(torch.equal(fused_counter_keep_mask()(keys, draws, torch.empty(shape, device="meta"), 0.1),
                           counter_keep_mask(keys, draws, shape, 0.1)) for shape in shapes)


def fused_mask_equals_eager_in_training(k: int, device: Device, features: int) -> dict[str, bool]:
    """_fused_mask_equals_eager at a training step's inputs: the draws int32 words (a group's `base + site`, not
    int64 counts), counts past 2^31, and one after another the block shapes a length-grouped pass meets (32 rows;
    the token axis padded to 32, 64, 96, 128: the compiled form's dynamic sizes), each against counter_keep_mask."""
    target = device.torch_device
    keys = RunRandomness([CounterStream(seed) for seed in range(k)]).keys.to(target)
    base = torch.tensor([3 + 7919 * run for run in range(k)], dtype=torch.int32, device=target)
    shapes = [(k, 32, length, features) for length in (32, 64, 96, 128, 64)] + [(k, 32, features)]
    return {name: _fused_masks_equal(keys, draws, shapes)
            for name, draws in (("small_counts", base + 5), ("counts_past_2_31", base + (2**31 - 20_000)))}


def _with_speedups(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    base = next((row["examples_per_s"] for row in rows if row["k"] == 1 and "examples_per_s" in row), None)
    for row in rows:
        if base and "examples_per_s" in row:
            row["speedup_vs_k1"] = round(row["examples_per_s"] / base, 2)  # against one run, the first variant
    return rows


def initialised_group(config: dict[str, Any], method: dict[str, Any], k: int, device: Device, fused: list[tuple],
           settings: StepSettings = StepSettings()) -> tuple[Any, Any, list[GroupedRun], float]:
    """k runs of `method` on one randomly initialised BERT (same initial tensors: speed does not depend on
    them), grouped under `settings`, frozen matmuls in bf16 as training stores them; and one run's training FLOPs
    over the `fused` steps' blocks, counted on the solo model before it is grouped."""
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    with device.torch_device:  # initialised on the GPU: seconds, not a minute of CPU per BERT-large
        model = BertForSequenceClassification(BertConfig(**config, num_labels=2, attn_implementation="sdpa"))
        apply_method(model, method_from_dict(method))
    run_flops = sum(training_flops(model, {"input_ids": inputs["input_ids"][: layout.block_rows]}) for inputs, _, _, layout in fused)
    # Frozen matmuls in the autocast dtype (bf16 on a GPU), as training stores them.
    model, randomness, runs = grouped_runs(model, [trained_tensors(model)] * k, device, device.autocast_dtype, settings)
    return model, randomness, runs, run_flops
