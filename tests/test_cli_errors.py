"""What a user meets at the command line: `python -m adaptune ...` with bad input ends in exactly one
line on stderr that names the problem, exit code 2, and nothing created on disk; --debug (or
ADAPTUNE_DEBUG=1) adds the traceback; a failed run exits 1, a finished one 0.

Each case runs the real CLI in a subprocess on the real shared data and the embedded backbone. The
checks run before any model or data is loaded, so even the cases that import torch stay short.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from adaptune.cli import main

REPO_ROOT = Path(__file__).resolve().parents[1]
RTE_HEADER = "index\tsentence1\tsentence2\tlabel\n"


@dataclass(frozen=True)
class Case:
    name: str
    args: tuple[str, ...]  # {data}: the shared data dir, {tmp}: this test's temp dir, {mirror}: a broken copy
    says: tuple[str, ...]  # facts the one line must mention
    code: int = 2
    mirror: dict[str, str] = field(default_factory=dict)  # files of a small broken data mirror, when needed


def _rte_rows(data: Path, n: int) -> str:
    return "".join((data / "glue/RTE/train.tsv").read_text(encoding="utf-8").splitlines(keepends=True)[1 : n + 1])


TRAIN = ("train", "--data-dir", "{data}", "--out", "{tmp}/run", "--cache-dir", "{tmp}/cache", "--no-progress")
CASES = [
    # Refused before torch is imported.
    Case("unknown task", (*TRAIN, "--task", "rtee"), ("unknown task 'rtee'", "did you mean rte")),
    Case("nan lr", (*TRAIN, "--task", "rte", "--lr", "nan"), ("lr must be a finite number > 0", "nan")),
    Case("inf lr", (*TRAIN, "--task", "rte", "--lr", "inf"), ("lr must be a finite number > 0", "inf")),
    Case("negative lr", (*TRAIN, "--task", "rte", "--lr=-1e-3"), ("lr must be a finite number > 0", "-0.001")),
    Case("zero epochs", (*TRAIN, "--task", "rte", "--epochs", "0"), ("epochs must be a whole number >= 1", "got 0")),
    Case("conflicting method flags", (*TRAIN, "--task", "rte", "--method", "full", "--top-k", "2"),
         ("give one of --method, --adapter-size, --top-k", "--method, --top-k")),
    Case("init std without adapters", (*TRAIN, "--task", "rte", "--method", "full", "--init-std", "1e-3"),
         ("--init-std applies to adapters only",)),
    Case("not a number", (*TRAIN, "--task", "rte", "--lr", "fast"), ("argument --lr", "invalid float value: 'fast'", "--help")),
    Case("no task", TRAIN, ("required: --task",)),
    Case("unknown command", ("trian", "--task", "rte"), ("invalid choice: 'trian'",)),
    # Refused after reading the method registry or the backbone's config, before any weights or data.
    Case("unknown method", (*TRAIN, "--task", "rte", "--method", "adaptors:64"), ("unknown method 'adaptors'", "known methods")),
    Case("top_k deeper than the backbone", (*TRAIN, "--task", "rte", "--top-k", "7"),
         ("top_k k=7 exceeds the 6 Transformer layers", "all-MiniLM-L6-v2", "1..6")),
    Case("missing backbone path", (*TRAIN, "--task", "rte", "--backbone", "/nonexistent"),
         ("backbone path /nonexistent does not exist",)),
    Case("hub name offline", (*TRAIN, "--task", "rte", "--backbone", "gpt2"),
         ("backbone 'gpt2'", "hub is unreachable", "local directory")),
    Case("missing data dir", ("train", "--data-dir", "{tmp}/nowhere", "--out", "{tmp}/run", "--task", "rte"),
         ("data dir", "nowhere does not exist")),
    Case("task file not in the mirror", (*TRAIN, "--task", "qnli"), ("qnli: train file not found", "glue/QNLI/train.tsv")),
    # Refused after reading the task's files, still before the run directory or the model.
    Case("malformed data file", ("train", "--data-dir", "{mirror}", "--out", "{tmp}/run", "--task", "rte"),
         ("glue/RTE/train.tsv: line 22", "expected 4 fields", "found 3"),
         mirror={"glue/RTE/train.tsv": RTE_HEADER + "{rows20}" + "99\tonly two\tfields\n", "glue/RTE/dev.tsv": RTE_HEADER + "{rows20}"}),
    Case("empty dev split", ("train", "--data-dir", "{mirror}", "--out", "{tmp}/run", "--task", "rte"),
         ("test split is empty", "glue/RTE/dev.tsv"),
         mirror={"glue/RTE/train.tsv": RTE_HEADER + "{rows20}", "glue/RTE/dev.tsv": RTE_HEADER}),
    # Other commands.
    Case("tasks with a missing data dir", ("tasks", "--data-dir", "{tmp}/nowhere"), ("data dir", "does not exist")),
    Case("unknown experiment", ("plan", "smoek"), ("unknown experiment 'smoek'", "did you mean smoke")),
    Case("render of a corrupt results dir", ("render", "{mirror}", "--out", "{tmp}/run"),
         ("runs.parquet cannot be read", "truncated"), mirror={"runs.parquet": "PAR1 not really parquet"}),
]


def _run(args: tuple[str, ...], env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items() if k != "ADAPTUNE_DEBUG"}
    environment.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONPATH=str(REPO_ROOT), **(env or {}))
    return subprocess.run([sys.executable, "-m", "adaptune", *args], capture_output=True, text=True, env=environment,
                          cwd=REPO_ROOT, timeout=300)


def _expand(case: Case, data: Path, tmp: Path) -> tuple[str, ...]:
    mirror = tmp / "mirror"
    for relative, text in case.mirror.items():
        (mirror / relative).parent.mkdir(parents=True, exist_ok=True)
        (mirror / relative).write_text(text.replace("{rows20}", _rte_rows(data, 20)), encoding="utf-8")
    return tuple(arg.format(data=data, tmp=tmp, mirror=mirror) for arg in case.args)


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_bad_input_is_one_line_exit_2_and_nothing_on_disk(case: Case, shared_data_dir: Path, tmp_path: Path) -> None:
    result = _run(_expand(case, shared_data_dir, tmp_path))
    lines = result.stderr.splitlines()
    assert result.returncode == case.code, result.stderr
    assert len(lines) == 1, f"expected one line on stderr, got:\n{result.stderr}"
    line = lines[0]
    assert line.startswith("adaptune") and ": error: " in line
    for fact in case.says:
        assert fact in line, f"{fact!r} not in {line!r}"
    assert "Traceback" not in line and "^^^" not in line
    assert result.stdout == ""
    assert not (tmp_path / "run").exists(), "bad input must leave no run directory behind"
    assert not (tmp_path / "cache").exists()


def test_debug_flag_and_env_show_the_traceback_before_the_same_line(shared_data_dir: Path, tmp_path: Path) -> None:
    plain = _run(("train", "--task", "rtee", "--out", str(tmp_path / "run")))
    for args, env in ((("--debug", "train", "--task", "rtee"), None), (("train", "--task", "rtee", "--debug"), None),
                      (("train", "--task", "rtee"), {"ADAPTUNE_DEBUG": "1"})):
        result = _run((*args, "--out", str(tmp_path / "run")), env)
        assert result.returncode == 2
        assert "Traceback (most recent call last)" in result.stderr and "UnknownTaskError" in result.stderr
        assert result.stderr.splitlines()[-1] == plain.stderr.strip()
    assert not (tmp_path / "run").exists()


def test_train_help_shows_the_defaults(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "250")  # no wrapping inside a default
    with pytest.raises(SystemExit) as exit_:
        main(["train", "--help"])
    assert exit_.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    for default in ("(default: adapters:64)", "(default: 0.0003)", "(default: 3)", "(default: 0)", "(default: 32)",
                    "(default: adhoc)", "(default: all-MiniLM-L6-v2, embedded: works offline)", "(default: runs/<run_id>)",
                    "(default: the task's standard, 384"):
        assert default in text, default
    assert "(default: None)" not in text and "(default: False)" not in text


def test_internal_errors_are_one_line_pointing_at_debug(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import adaptune.data.task_table

    def broken(*args, **kwargs):
        raise RuntimeError("a bug\nover two lines")

    monkeypatch.setattr(adaptune.data.task_table, "format_task_table", broken)
    monkeypatch.delenv("ADAPTUNE_DEBUG", raising=False)
    assert main(["tasks"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("adaptune tasks: internal error: RuntimeError: a bug over two lines") and "--debug" in err


@pytest.mark.slow
# A run that finishes exits 0 whether it learned ("ok") or predicts one class on its 8 validation rows
# ("degenerate", a result too); one that diverges exits 1.
@pytest.mark.parametrize("lr, code, statuses", [(1e-3, 0, ("ok", "degenerate")), (1e6, 1, ("failed",))])
def test_a_finished_run_exits_0_and_a_failed_run_exits_1(lr: float, code: int, statuses: tuple[str, ...], shared_data_dir: Path,
                                                         tmp_path: Path) -> None:
    args = ("train", "--task", "rte", "--method", "full", "--lr", str(lr), "--epochs", "1", "--batch-size", "8",
            "--max-train-examples", "24", "--max-eval-examples", "8", "--max-length", "32", "--data-dir", str(shared_data_dir),
            "--out", str(tmp_path / "run"), "--cache-dir", str(tmp_path / "cache"), "--no-progress")
    result = _run(args)
    assert result.returncode == code, result.stderr
    assert (tmp_path / "run" / "record.json").is_file()
    assert json.loads(result.stdout)["status"] in statuses
    if code == 0:  # one line per epoch, with its validation score, on stderr
        assert "epoch 1/1: train_loss" in result.stderr and "val accuracy" in result.stderr


@pytest.mark.slow  # builds a whole report (figures) in a subprocess
def test_report_goes_on_without_an_unreadable_curves_file(tmp_path: Path) -> None:
    from test_report_errors import _records

    from adaptune.report.results import CURVES_FILE, write_results

    write_results(_records(), tmp_path / "results")
    (tmp_path / "results" / CURVES_FILE).write_bytes(b"not parquet")
    result = _run(("render", str(tmp_path / "results"), "--out", str(tmp_path / "report")))
    assert result.returncode == 0, result.stderr
    warning, = result.stderr.splitlines()  # one line
    assert warning.startswith("adaptune render: warning: ") and str(tmp_path / "results" / CURVES_FILE) in warning
    assert (tmp_path / "report" / "report.md").is_file()
