"""Failed-run reasons are one line ("ExceptionType: message"); the full traceback goes to traceback.txt."""

from __future__ import annotations

import importlib.util
import os
import stat
import traceback
from pathlib import Path

import pytest

from adaptune.train.record import TRACEBACK_FILE, one_line_reason, save_traceback

# A real module on disk, so that Python 3.11+ prints source lines with ^^^^ markers in its traceback.
FAILING_MODULE = '''
def lookup(table):
    return table["missing"]["deeper"]


def load(path):
    try:
        return lookup({})
    except KeyError as error:
        raise ValueError(f"{path}: line 3: bad row\\n  expected 3 fields | found 2") from error
'''


@pytest.fixture
def failing(tmp_path: Path):
    source = tmp_path / "failing_module.py"
    source.write_text(FAILING_MODULE)
    spec = importlib.util.spec_from_file_location("failing_module", source)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _traceback_of(call) -> tuple[BaseException, str]:
    try:
        call()
    except Exception as error:  # noqa: BLE001
        return error, traceback.format_exc()
    raise AssertionError("expected an exception")


def test_reason_from_a_real_traceback_is_the_last_exception_on_one_line(failing) -> None:
    error, text = _traceback_of(lambda: failing.load("train.tsv"))
    assert "^^^" in text and "\n" in text  # what a raw traceback looks like: markers and many lines
    reason = one_line_reason(text)
    assert reason == "ValueError: train.tsv: line 3: bad row expected 3 fields | found 2"
    assert one_line_reason(error) == reason  # the exception itself gives the same line
    assert one_line_reason(text[-150:]) == reason  # a traceback cut at its start (failed_run_record keeps the tail)


def test_reason_drops_markers_and_module_paths_and_is_bounded(failing) -> None:
    _, text = _traceback_of(lambda: failing.lookup({}))
    assert one_line_reason(text) == "KeyError: 'missing'"
    _, text = _traceback_of(lambda: _raise_data_error())
    assert one_line_reason(text) == "DataError: dev.tsv: the validation split is empty"
    long = one_line_reason(RuntimeError("x" * 5000))
    assert len(long) == 500 and long.endswith("…")
    assert one_line_reason(KeyError("unknown experiment 'x'")) == "KeyError: unknown experiment 'x'"
    assert one_line_reason(RuntimeError()) == "RuntimeError"


def _raise_data_error() -> None:
    from adaptune.data.sources import DataError

    raise DataError("dev.tsv: the validation split is empty")


def test_save_traceback_keeps_the_full_story_group_readable(failing, tmp_path: Path) -> None:
    saved = os.umask(0o022)
    try:
        error, text = _traceback_of(lambda: failing.load("train.tsv"))
        path = save_traceback(tmp_path / "runs" / "rte-full-s0-x", error)
    finally:
        os.umask(saved)
    assert path == tmp_path / "runs" / "rte-full-s0-x" / TRACEBACK_FILE
    written = path.read_text()
    assert written == text  # both tracebacks, chained, with source lines
    assert "KeyError: 'missing'" in written and "The above exception was the direct cause" in written
    assert stat.S_IMODE(path.stat().st_mode) & stat.S_IRGRP
    try:
        failing.lookup({})
    except KeyError:
        assert "KeyError" in save_traceback(tmp_path / "now").read_text()  # the exception being handled
    assert save_traceback(tmp_path / "text", "Traceback ...\nValueError: x").read_text().endswith("ValueError: x\n")


def _finished(task: str, predicted: dict, val: float = 0.69, test: float = 0.69) -> dict:
    from adaptune.train.config import TrainConfig
    from adaptune.train.record import run_record

    record = run_record(TrainConfig(task=task, method={"name": "adapters", "size": 8, "init_std": 1e-2}, lr=1e-3, seed=0, epochs=3), "accuracy")
    record.update(val_metrics={"accuracy": val}, test_metrics={"accuracy": test}, predicted_classes=predicted)
    return record


@pytest.mark.parametrize(("predicted", "splits"), [
    ({"validation": 3, "test": 1}, "test"),  # the LoRA 8: mixed on validation, one class on test
    ({"validation": 1, "test": 2}, "validation"),
    ({"validation": 1, "test": 1}, "validation and test"),
])
def test_one_class_on_either_split_is_degenerate_when_a_run_finishes_and_when_its_record_is_read(predicted, splits):
    from adaptune.report.results import run_row
    from adaptune.train.record import DEGENERATE_RULE, degenerate_reason

    record = _finished("disasters", predicted)
    reason = degenerate_reason(record)
    assert reason is not None and f"all one class on {splits}" in reason and DEGENERATE_RULE in reason
    row = run_row(record)  # a record kept with status "ok" reads as the rule says
    assert row["status"] == "degenerate" and row["reason"] == reason


def test_a_run_predicting_several_classes_everywhere_or_a_regression_run_stays_ok():
    from adaptune.report.results import run_row
    from adaptune.train.record import degenerate_reason

    assert degenerate_reason(_finished("disasters", {"validation": 2, "test": 2})) is None
    assert degenerate_reason(_finished("stsb", {"validation": 1, "test": 1})) is None  # no classes to count
    assert run_row(_finished("disasters", {}))["status"] == "ok"  # a record that kept no counts says nothing new
