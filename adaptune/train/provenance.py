"""What made a result: code version, package versions, device, and the data files' fingerprint.

Every record the run store publishes carries this dict under `provenance` (adaptune.sweep.shard_runner), so a
number in a table can be traced to the code, libraries, accelerator and bytes of data behind it.
Computed once per process and task (hashing MNLI's 300 MB train file takes about a second).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import os
import platform
import socket
import subprocess
from pathlib import Path
from typing import Any

from adaptune.core import environment

CODE_VERSION_ENV = "ADAPTUNE_CODE_VERSION"  # baked into the images at build time (containers/Makefile)
PACKAGES = ("adaptune", "torch", "transformers", "datasets", "tokenizers", "huggingface-hub", "safetensors", "numpy",
            "scikit-learn", "scipy", "pandas", "pyarrow", "fsspec", "gcsfs", "kfp")
_REPO_ROOT = Path(__file__).resolve().parents[2]


def provenance(task: str, data_dir: str | os.PathLike[str] | None) -> dict[str, Any]:
    """The provenance dict of a run of `task` on the data in `data_dir` (None: the hub)."""
    from adaptune.data.tasks import data_scheme

    return {
        "code_version": code_version(),
        "image": environment.settings().image or None,  # None outside a pipeline task, as records have it
        "packages": package_versions(),
        "python": platform.python_version(),
        "host": socket.gethostname(),
        "device": device_details(),
        "data_scheme": data_scheme(task),
        "data": data_files_sha256(task, str(data_dir) if data_dir else None),
    }


@functools.cache
def code_version() -> str:
    """$ADAPTUNE_CODE_VERSION (the images'), else `git describe` of this source tree, else "unknown"."""
    if version := environment.settings().code_version:
        return version
    try:
        described = subprocess.run(["git", "describe", "--always", "--dirty", "--abbrev=12"], cwd=_REPO_ROOT,
                                   capture_output=True, text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return described.stdout.strip() or "unknown"


@functools.cache
def package_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


@functools.cache
def device_details() -> dict[str, Any]:
    """The accelerator as the run saw it: GPU name, count, CUDA runtime, driver; or the CPU."""
    import torch

    details: dict[str, Any] = {"torch_cuda": torch.version.cuda, "cpu_count": os.cpu_count(), "machine": platform.machine()}
    if torch.cuda.is_available():
        index = torch.cuda.current_device()
        details.update(kind="cuda", name=torch.cuda.get_device_name(index), count=torch.cuda.device_count(),
                       capability=".".join(map(str, torch.cuda.get_device_capability(index))), driver=nvidia_driver())
    else:
        details.update(kind="cpu", name=platform.processor() or platform.machine())
    return details


def nvidia_driver() -> str | None:
    """The NVIDIA kernel driver's version (/proc/driver/nvidia/version, as nvidia-smi reports it)."""
    try:
        text = Path("/proc/driver/nvidia/version").read_text()
    except OSError:
        return None
    for word in text.split():
        if word.count(".") >= 1 and word.replace(".", "").isdigit():
            return word
    return None


@functools.cache
def data_files_sha256(task: str, data_dir: str | None) -> dict[str, Any]:
    """sha256 of each of the task's source files in the local mirror; the hub dataset id without one."""
    from adaptune.data.prepared import PreparedData, is_prepared
    from adaptune.data.sources import resolve_data_dir
    from adaptune.data.tasks import get_task

    spec = get_task(task)
    root = resolve_data_dir(data_dir)
    if is_prepared(root):  # the source's, as the preparation step read it, and the folder the run read
        prepared = PreparedData.open(root)
        return {**prepared.info(spec)["provenance"], "prepared": prepared.task_dir(spec).name}
    if root is None:
        return {"source": "hub", "dataset": spec.source.hub_id, "config": spec.source.hub_config}
    files = {}
    for _, relative in spec.source.files:
        path = root / relative
        if path.is_file():
            with open(path, "rb") as handle:
                files[relative] = hashlib.file_digest(handle, "sha256").hexdigest()
    return {"source": "mirror", "files": files}
