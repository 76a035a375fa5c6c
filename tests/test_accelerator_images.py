"""The GPU and TPU images built here from their Dockerfiles and run (heavy: each build is minutes and several GB, run on
purpose with make test-heavy): the health check, then a shard of the smoke experiment as train_shard runs it. The GPU
image on the CPU (no GPU here: it proves the image is complete, its CUDA torch falling back to the CPU); the TPU image
on XLA's CPU device (PJRT_DEVICE=CPU) under the TPU preset.

Both take PyPI's torch builds, which this machine reaches (the PyTorch index it does not): the GPU Dockerfile's
documented CUDA 13.0 alternative, and the TPU Dockerfile's PyPI alternative (torch 2.9.0 with its CUDA libraries, which
the TPU never loads). Sizes and build times: bench/xla.json's `images`.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.test_containers import CONTAINERS, in_image, set_up_engine

BUILD_TIMEOUT_S = 40 * 60
PYPI_TORCH = "--network host --build-arg TORCH_INDEX_URL=https://pypi.org/simple --build-arg TORCH_LOCAL_VERSION="
TAG = "localhost/adaptune"
# One shard of the smoke experiment as train_shard runs it (its store /store, its data /data), its records summed up.
SMOKE_SHARD = """
import dataclasses, json, sys
from adaptune.sweep.experiments import get_experiment
from adaptune.sweep.plan import plan
from adaptune.sweep.shard_runner import run_shard
from adaptune.sweep.spec import ACCELERATORS
from adaptune.sweep.store import RunStore
spec = dataclasses.replace(get_experiment("smoke"), accelerator=ACCELERATORS[sys.argv[1]])
shard = plan(spec).shards[1]
outcomes = run_shard(spec, shard.id, RunStore("/store"), data_dir="/data")
print(json.dumps({"outcomes": dict(outcomes), "devices": sorted({RunStore("/store").record(run.run_id)["device"] for run in shard.runs})}))
"""
# The official python:3.11-slim image is a shared build (libpython3.11.so.1.0, which torch_xla's extension links); the
# container engine's stand-in of it is Debian's python3, which lacks the library. Where it does, the stand-in gets
# Debian's libpython3.11, as the official image has it (https://github.com/docker-library/python: --enable-shared).
BASE = "docker.io/library/python:3.11-slim-bookworm"
SHARED_LIBPYTHON = """FROM {base}
RUN apt-get update -qq && apt-get install -y -qq --no-install-recommends libpython3.11 && rm -rf /var/lib/apt/lists/*
"""


def build(accelerator: str, engine: dict[str, str], log: Path) -> str:
    """make -C containers build-<accelerator> with PyPI's torch; the image's reference (build output in `log`)."""
    env = {name: value for name, value in os.environ.items() if name not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES")}
    with log.open("w") as handle:
        done = subprocess.run(["make", "--no-print-directory", "-C", str(CONTAINERS), f"build-{accelerator}", f"REGISTRY={TAG}", "TAG=test",
                               f"DOCKER_BUILD_FLAGS={PYPI_TORCH}"], stdout=handle, stderr=subprocess.STDOUT, env={**env, **engine},
                              timeout=BUILD_TIMEOUT_S)
    tail = "\n".join(log.read_text().splitlines()[-30:])
    assert done.returncode == 0, f"make -C containers build-{accelerator} failed:\n{tail}"
    return f"{TAG}/adaptune-{accelerator}:test"


def shared_libpython_in_base(work: Path) -> None:
    status, _ = in_image(BASE, "sh", "-c", "ldconfig -p | grep -q libpython3.11.so.1.0")
    if status != 0:
        (work / "Dockerfile").write_text(SHARED_LIBPYTHON.format(base=BASE))
        subprocess.run(["docker", "build", "--network", "host", "-q", "-t", BASE, str(work)], check=True, capture_output=True, timeout=600)


@pytest.fixture(scope="module", params=["gpu", "tpu"])
def accelerator_image(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    with pytest.MonkeyPatch.context() as monkeypatch:
        engine = set_up_engine(monkeypatch)
        work = tmp_path_factory.mktemp(f"image-{request.param}")
        if request.param == "tpu":
            shared_libpython_in_base(work)
        yield request.param, build(request.param, engine, work / "build.log")


@pytest.mark.container
@pytest.mark.heavy
@pytest.mark.xdist_group("containers")
def test_the_accelerator_image_is_healthy_and_trains_a_smoke_shard(accelerator_image: tuple[str, str], tmp_path: Path,
                                                                   shared_data_dir: Path) -> None:
    accelerator, image = accelerator_image
    environment = {"PJRT_DEVICE": "CPU", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    status, out = in_image(image, "python", "-m", "adaptune.healthcheck", "--json", "--smoke", environment=environment)
    report = json.loads(out.strip().splitlines()[-1])
    assert status == 0 and report["healthy"] is True, out
    if accelerator == "tpu":
        assert report["smoke_device"] == "xla:CPU" and report["torch_version"].startswith("2.9.0"), report
    else:  # PyPI's CUDA 13.0 build of the lock's torch, on the CPU
        assert report["smoke_device"].startswith("cpu") and report["torch_version"].endswith("+cu130"), report
    status, out = in_image(image, "python", "-m", "adaptune.healthcheck", "--require", accelerator)  # no GPU or TPU here
    assert status != 0 and out.startswith("unhealthy: --require"), out
    store = tmp_path / "store"
    store.mkdir(mode=0o777)
    store.chmod(0o777)
    preset = {"gpu": "cpu", "tpu": "tpu_v5e"}[accelerator]  # the GPU image on the CPU's preset: no CUDA device to take the H100's
    status, out = in_image(image, "python", "-c", SMOKE_SHARD, preset, environment={**environment, "ADAPTUNE_DEVICE": "xla" if accelerator == "tpu" else "cpu"},
                           volumes={str(shared_data_dir): {"bind": "/data", "mode": "ro"}, str(store): {"bind": "/store", "mode": "rw"}},
                           wait_s=60 * 60)
    result = json.loads(out.strip().splitlines()[-1])
    assert status == 0 and result["outcomes"].get("ok", 0) + result["outcomes"].get("degenerate", 0) == 4, out[-3000:]
    if accelerator == "tpu":
        assert result["devices"] == ["xla:CPU"], result
    else:
        assert all(device.startswith("cpu") for device in result["devices"]), result
