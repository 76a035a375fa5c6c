"""One door for what a user can fix (adaptune.core.errors.UserError), one retrain policy (adaptune.sweep.retrain),
and the three errors that used to reach a user through the wrong door: `pipelines run` over a runs root that is a
file, over a store holding an unreadable record, and a lease file of garbage bytes."""

from __future__ import annotations

import ast
import builtins
from pathlib import Path
from typing import Any

import pytest

from adaptune.core.errors import UserError
from adaptune.sweep.lease import LeaseWatch, current_lease, lease_owner
from adaptune.sweep.plan import plan
from adaptune.sweep.retrain import FLAGS, RetrainPolicy
from adaptune.sweep.store import RunStore
from tests.gcs_emulator import gcs_emulator

REPO = Path(__file__).resolve().parents[1]
# Every exception class a user can fix (found by name wherever it lives): each subclasses UserError beside its builtin base.
USER_FIXABLE = {
    "SettingError", "ConfigError", "BackboneError", "RunDirError", "UnknownTaskError", "DataNotFoundError", "DataError",
    "MalformedFileError", "UnsupportedModelError", "SchemaError", "ResultsReadError", "PlanError", "SpecError",
    "UnknownExperimentError", "CheckpointError", "StoreError", "UnreadableFileError", "BundleError", "SelectionError",
    "PredictInputError", "IncompleteSweepError", "StagingError", "ShardEnvironmentError", "CpuBf16Unsupported", "EngineError",
}
BUILTIN_BASES = {"UnknownExperimentError": KeyError, "DataNotFoundError": FileNotFoundError, "UnsupportedModelError": TypeError}


def _write(store: RunStore, parts: tuple[str, ...], content: bytes) -> None:
    path = Path(store.root, *parts)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)


def test_every_user_fixable_error_is_a_user_error_and_keeps_its_builtin_base() -> None:
    import importlib

    found = {}
    for path in [*(REPO / "adaptune").rglob("*.py"), *(REPO / "pipelines").rglob("*.py")]:
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef) and node.name in USER_FIXABLE:
                module = ".".join(path.relative_to(REPO).with_suffix("").parts)
                found[node.name] = getattr(importlib.import_module(module), node.name)
    assert set(found) == USER_FIXABLE
    for name, cls in found.items():
        assert issubclass(cls, UserError), cls
        builtin = BUILTIN_BASES.get(name)
        if builtin is not None:
            assert issubclass(cls, builtin), cls
        assert any(base.__module__ == "builtins" and base is not Exception and issubclass(cls, base)
                   for base in vars(builtins).values() if isinstance(base, type) and issubclass(base, Exception)), cls


def test_one_settings_error_and_no_exception_named_as_a_string() -> None:
    import pipelines.submit
    import pipelines.submit_checks
    from adaptune.cli import USER_ERRORS, is_user_error
    from adaptune.core.environment import SettingError

    assert not hasattr(pipelines.submit, "SettingsError") and pipelines.submit_checks.SettingError is SettingError
    assert all(isinstance(cls, type) for cls in USER_ERRORS)
    assert is_user_error(SettingError("x")) and is_user_error(FileNotFoundError("x")) and not is_user_error(RuntimeError("x"))
    strings = [node.value for node in ast.walk(ast.parse((REPO / "adaptune" / "cli.py").read_text()))
               if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.endswith("Error")]
    assert strings == []


def test_no_verb_means_two_things_in_the_two_command_lines() -> None:
    from adaptune.cli import build_parser as adaptune_parser
    from pipelines.__main__ import build_parser as pipelines_parser

    def verbs(parser: Any) -> set[str]:
        return set(next(action for action in parser._actions if action.dest == "command").choices)

    # `plan` is the same in both (an experiment's runs and their cost); `report` is pipelines' alone (it aggregates a
    # run store), adaptune's rendering of Parquet already written is `render`.
    assert verbs(adaptune_parser()) & verbs(pipelines_parser()) == {"plan"}


