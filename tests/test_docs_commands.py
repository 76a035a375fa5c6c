"""Every command the README and docs/ show in a shell block works on a fresh clone after `make demo`.

The clone is a folder of links to this checkout's files beside a `shared/` (as a clone sits next to the data), with the
demo's outputs (the smoke_run fixture's) copied to outputs/smoke. Each command is taken in the documents' order:
- the cheap ones run there (plans, status, reports, comparisons, bundles and predictions on the demo's store, the
  settings, the task list) and must exit 0;
- the others (training, the demo and the suite themselves, compiling, submitting, anything on a gs:// store) are
  parsed: a `make` line by `make -n`, every `python -m adaptune|pipelines` command it would run (or the document's
  own) by the project's own argument parsers;
- every relative path a command names exists, or lies under what an earlier command writes (--out, --into, --output,
  make run/report's outputs/<name>); no command names an absolute path (one machine's).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]
SHELL_BLOCK = re.compile(r"^```(?:bash|sh|shell)\n(.*?)^```", re.S | re.M)
# What a command may do here in seconds: read a store, plan, report, bundle and serve the demo's two tasks.
RUN_MAKE = {"plan", "status", "report"}
RUN_PIPELINES = {"plan", "show", "status", "report", "compare"}
RUN_ADAPTUNE = {"tasks", "settings", "health", "plan", "render", "bundle", "predict"}
WRITES = ("--out", "--into", "--output")
# What a fresh clone lacks: git's folder, outputs, and the environments made on first use (a made one leaves `make -n` nothing to show).
NOT_IN_A_CLONE = {".git", "outputs", "runs", ".pytest_cache", "__pycache__", ".venv-xla", ".venv-adapters"}


@dataclass
class Command:
    document: str
    text: str
    words: list[str]


def shell_commands() -> list[Command]:
    commands = []
    for document in DOCUMENTS:
        for block in SHELL_BLOCK.findall(document.read_text(encoding="utf-8")):
            for line in block.replace("\\\n", " ").splitlines():
                words = shlex.split(line, comments=True)
                if words:
                    commands.append(Command(document.relative_to(REPO_ROOT).as_posix(), line.split(" #")[0].strip(), words))
    return commands


def _python_module(words: list[str]) -> tuple[str, list[str]] | None:
    """("adaptune" | "pipelines" | ..., its arguments) for `python -m X ...` (any python), else None."""
    if len(words) >= 3 and Path(words[0]).name.startswith("python") and words[1] == "-m":
        return words[2], words[3:]
    return None


def _parse(module: str, args: list[str]) -> None:
    """The project's own parser accepts the arguments (argparse exits on an unknown flag or a bad value)."""
    if module == "adaptune":
        from adaptune.cli import build_parser as adaptune_parser

        parser = adaptune_parser(args[0] if args and not args[0].startswith("-") else None)
    elif module == "pipelines":
        from pipelines.__main__ import build_parser as pipelines_parser

        parser = pipelines_parser()
    else:
        return  # pytest and the benchmarks' modules: `make -n` found the target
    try:
        parser.parse_args(args)
    except SystemExit as exit_:
        raise AssertionError(f"python -m {module} {shlex.join(args)}: its parser refused it (exit {exit_.code})") from None


def _should_run(command: Command) -> bool:
    if any("gs://" in word for word in command.words):
        return False
    if command.words[0] == "make":
        return len(command.words) > 1 and command.words[1] in RUN_MAKE
    module = _python_module(command.words)
    if module and module[1]:
        return module[1][0] in {"adaptune": RUN_ADAPTUNE, "pipelines": RUN_PIPELINES}.get(module[0], set())
    return False


def _written_by(command: Command) -> list[str]:
    words = command.words
    written = [words[i + 1] for i, word in enumerate(words[:-1]) if word in WRITES]
    if words[0] == "make" and len(words) > 1 and words[1] in {"run", "report", "demo"}:
        pipeline = next((word.split("=", 1)[1] for word in words if word.startswith("PIPELINE=")), "smoke")
        written.append(f"outputs/{Path(pipeline).stem}")
    return written


def _named_paths(command: Command) -> list[str]:
    values = [word.split("=", 1)[1] if re.match(r"^(--[\w-]+|[A-Z_]+)=", word) else word for word in command.words]
    return [value for value in values if "/" in value and "://" not in value and not value.startswith(("-", ".venv/", "python"))]


@pytest.fixture(scope="module")
def clone(smoke_run: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    top = tmp_path_factory.mktemp("fresh")
    root = top / "adaptune"
    root.mkdir()
    (top / "shared").symlink_to(REPO_ROOT.parent / "shared")
    for entry in REPO_ROOT.iterdir():
        if entry.name not in NOT_IN_A_CLONE:
            (root / entry.name).symlink_to(entry)
    demo = smoke_run["runs.parquet"].parent
    shutil.copytree(demo, root / "outputs" / "smoke", ignore=shutil.ignore_patterns("kfp_root"))
    return root


@pytest.mark.slow
@pytest.mark.xdist_group("containers")  # shares the smoke_run fixture (the demo's outputs) with the other smoke tests
def test_every_command_the_documents_show_runs_or_parses(clone: Path) -> None:
    commands = shell_commands()
    assert len(commands) >= 20, "the documents' shell blocks were not found"
    environment = {**os.environ, "PYTHONPATH": str(clone)}
    environment.pop("ADAPTUNE_RUNS_ROOT", None)
    written: list[str] = []
    ran, parsed = [], []
    for command in commands:
        where = f"{command.document}: {command.text}"
        absolute = [word for word in command.words if word.startswith("/") or "=/" in word]
        assert not absolute, f"{where} names an absolute path, one machine's: {absolute}"
        writes = _written_by(command)
        for path in _named_paths(command):
            assert (clone / path).exists() or any(path == out or path.startswith(out.rstrip("/") + "/") for out in written + writes), \
                f"{where}: {path} neither exists in a fresh clone after the demo nor is written by an earlier command"
        if _should_run(command):
            words = [sys.executable, *command.words[1:]] if _python_module(command.words) else command.words
            process = subprocess.run(words, cwd=clone, env=environment, capture_output=True, text=True, timeout=600)
            assert process.returncode == 0, f"{where} exited {process.returncode}:\n{process.stdout[-2000:]}\n{process.stderr[-2000:]}"
            ran.append(command.text)
        else:
            module = _python_module(command.words)
            if command.words[0] == "make":
                dry = subprocess.run(["make", "-n", *command.words[1:]], cwd=clone, env=environment, capture_output=True, text=True,
                                     timeout=120)
                assert dry.returncode == 0, f"{where}: make -n refused it:\n{dry.stderr}"
                made = [_python_module(shlex.split(line)) for line in dry.stdout.replace("\\\n", " ").splitlines() if " -m " in line]
                assert any(made), f"{where}: make -n runs no python -m command:\n{dry.stdout}"
                for found in filter(None, made):
                    _parse(*found)
            elif module:
                _parse(*module)
            else:
                raise AssertionError(f"{where}: not a command of the project's (make, python -m adaptune|pipelines)")
            parsed.append(command.text)
        written += writes
    print(f"\n{len(commands)} commands in the documents' shell blocks: {len(ran)} run, {len(parsed)} parsed")
    assert len(ran) >= 10 and parsed
