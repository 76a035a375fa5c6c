"""A fused group's whole training step replayed as one CUDA graph (`ADAPTUNE_COMPILE=step_graphs`).

On a GPU a fused step launches thousands of kernels from host operators and leaves the device idle much of the
time (figures: bench/LOG.md, "Figures moved out of the code's comments"): the host is the bottleneck. Captured
once per input shape, a step is one launch: forward, backward, every run's
clipping and AdamW update. No compiler is involved (torch.compile's CUDA graphs never finished compiling a
group in a GPU call), so capture costs about one eager step.

What a replay needs, and how the step provides it:
- fixed shapes: token axes padded up to a multiple of `LENGTH_BUCKET` (a handful of graphs per run
  group); a shape seen fewer than `warmup` + 1 times just runs eagerly (an epoch's short last step);
  a shorter shape replays a longer captured graph, padded up to it, for its first `PAD_UP_STEPS` steps
  (an eager step and a capture cost the host far more than the padding costs the device);
- no host work inside the step: counter dropout masks (adaptune.fused.run_dropout, "counter"), whose
  draw counts live on the device; each run's torch AdamW (fused, capturable) reading its learning rate
  from a device tensor that the host-side schedule fills between replays; no host sync in the model
  (run_dropout's attention never asks whether a mask has padding);
- warm-up steps on the capture's own stream, so optimizer state and library workspaces exist before
  capture (PyTorch's CUDA graph notes: "whole-network capture").
A group drawing generator masks trains eagerly in this mode. A span task's loss reads each run's own
token count from its labels (group_loop.SPAN_TARGETS), on the device, so its steps replay too. On a
CPU the mode is the eager fused step with the same padding, so every path stays testable there.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
from torch.nn import functional as F

from adaptune.core.devices import Device
from adaptune.fused.group_optimizer import clip_each
from adaptune.fused.run_dropout import RowLayout, RunRandomness
from adaptune.fused.settings import STEP_GRAPHS  # noqa: F401 (the mode that runs this step, named where it is)

LENGTH_BUCKET = 32  # tokens: BERT batches of up to 128 tokens need at most 4 graphs
# Steps of a shape that replay a longer captured graph (same rows, its token axis padded up) before the shape gets
# its own graph: an eager step and a capture cost the host far more than padding a replayed step by a bucket, so a
# shape that comes this rarely is cheaper padded (figures: bench/LOG.md, "Step graphs' constants"). A group's step
# pads to its longest run's batch, so most of its steps meet the longest bucket and the others come rarely.
PAD_UP_STEPS = 32
GRAPH_WARMUP = 1  # eager steps of a shape before its capture (graph_warmup says why)
StepResult = tuple[torch.Tensor, torch.Tensor]


def graph_warmup() -> int:
    """Eager steps of a shape before it is captured: 1 (the first makes the optimizer's state, compiles the shape's
    kernels, sizes library workspaces); a second trained to the same losses and cost the host time of many replayed
    steps (bench/LOG.md, "Step graphs' constants")."""
    return GRAPH_WARMUP


def pad_to_bucket(inputs: dict[str, torch.Tensor], bucket: int = LENGTH_BUCKET) -> dict[str, torch.Tensor]:
    """The inputs with their token axis right-padded with zeros (attention mask 0: padding no real
    position reads) up to a multiple of `bucket`."""
    length = next(iter(inputs.values())).shape[1]
    return pad_to_length(inputs, length + -length % bucket)


def pad_to_length(inputs: dict[str, torch.Tensor], length: int) -> dict[str, torch.Tensor]:
    """The inputs with their token axis right-padded with zeros (attention mask 0) up to `length` tokens."""
    extra = length - next(iter(inputs.values())).shape[1]
    if not extra:
        return inputs
    return {name: F.pad(tensor, (0, extra), value=0) for name, tensor in inputs.items()}


def shape_key(inputs: dict[str, torch.Tensor], labels: torch.Tensor) -> tuple:
    """What a captured graph is for: every input's name and shape, and the labels' shape."""
    return tuple((name, tuple(tensor.shape)) for name, tensor in sorted(inputs.items())), tuple(labels.shape)


def key_length(key: tuple) -> int:
    """A shape key's token axis (every input's axis 1)."""
    inputs, _ = key
    return inputs[0][1][1]


def longer_captured(key: tuple, captured: Iterable[tuple]) -> tuple | None:
    """The captured shape this step can replay padded: of those whose shapes differ from `key`'s only in a longer
    token axis, the shortest; None where none does."""
    def without_length(shape_key: tuple) -> tuple:
        inputs, labels = shape_key
        return tuple((name, shape[:1] + shape[2:]) for name, shape in inputs), labels

    rest = without_length(key)
    longer = [other for other in captured if without_length(other) == rest and key_length(other) > key_length(key)]
    return min(longer, key=key_length, default=None)


@dataclasses.dataclass
class _Captured:
    graph: Any  # torch.cuda.CUDAGraph
    inputs: dict[str, torch.Tensor]
    labels: torch.Tensor
    weights: torch.Tensor
    results: torch.Tensor  # runs x (loss, gradient norm), overwritten by each replay

    def load(self, inputs: dict[str, torch.Tensor], labels: torch.Tensor, weights: torch.Tensor) -> None:
        for name, tensor in inputs.items():
            self.inputs[name].copy_(tensor, non_blocking=True)
        self.labels.copy_(labels, non_blocking=True)
        self.weights.copy_(weights, non_blocking=True)


class GraphedFusedStep:
    """A group's fused training step (group_loop.fused_step's contract: one optimizer step of every run,
    each run's (loss, gradient norm) returned on the device), captured per input shape on CUDA."""

    def __init__(self, model: Callable[..., Any], randomness: RunRandomness, kind: str, device: Device,
                 losses: Callable[..., torch.Tensor], warmup: int | None = None, bucket: int = LENGTH_BUCKET,
                 counted_from: GraphedFusedStep | None = None) -> None:
        self.model, self.randomness, self.kind, self.device, self.losses = model, randomness, kind, device, losses
        self.warmup, self.bucket = graph_warmup() if warmup is None else warmup, bucket
        self.capturing_allowed = device.kind == "cuda" and randomness.scheme == "counter"
        self.graphs: dict[tuple, _Captured] = {}
        self.seen: dict[tuple, int] = {}
        self.padded_up: dict[tuple, int] = {}  # steps of a shape that replayed a longer graph (PAD_UP_STEPS)
        # The record's step_graphs: what the capture cost, what it saved; counted on from the step this one replaces
        # (a group whose runs left: the old graphs held the old stacks).
        self.graphs_before: int = counted_from.graphs_before + counted_from.captured if counted_from else 0
        self.eager_steps: int = counted_from.eager_steps if counted_from else 0
        self.replayed_steps: int = counted_from.replayed_steps if counted_from else 0
        self.padded_up_before: int = counted_from.padded_up_steps if counted_from else 0
        self.unreplayed_s: float = counted_from.unreplayed_s if counted_from else 0.0  # host seconds in eager steps and captures on CUDA
        self.capture_s: float = counted_from.capture_s if counted_from else 0.0  # of which in captures
        if device.kind == "cuda":
            self.stream = torch.cuda.Stream(device.torch_device)
            self.pool = torch.cuda.graph_pool_handle()  # one pool: the graphs never run at once

    @property
    def captured(self) -> int:
        return len(self.graphs)

    @property
    def padded_up_steps(self) -> int:
        return self.padded_up_before + sum(self.padded_up.values())

    def counts(self) -> dict[str, int | float]:
        """This attempt's graphs captured (one per input shape), steps run eagerly (a shape's first steps, and
        every step off CUDA), steps replayed (of which padded up to a longer shape's graph), and the seconds spent
        outside replays, in eager steps and captures, and in captures alone (on a GPU the host's: its eager step is
        bound by the host, and a kernel's first call compiles it there)."""
        return {"graphs": self.graphs_before + self.captured, "eager_steps": self.eager_steps, "replayed_steps": self.replayed_steps,
                "padded_up_steps": self.padded_up_steps, "eager_and_capture_s": round(self.unreplayed_s, 3),
                "capture_s": round(self.capture_s, 3), "warmup": self.warmup}

    def __call__(self, inputs: dict[str, torch.Tensor], labels: torch.Tensor, weights: torch.Tensor, layout: RowLayout,
                 runs: Sequence[Any]) -> list[StepResult]:
        inputs = pad_to_bucket(inputs, self.bucket)
        if self.device.kind != "cuda":
            self.eager_steps += 1
            return self._after(self._step(inputs, labels, weights, layout, runs, skip_non_finite=True), runs)
        self._make_capturable(runs)
        key = shape_key(inputs, labels)
        captured = self.graphs.get(key)
        longer = self.longer_graph_to_replay(key)
        if longer is not None:
            inputs, captured = pad_to_length(inputs, key_length(longer)), self.graphs[longer]
        if captured is None:
            started = time.perf_counter()
            self.seen[key] = self.seen.get(key, 0) + 1
            if not self.capturing_allowed or self.seen[key] <= self.warmup:
                self.eager_steps += 1
                results = self._on_stream(lambda: self._step(inputs, labels, weights, layout, runs))
                self.unreplayed_s += time.perf_counter() - started
                return self._after(results, runs)
            captured = self.graphs[key] = self._capture(inputs, labels, weights, layout, runs)
            capturing = time.perf_counter() - started
            self.unreplayed_s += capturing
            self.capture_s += capturing
        captured.load(inputs, labels, weights)
        captured.graph.replay()
        self.replayed_steps += 1
        return self._after(captured.results.clone(), runs)

    def longer_graph_to_replay(self, key: tuple) -> tuple | None:
        """The longer captured shape a step of shape `key` replays, padded up to it, counted; None where the step
        has its own graph, none is longer, or the shape has had its PAD_UP_STEPS (then it gets its own)."""
        if key in self.graphs or not self.capturing_allowed or self.padded_up.get(key, 0) >= PAD_UP_STEPS:
            return None
        longer = longer_captured(key, self.graphs)
        if longer is not None:
            self.padded_up[key] = self.padded_up.get(key, 0) + 1
        return longer

    def _step(self, inputs: dict[str, torch.Tensor], labels: torch.Tensor, weights: torch.Tensor, layout: RowLayout,
              runs: Sequence[Any], skip_non_finite: bool = False) -> torch.Tensor:
        """Forward, backward, each run's clipping and AdamW: what a graph holds. Runs x (loss, norm). With
        `skip_non_finite` (the CPU, where reading costs nothing) a diverged run is not updated, as alone."""
        self.randomness.layout = layout
        with self.device.autocast(cache=False):  # a graph cannot keep autocast's cast cache between replays
            output = self.model(**inputs)
        losses = self.losses(self.kind, output, labels, weights, layout)
        losses.sum().backward()
        norms = clip_each(runs)
        results = torch.stack([losses.detach().float(), torch.stack(norms).float()], dim=1)
        finite = results.isfinite().all(dim=1).tolist() if skip_non_finite else [True] * len(runs)
        for run, stepping in zip(runs, finite, strict=True):
            if stepping:
                run.optimizer.step()
            run.optimizer.zero_grad(set_to_none=True)
        return results

    def _on_stream(self, work: Callable[[], torch.Tensor]) -> torch.Tensor:
        """Eager steps run on the capture's stream, so what it needs (workspaces, optimizer state) exists first."""
        self.stream.wait_stream(torch.cuda.current_stream(self.device.torch_device))
        with torch.cuda.stream(self.stream):
            results = work()
        torch.cuda.current_stream(self.device.torch_device).wait_stream(self.stream)
        return results

    def _capture(self, inputs: dict[str, torch.Tensor], labels: torch.Tensor, weights: torch.Tensor, layout: RowLayout,
                 runs: Sequence[Any]) -> _Captured:
        static_inputs = {name: tensor.clone() for name, tensor in inputs.items()}
        static_labels, static_weights = labels.clone(), weights.clone()
        graph = torch.cuda.CUDAGraph()
        # Entering torch.cuda.graph synchronizes the device and empties the allocator's cache (the eager steps' blocks)
        with torch.cuda.graph(graph, pool=self.pool, stream=self.stream):
            results = self._step(static_inputs, static_labels, static_weights, layout, runs)
        return _Captured(graph, static_inputs, static_labels, static_weights, results)

    def _after(self, results: torch.Tensor, runs: Sequence[Any]) -> list[StepResult]:
        """Each run's schedule steps on the host (filling its learning-rate tensor: no sync)."""
        for run in runs:
            run.optimizer._opt_called = True  # what optimizer.step() marks for its scheduler
            run.scheduler.step()
        return [(row[0], row[1]) for row in results.unbind(0)]

    def _make_capturable(self, runs: Sequence[Any]) -> None:
        """Each run's AdamW as a graph replays it: fused, capturable, its learning rate a device tensor the
        schedule fills in place, each tensor's step count its own device tensor (adamw_together shares one
        per run on the host). Once per optimizer (a tensor lr says it is done); saving turns them back
        (state.saved_optimizer_state)."""
        for run in runs:
            optimizer = run.optimizer
            if torch.is_tensor(optimizer.param_groups[0]["lr"]):
                continue
            for group in optimizer.param_groups:
                group["lr"] = torch.tensor(float(group["lr"]), dtype=torch.float32, device=self.device.torch_device)
                group["capturable"], group["fused"], group["foreach"] = True, True, None
                for param in group["params"]:
                    state = optimizer.state.get(param)
                    if state and torch.is_tensor(state.get("step")):
                        state["step"] = torch.tensor(float(state["step"]), dtype=torch.float32, device=self.device.torch_device)