def test_the_retrain_policy_is_three_flags_only_at_the_pipeline_boundary() -> None:
    policy = RetrainPolicy.from_flags(retry_failed=True, retry_unreadable=True)
    assert policy == RetrainPolicy(failed=True, unreadable=True) and not policy.stale
    assert policy.as_flags() == {"retry_failed": True, "retrain_stale": False, "retry_unreadable": True}
    assert RetrainPolicy.from_flags(**RetrainPolicy(stale=True).as_flags()) == RetrainPolicy(stale=True)
    with pytest.raises(AttributeError):
        policy.failed = False  # type: ignore[misc]  # frozen: passed down whole, never changed on the way
    carriers = []
    for path in [*(REPO / "adaptune").rglob("*.py"), *(REPO / "pipelines").rglob("*.py"), *(REPO / "components").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                arguments = {arg.arg for arg in [*node.args.args, *node.args.kwonlyargs]}
                if arguments & set(FLAGS):
                    carriers.append(f"{path.relative_to(REPO)}:{node.name}")
    # The component's inputs, the pipeline's parameters, and the one conversion from them.
    assert sorted(carriers) == ["adaptune/sweep/retrain.py:from_flags", "components/steps.py:train_shard",
                                "pipelines/reproduction.py:reproduction"]


def test_a_runs_root_that_is_a_file_is_refused_by_run_before_the_dag_starts_in_the_line_status_says(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from pipelines.__main__ import main

    (tmp_path / "a-file").write_text("")
    with gcs_emulator(log_dir=tmp_path) as emulator:
        RunStore(emulator.url("")).files.fs.pipe_file(RunStore(emulator.url("object")).files.path(), b"not a folder")
        for root in (str(tmp_path / "a-file"), str(tmp_path / "a-file" / "under"), emulator.url("object")):
            assert main(["status", "smoke", "--runs-root", root]) == 2
            status_line = capsys.readouterr().err
            out = tmp_path / "out"
            assert main(["run", "smoke", "--out", str(out), "--runs-root", root]) == 2
            captured = capsys.readouterr()
            assert captured.err == status_line and captured.err.count("\n") == 1 and "is a file, not a folder" in captured.err
            assert captured.out == "" and not (out / "kfp_root").exists()  # nothing ran


def test_run_over_an_unreadable_record_is_one_line_naming_the_file_before_the_dag_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from adaptune.sweep.experiments import get_experiment
    from pipelines.__main__ import main

    store = RunStore(tmp_path / "store")
    broken = plan(get_experiment("smoke")).runs[0].run_id
    _write(store, ("runs", broken, "record.json"), b'{"run_id": "' + broken.encode() + b'", "sta')
    out = tmp_path / "out"
    assert main(["run", "smoke", "--out", str(out), "--runs-root", store.root]) == 2
    captured = capsys.readouterr()
    (line,) = captured.err.splitlines()
    assert line.startswith(f"error: {store.root}/runs/{broken}/record.json is not readable JSON")
    assert line.endswith("train the run again with --retry-unreadable (RETRY_UNREADABLE=1), which keeps the file aside")
    assert captured.out == "" and not (out / "kfp_root").exists()


def test_a_garbage_lease_is_named_with_its_file_and_why_and_the_waiting_line_is_said_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from adaptune.sweep.run_attempt import _take_lease

    store = RunStore(tmp_path / "store")
    _write(store, ("runs", "r1", "lease-1.json"), b"\x00garbage{")
    owner = lease_owner(current_lease(store, "r1")[1])
    assert owner.startswith(f"an unreadable lease ({store.root}/runs/r1/lease-1.json is not readable JSON (")
    _write(store, ("runs", "r2", "lease-1.json"), b"[1, 2]")
    assert lease_owner(current_lease(store, "r2")[1]) == f"an unreadable lease ({store.root}/runs/r2/lease-1.json is not a lease " \
                                                         "(a JSON list, not an object))"

    now = [0.0]  # a clock the waits advance: the lease ends once unchanged for a lease length, after many polls
    slept = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        now[0] += seconds

    lease = _take_lease("r1", store, "waiter", True, sleep, LeaseWatch(clock=lambda: now[0]))
    lease.release()
    waiting = [line for line in capsys.readouterr().out.splitlines() if line.endswith("; waiting")]
    assert len(slept) > 2 and len(waiting) == 1
    assert waiting[0].startswith(f"r1: held by {owner}, taken over in at most ")
