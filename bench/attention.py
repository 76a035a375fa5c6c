"""What the attention kernel, and the dropout kernel and the LayerNorm kernel beside it, take off a fused step's memory
traffic (`make bench-attention`, JSON out), counted on the CPU: a proxy for a GPU, where the step replayed as CUDA graphs
is bound by its elementwise passes (bench/gpu.json "h100_2026_11_26_step_graphs": the device busy 96.5% of the step at
7-12% MFU). Counter masks are counted as the one kernel each a GPU draws them with.

For a fused group of BERT-base-width adapter runs (frozen matmuls in bf16 under bf16 autocast, each frozen layer's query,
key and value one matmul as the trainers always stack them there (adaptune.fused.frozen_projections), counter masks), one
training step's torch operators and the bytes their outputs take: eager attention, the attention kernel
(adaptune.fused.kernels.attention), then with the hidden-state dropout kernel (adaptune.fused.kernels.dropout, its launch
computed by torch outside the census), then with the runs' LayerNorms in one kernel (adaptune.fused.kernels.layer_norm),
each added to the ones before: each configuration one StepSettings (CONFIGURATIONS), passed to the group as the trainer
passes it. (The census's other configurations, the projections separate, a bf16 residual stream and the adapters' sums in
their matmuls, went with those options; bench/attention_kernel.json keeps their figures.)

The kernels are torch custom operators, so the census sees each call as one operator writing its outputs; what it
does inside stays on chip on a GPU (but for the LayerNorm kernel's partial sums of its scales' gradients, a few per
cent of its input gradient's bytes, which the census does not see). The attention and LayerNorm kernels' launches are
skipped and their outputs allocated as zeros: a count of outputs needs no values, and under Triton's interpreter one
census at 128 tokens ran past 25 minutes (the counts are the same: 0.766 GiB a layer either way). Per Transformer
layer: the step of a 2-layer model less that of a 1-layer one. Bytes written are a floor on a GPU's traffic (every
output is also read at least once); views write nothing and are not counted. Not a timing.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any
from unittest import mock

# The kernels apply on a CPU only under Triton's interpreter (their launches are skipped), chosen before triton is imported.
os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes  # noqa: E402

from adaptune.fused import run_dropout  # noqa: E402
from adaptune.fused.kernels import attention as attention_kernel  # noqa: E402
from adaptune.fused.kernels import dropout as dropout_kernel  # noqa: E402
from adaptune.fused.kernels import layer_norm as layer_norm_kernel  # noqa: E402
from adaptune.fused.settings import StepSettings  # noqa: E402

BERT_BASE_WIDTH = {"hidden_size": 768, "num_attention_heads": 12, "intermediate_size": 3072}
ROWS = 32  # a run's batch
_VIEWS = {"view", "_unsafe_view", "transpose", "t", "expand", "unsqueeze", "squeeze", "select", "slice", "alias", "detach",
          "permute", "unbind", "as_strided", "split", "reshape"}


class _Census(TorchDispatchMode):
    """Operators dispatched and the bytes of the tensors they return (views excluded)."""

    def __init__(self) -> None:
        super().__init__()
        self.operators: Counter[str] = Counter()
        self.bytes = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        if name not in _VIEWS:
            self.count(name, out)
        return out

    def count(self, name: str, out: Any) -> None:
        self.operators[name] += 1
        results = out if isinstance(out, (tuple, list)) else [out]
        self.bytes += sum(t.numel() * t.element_size() for t in results if isinstance(t, torch.Tensor))


def _one_kernel_masks(census: _Census) -> Any:
    """counter_keep_mask as a GPU runs it (run_dropout.fused_counter_keep_mask: one kernel writing the bool
    mask), not as its ~25 eager integer operators on this CPU: counted as one operator and its mask."""
    eager = run_dropout.counter_keep_mask

    def masks(*args: Any, **kwargs: Any) -> torch.Tensor:
        with _disable_current_modes():
            mask = eager(*args, **kwargs)
        census.count("counter_keep_mask", mask)
        return mask

    return mock.patch.object(run_dropout, "counter_keep_mask", masks)


# The masks' own function, not _one_kernel_masks' counting stand-in: the dropout kernel draws its masks inside.
_COUNTER_KEEP_MASK = run_dropout.counter_keep_mask
# What each census compares: the step settings of each configuration (eager steps: nothing here is captured).
CONFIGURATIONS = {
    "eager": StepSettings(dropout_masks="counter"),
    "kernel": StepSettings(dropout_masks="counter", attention="kernel"),
    "kernel+dropout_kernel": StepSettings(dropout_masks="counter", attention="kernel", dropout="kernel"),
    "kernel+dropout_kernel+layer_norm_kernel": StepSettings(dropout_masks="counter", attention="kernel", dropout="kernel", layer_norm="kernel"),
}


def _dropout_kernel_by_torch() -> Any:
    """The dropout kernel's launch computed with torch operators outside the census (the interpreter would take
    about 16 s a call at BERT-base width): the custom operator around it is still counted once, with its output,
    which is all a GPU's kernel writes. The same values: x * keep * scale, keep counter_keep_mask's."""
    class Launch:
        def __getitem__(self, grid: Any) -> Any:
            def launch(x: torch.Tensor, out: torch.Tensor, keys: torch.Tensor, draws: torch.Tensor, lines: int, block_rows: int,
                       tokens: int, features: int, threshold: int, scale: float, **constexprs: Any) -> None:  # dropout_triton's
                with _disable_current_modes():
                    keep = _COUNTER_KEEP_MASK(keys, draws, x.shape, threshold / 2**32)
                    out.copy_((x.float() * keep * scale).to(out.dtype))
            return launch

    patches = contextlib.ExitStack()
    patches.enter_context(mock.patch.object(dropout_kernel, "_kernels", lambda: (Launch(),)))
    # bf16 as a GPU runs it (no float32 detour, which only Triton's interpreter needs)
    patches.enter_context(mock.patch.object(dropout_kernel, "interpreted_bf16", lambda blocks: False))
    return patches


class _SkippedLaunches:
    """A kernel table whose launches do nothing."""

    def __getitem__(self, grid: Any) -> Any:
        return lambda *args, **kwargs: None


class _ZerosForOutputs:
    """torch for a kernel's module, but the tensors it allocates for a skipped launch's outputs start as zeros (finite:
    a step's finiteness check keeps its runs), not as whatever memory held."""

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)

    @staticmethod
    def empty(*args: Any, **kwargs: Any) -> torch.Tensor:
        return torch.zeros(*args, **kwargs)

    @staticmethod
    def empty_like(tensor: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        return torch.zeros_like(tensor, **kwargs)

    @staticmethod
    def empty_strided(size: Any, stride: Any, **kwargs: Any) -> torch.Tensor:
        return torch.empty_strided(size, stride, **kwargs).zero_()


def _kernels_counted_not_run() -> Any:
    """The attention and LayerNorm kernels' custom operators, each still one counted operator with its outputs, without
    running their launches (and in bf16 as a GPU runs them: no float32 detour for the interpreter)."""
    patches = contextlib.ExitStack()
    for module, kernels in ((attention_kernel, 3), (layer_norm_kernel, 2)):
        patches.enter_context(mock.patch.object(module, "_kernels", lambda kernels=kernels: (_SkippedLaunches(),) * kernels))
        patches.enter_context(mock.patch.object(module, "interpreted_bf16", lambda *args: False))
        patches.enter_context(mock.patch.object(module, "torch", _ZerosForOutputs()))
    return patches


def step_census(layers: int, k: int, length: int, configuration: str) -> tuple[int, int]:
    """(operators, bytes written) of one warm fused step of k adapter runs at `length` tokens."""
    from transformers import BertConfig, BertForSequenceClassification

    from adaptune.core.devices import Device
    from bench.fused import step_fn

    with tempfile.TemporaryDirectory() as directory, _dropout_kernel_by_torch(), _kernels_counted_not_run():
        torch.manual_seed(0)
        BertForSequenceClassification(BertConfig(**BERT_BASE_WIDTH, num_hidden_layers=layers)).save_pretrained(directory)
        ids = torch.randint(1000, 2000, (ROWS, length), generator=torch.Generator().manual_seed(0))
        batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "token_type_ids": torch.zeros_like(ids),
                 "labels": torch.randint(0, 2, (ROWS,))}
        device = Device("cpu", torch.device("cpu"), "cpu:bf16", torch.bfloat16)  # as a GPU's step runs: bf16 autocast
        step = step_fn(directory, k, device, batch, bf16=True, settings=CONFIGURATIONS[configuration])
        step()  # warm: optimizer state allocated
        census = _Census()
        with census, _one_kernel_masks(census):
            step()
    return sum(census.operators.values()), census.bytes


