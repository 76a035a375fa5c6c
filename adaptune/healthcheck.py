"""`python -m adaptune.healthcheck`: import the library and report the accelerator this environment sees.

The container images run this as their HEALTHCHECK, so the default check is passive: it reads what
torch (and torch_xla, in the TPU image) can see without claiming the device, because a TPU is
exclusive to one process and a periodic probe must not fight the training job for it. `--smoke`
also runs one small matmul on the device through `adaptune.core.devices.pick_device`, the path training
takes; use it once at startup (`docker run ... python -m adaptune.healthcheck --require gpu --smoke`).

Exit status: 0 healthy, 1 unhealthy (the message says what is missing and what to do), 2 bad usage.
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import importlib.util
import json
import sys
from typing import Any

REQUIREMENTS = ("any", "gpu", "tpu")
# TPU chips appear as /dev/accel* (v4 and earlier) or VFIO groups (v5e and later).
TPU_DEVICE_GLOBS = ("/dev/accel[0-9]*", "/dev/vfio/[0-9]*")


class UnhealthyError(RuntimeError):
    """The environment cannot do what was required of it."""


@dataclasses.dataclass(frozen=True)
class DeviceReport:
    kind: str  # "cuda" | "tpu" | "cpu"
    name: str  # e.g. "NVIDIA H100 80GB HBM3", "TPU", "cpu"
    count: int  # visible accelerators (CPU: usable torch threads)
    bf16: bool | None  # native bf16 on the accelerator; None on CPU (runs use fp32 there)
    detail: str  # compute capability, TPU device files, or thread count
    adaptune_version: str
    torch_version: str
    transformers_version: str

    def summary(self) -> str:
        if self.kind == "cuda":
            device = f"cuda: {self.count}x {self.name} ({self.detail}, bf16 {'yes' if self.bf16 else 'no'})"
        elif self.kind == "tpu":
            device = f"tpu: {self.count} chip(s) ({self.detail})"
        else:
            device = f"cpu ({self.detail})"
        return (
            f"adaptune {self.adaptune_version} (torch {self.torch_version}, "
            f"transformers {self.transformers_version}): {device}"
        )


def probe_device() -> DeviceReport:
    """What this environment can run on, without claiming the device: CUDA, else TPU, else CPU."""
    import torch
    import transformers

    import adaptune

    versions = {
        "adaptune_version": adaptune.__version__,
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
    }
    if torch.cuda.is_available():
        count = torch.cuda.device_count()
        major, minor = torch.cuda.get_device_capability(0)
        return DeviceReport(
            kind="cuda",
            name=torch.cuda.get_device_name(0),
            count=count,
            # Native bf16 (Ampere and newer); emulated bf16 on older cards would be slow, not healthy.
            bf16=torch.cuda.is_bf16_supported(including_emulation=False),
            detail=f"compute capability {major}.{minor}, CUDA {torch.version.cuda}",
            **versions,
        )
    tpu_devices = _tpu_device_files()
    if tpu_devices and importlib.util.find_spec("torch_xla") is not None:
        import torch_xla

        return DeviceReport(
            kind="tpu",
            name="TPU",
            count=len(tpu_devices),
            bf16=True,
            detail=f"torch_xla {torch_xla.__version__}, devices {' '.join(tpu_devices)}",
            **versions,
        )
    return DeviceReport(
        kind="cpu", name="cpu", count=torch.get_num_threads(), bf16=None,
        detail=f"{torch.get_num_threads()} torch threads", **versions,
    )


def check_requirement(report: DeviceReport, require: str) -> None:
    """Raise UnhealthyError when the environment lacks the accelerator the image exists for."""
    if require == "gpu":
        if report.kind != "cuda":
            raise UnhealthyError(
                f"--require gpu, but torch sees no CUDA device{_why_no_cuda(report.torch_version)}. Run the adaptune-gpu image on a GPU node "
                "(Kubernetes: resources.limits nvidia.com/gpu; docker: --gpus all)."
            )
        if not report.bf16:
            raise UnhealthyError(
                f"--require gpu: {report.name} ({report.detail}) has no native bf16, which the GPU runs "
                "use for autocast. Use an Ampere-or-newer GPU (A100, L4, H100)."
            )
    elif require == "tpu":
        if importlib.util.find_spec("torch_xla") is None:
            raise UnhealthyError("--require tpu, but torch_xla is not installed: run the adaptune-tpu image.")
        if report.kind != "tpu":
            raise UnhealthyError(
                "--require tpu, but no TPU device file is visible "
                f"(looked for {', '.join(TPU_DEVICE_GLOBS)}). Run on a TPU node "
                "(Kubernetes: resources.limits google.com/tpu)."
            )
    elif require != "any":
        raise ValueError(f"unknown requirement {require!r}; expected one of {REQUIREMENTS}")


def smoke_test() -> str:
    """Run one small bf16-autocast matmul where training would run; return the device's record name."""
    import torch

    from adaptune.core.devices import pick_device

    device = pick_device()
    a = torch.randn(64, 64, device=device.torch_device)
    with device.autocast():
        product = a @ a.T
    device.mark_step()
    device.synchronize()
    # a @ a.T has a non-negative diagonal; a NaN or negative value means the kernels are broken.
    if not bool(torch.isfinite(product).all()) or float(product.diagonal().min()) < 0:
        raise UnhealthyError(f"a test matmul on {device.name} gave wrong values: the device or its driver is faulty")
    return device.name


def add_health_arguments(parser: argparse.ArgumentParser) -> None:
    """The health check's flags, for this module's entry point and `python -m adaptune health`."""
    parser.add_argument("--require", choices=REQUIREMENTS, default="any", help="fail unless this accelerator is usable")
    parser.add_argument("--smoke", action="store_true", help="also run a small matmul on the device (claims it)")
    parser.add_argument("--json", action="store_true", help="print the report as one JSON object")


def health_from_args(args: argparse.Namespace) -> int:
    """Probe, check, optionally smoke-test, print; return the exit status (0 healthy, 1 not)."""
    result: dict[str, Any] = {"healthy": False, "require": args.require}
    try:
        report = probe_device()
        result.update(dataclasses.asdict(report))
        check_requirement(report, args.require)
        if args.smoke:
            result["smoke_device"] = smoke_test()
        result["healthy"] = True
    except Exception as error:  # any failure (an import included) is an unhealthy environment
        result["error"] = str(error) if isinstance(error, UnhealthyError) else f"{type(error).__name__}: {error}"

    if args.json:
        print(json.dumps(result, sort_keys=True))
    elif result["healthy"]:
        print(f"healthy: {report.summary()}" + (f"; smoke test passed on {result['smoke_device']}" if args.smoke else ""))
    else:
        print(f"unhealthy: {result['error']}", file=sys.stderr)
    return 0 if result["healthy"] else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m adaptune.healthcheck", description=__doc__.splitlines()[0])
    add_health_arguments(parser)
    return health_from_args(parser.parse_args(argv))


def _tpu_device_files() -> list[str]:
    return sorted(path for pattern in TPU_DEVICE_GLOBS for path in glob.glob(pattern))


def _why_no_cuda(torch_version: str) -> str:
    import torch

    if torch.version.cuda is None:
        return f" (torch {torch_version} is a CPU-only build)"
    return f" (the build has CUDA {torch.version.cuda}; check the node's NVIDIA driver and that a GPU was requested)"


if __name__ == "__main__":
    sys.exit(main())
