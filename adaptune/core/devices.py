"""Pick the accelerator a run uses: CUDA (bf16 autocast), TPU via torch_xla, else CPU."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
from collections.abc import Iterator

import torch

from adaptune.core import environment
from adaptune.core.errors import UserError
from adaptune.core.precision import CPU_PRECISIONS, cpu_precision_setting


@dataclasses.dataclass(frozen=True)
class Device:
    """Where a run executes and how it casts: `torch_device` for tensors, `name` for records."""

    kind: str  # "cuda" | "xla" | "cpu"
    torch_device: torch.device
    name: str  # human/record label, e.g. "cuda:NVIDIA H100 80GB HBM3", "xla:TPU", "cpu"
    autocast_dtype: torch.dtype | None  # bf16 on CUDA/TPU, and on a CPU with native bf16 unless pinned to float32

    @contextlib.contextmanager
    def autocast(self, cache: bool = True) -> Iterator[None]:
        """Mixed precision where it pays (bf16 needs no loss scaling); a no-op on a float32 CPU. `cache`
        False for a step captured as a CUDA graph, which must not keep casts between replays."""
        if self.autocast_dtype is None:
            yield
            return
        with torch.autocast(device_type=self.kind, dtype=self.autocast_dtype, cache_enabled=cache):
            yield

    @property
    def pad_multiple(self) -> int | None:
        """Pad batch lengths to a multiple of this: tensor-core tiles on CUDA; few distinct shapes
        on XLA, which compiles one graph per shape; none on CPU, where every token costs."""
        return {"cuda": 8, "xla": 64}.get(self.kind)

    def no_grad(self) -> contextlib.AbstractContextManager[None]:
        """Forward passes without autograd: inference mode, but plain no_grad on XLA, whose tensors refuse inference
        mode's ("Cannot set version_counter for inference tensor", torch_xla 2.9)."""
        return torch.no_grad() if self.kind == "xla" else torch.inference_mode()

    def synchronize(self) -> None:
        """Wait for queued device work, so that wall-clock timings are honest."""
        if self.kind == "cuda":
            torch.cuda.synchronize(self.torch_device)
        elif self.kind == "xla":
            import torch_xla  # only importable in the TPU image's environment
            import torch_xla.core.xla_model as xm

            torch_xla.sync()
            xm.wait_device_ops()

    def compiled_graphs(self) -> int | None:
        """Graphs XLA has compiled in this process so far (torch_xla's CompileTime metric: one per new graph, a cached
        one not counted); None off XLA. A run that keeps compiling after its first epoch has a shape that varies."""
        if self.kind != "xla":
            return None
        import torch_xla.debug.metrics as met

        compiled = met.metric_data("CompileTime")
        return int(compiled[0]) if compiled else 0

    def mark_step(self) -> None:
        """XLA builds graphs lazily: cut one per optimizer step; nothing to do elsewhere."""
        if self.kind == "xla":
            import torch_xla

            torch_xla.sync()  # xm.mark_step before torch_xla 2.7 (deprecated since)


def pick_device(prefer: str | None = None, cpu_precision: str | None = None) -> Device:
    """CUDA when present, else TPU when torch_xla is importable, else CPU.

    `prefer` (or $ADAPTUNE_DEVICE) forces one of "cuda", "xla", "cpu"; asking for one that is not
    available is an error, not a silent fallback. On the CPU the frozen backbone runs in bf16 under
    autocast, as on a GPU (named "cpu:bf16" in records), where the CPU multiplies bf16 natively, and in
    float32 elsewhere; `cpu_precision` (else $ADAPTUNE_CPU_BF16) pins one (cpu_precision_setting).
    """
    choice = (prefer or environment.settings().device).strip().lower() or None
    if choice not in (None, "cuda", "xla", "tpu", "cpu"):
        raise ValueError(f"unknown device {choice!r}: use cuda, xla (tpu) or cpu, or leave it unset to pick automatically")
    if choice == "tpu":
        choice = "xla"
    if choice in (None, "cuda") and torch.cuda.is_available():
        index = torch.cuda.current_device()
        return Device("cuda", torch.device("cuda", index), f"cuda:{torch.cuda.get_device_name(index)}", torch.bfloat16)
    if choice in (None, "xla") and importlib.util.find_spec("torch_xla") is not None:
        import torch_xla
        import torch_xla.runtime

        return Device("xla", torch_xla.device(), f"xla:{torch_xla.runtime.device_type()}", torch.bfloat16)
    if choice in ("cuda", "xla"):
        raise RuntimeError(f"device {choice!r} was requested but is not available here; unset ADAPTUNE_DEVICE to use what is")
    if resolved_cpu_precision(cpu_precision) == "bf16":
        if not native_cpu_bf16():
            raise CpuBf16Unsupported(
                f"bf16 was asked for (ADAPTUNE_CPU_BF16=1 or the experiment's cpu_precision) but this CPU "
                f"({torch.backends.cpu.get_cpu_capability()}) has no native bf16 (avx512_bf16 or AMX): its bf16 matmuls are "
                "emulated, about 17x slower than float32; use auto or float32")
        return Device("cpu", torch.device("cpu"), CPU_DEVICE_NAMES["bf16"], torch.bfloat16)
    return Device("cpu", torch.device("cpu"), CPU_DEVICE_NAMES["float32"], None)


CPU_DEVICE_NAMES = {"float32": "cpu", "bf16": "cpu:bf16"}  # a record's `device` for each CPU precision


def resolved_cpu_precision(cpu_precision: str | None = None) -> str:
    """"bf16" or "float32": `cpu_precision` (else $ADAPTUNE_CPU_BF16), auto resolved by this CPU's native bf16."""
    precision = cpu_precision or cpu_precision_setting()
    if precision not in CPU_PRECISIONS:
        raise ValueError(f"unknown CPU precision {precision!r}: use one of {', '.join(CPU_PRECISIONS)}")
    if precision == "auto":
        return "bf16" if native_cpu_bf16() else "float32"
    return precision


class CpuBf16Unsupported(UserError, RuntimeError):
    """bf16 asked for on a CPU that would emulate it: a setting to change, not a missing accelerator."""


def native_cpu_bf16() -> bool:
    """Whether this CPU multiplies bf16 natively (avx512_bf16 or AMX), as oneDNN dispatches it. Without,
    a bf16 matmul is emulated: measured 17x slower than float32 on an AVX2-only AMD EPYC."""
    return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())


def is_out_of_memory(error: BaseException) -> bool:
    """True for an accelerator (or host) allocation failure, which a run records instead of crashing."""
    if isinstance(error, (torch.cuda.OutOfMemoryError, MemoryError)):
        return True
    message = str(error).lower()
    return isinstance(error, RuntimeError) and ("out of memory" in message or "resource_exhausted" in message)


def release_memory(device: Device) -> None:
    """Return cached accelerator memory after a failure, so the next run in this process starts clean."""
    if device.kind == "cuda":
        torch.cuda.empty_cache()