def measure(k: int, lengths: tuple[int, ...]) -> list[dict[str, Any]]:
    rows = []
    for length in lengths:
        per_layer = {}
        for configuration in CONFIGURATIONS:
            one, two = step_census(1, k, length, configuration), step_census(2, k, length, configuration)
            per_layer[configuration] = {"operators": two[0] - one[0], "gib_written": round((two[1] - one[1]) / 2**30, 3)}
            print(f"length {length} {configuration}: {per_layer[configuration]} per layer", file=sys.stderr)
        rows.append({"k": k, "rows_per_run": ROWS, "length": length, "per_layer": per_layer,
                     "written_share_left": {configuration: round(per_layer[configuration]["gib_written"] / per_layer["eager"]["gib_written"], 3)
                                            for configuration in CONFIGURATIONS if configuration != "eager"}})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="bench/attention_kernel.json")
    parser.add_argument("--k", type=int, default=2, help="runs in the group: bytes grow with k alike both ways")
    parser.add_argument("--lengths", default="40,128", help="tokens per row: GLUE's mean padded length on a GPU (39.8), and 128")
    args = parser.parse_args(argv)
    torch.set_num_threads(max(1, (os.cpu_count() or 1)))
    result = {"what": __doc__.split("\n\n")[0].replace("\n", " "), "backbone": "BERT-base width (768, 12 heads of 64), random init",
              "proxy": True, "torch": torch.__version__,
              "groups": measure(args.k, tuple(int(length) for length in args.lengths.split(",")))}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["groups"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
