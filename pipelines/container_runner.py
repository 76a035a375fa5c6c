"""kfp.local's DockerRunner with the project's images: the DAG's components run in the images that
`components.images.image_for` names, as the images' own non-root user.

DockerRunner bind-mounts only the pipeline root (at the same path) and refuses extra `volumes`, but
it passes `mounts` (docker.types.Mount) through to the engine. So the run store and the data are
mounted at their host paths, with no copy: the data read-only, the run store read-write. Paths in
the run records (checkpoint_dir) are then the same inside and outside the containers, and the
store is the same one the subprocess runner uses (<out>/store by default).

The image's user (uid 1000) must be able to write the pipeline root and the run store: as root
(CI, this machine's engine) they are handed to that user (chown); as another user they are made
writable by all (chmod), since that user's files cannot be chowned. Works with Docker and with
podman behind its Docker-compatible socket (../shared/tools/container-engine.sh).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from adaptune.core.errors import UserError
from adaptune.core.precision import CPU_BF16_ENV
from adaptune.data.sources import DATA_DIR_ENV, HUB
from adaptune.sweep.spec import ExperimentSpec
from adaptune.sweep.store import RunStore
from components.images import image_for

# What the components see of this environment: thread counts, hashing, offline switches, debug, precision.
# No host path (ADAPTUNE_CACHE_DIR): the containers get the store as a parameter, and the data mount as
# data_dir and $ADAPTUNE_DATA_DIR (set below).
PASSED_ENVIRONMENT = (
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "TOKENIZERS_PARALLELISM",
    "PYTHONHASHSEED",
    "HF_HUB_OFFLINE",
    "HF_DATASETS_OFFLINE",
    "TRANSFORMERS_OFFLINE",
    "ADAPTUNE_DEBUG",
    CPU_BF16_ENV,  # the CPU precision setting (the containers run on this CPU), where the experiment leaves it to the machine
)
ENGINE_HINT = (
    "start Docker, or set DOCKER_HOST to a Docker-compatible socket "
    "(on a machine like CI: bash ../shared/tools/container-engine.sh; eval \"$(bash ../shared/tools/container-engine.sh --env)\")"
)


class EngineError(UserError, RuntimeError):
    """No usable container engine or image; the one-line message says what to do."""


def connect() -> Any:
    """A docker SDK client whose engine answers, else EngineError."""
    try:
        import docker
    except ImportError:
        raise EngineError("the docker SDK is not installed: pip install -r requirements.lock (it pins docker)") from None
    try:
        client = docker.from_env()
        client.ping()
    except Exception as error:  # docker.errors.DockerException, connection errors of every kind
        where = os.environ.get("DOCKER_HOST", "the default socket")
        raise EngineError(f"no container engine answers at {where} ({type(error).__name__}): {ENGINE_HINT}") from None
    return client


def image_user(client: Any, reference: str) -> tuple[int, int] | None:
    """The image's numeric user and group (its USER), or None where it names no numeric user."""
    import docker

    try:
        image = client.images.get(reference)
    except docker.errors.ImageNotFound:
        family = next((f for f in ("cpu", "gpu", "tpu") if f"adaptune-{f}:" in reference), "cpu")
        raise EngineError(
            f"image {reference} is not in the container engine: build it with `make -C containers build-{family}` "
            "(ADAPTUNE_REGISTRY / ADAPTUNE_IMAGE_TAG choose its name), or pull it"
        ) from None
    uid, _, gid = (image.attrs.get("Config") or {}).get("User", "").partition(":")
    if not uid.isdigit():
        return None
    return int(uid), int(gid) if gid.isdigit() else int(uid)


def make_writable(root: Path, user: tuple[int, int] | None) -> None:
    """Let the image's user write under root: chown as root, else open the permissions of what we own."""
    if user is None or os.geteuid() == user[0]:
        return
    uid, gid = user
    paths = [root, *root.rglob("*")]
    if os.geteuid() == 0:
        for path in paths:
            stat = path.lstat()
            if (stat.st_uid, stat.st_gid) != (uid, gid):
                os.lchown(path, uid, gid)
        return
    for path in paths:
        stat = path.lstat()
        if stat.st_uid == os.geteuid() and not path.is_symlink():
            path.chmod(stat.st_mode | (0o777 if path.is_dir() else 0o666))


def is_within(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def passed_environment(spec: ExperimentSpec) -> dict[str, str]:
    """What of this environment the containers get. kfp.local lets a DockerRunner's environment override
    a task's own variables (task_dispatcher._prepare_runner_and_env_vars), so an experiment that pins
    its CPU precision (a task variable) does not get this machine's setting, which would override it."""
    passed = {name: os.environ[name] for name in PASSED_ENVIRONMENT if name in os.environ}
    if spec.accelerator.cpu_precision != "auto":
        passed.pop(CPU_BF16_ENV, None)
    return passed


def docker_runner(spec: ExperimentSpec, pipeline_root: Path, store: RunStore, data_root: Path | None) -> Any:
    """The DockerRunner for `spec`: its images checked present, the store and data mounted, the environment passed."""
    from docker.types import DeviceRequest, Mount
    from kfp import local

    family = spec.accelerator.family
    if family == "tpu":
        raise EngineError("the TPU image runs on Cloud TPU node pools only: run this experiment on Vertex AI or a KFP cluster")
    client = connect()
    try:
        users = {image_user(client, image_for(f)) for f in sorted({"cpu", family})}
    finally:
        client.close()
    pipeline_root.mkdir(parents=True, exist_ok=True)
    writable = [pipeline_root]
    mounts = []
    if store.files.is_local:
        store_root = Path(store.root)
        store_root.mkdir(parents=True, exist_ok=True)
        writable.append(store_root)
        if not is_within(store_root, pipeline_root):
            mounts.append(Mount(target=str(store_root), source=str(store_root), type="bind", read_only=False))
    for root in writable:
        for user in users:
            make_writable(root, user)
    if data_root is not None:
        data_root = Path(data_root).resolve()
        mounts.append(Mount(target=str(data_root), source=str(data_root), type="bind", read_only=True))
    environment = passed_environment(spec)
    # The mirror for the steps that take no data_dir parameter (the report's majority-class baselines),
    # which in the subprocess runner find ../shared/data beside the working tree.
    environment[DATA_DIR_ENV] = str(data_root) if data_root is not None else HUB
    run_args: dict[str, Any] = {"mounts": mounts, "environment": environment}
    if family == "gpu":  # every GPU of the host (NVIDIA container toolkit); not exercised here (no GPU engine)
        run_args["device_requests"] = [DeviceRequest(count=-1, capabilities=[["gpu"]])]
    return local.DockerRunner(**run_args)
