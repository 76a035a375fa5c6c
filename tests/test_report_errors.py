"""What a broken results directory or an ugly failure reason does to the report: a clear one-line
error for an unreadable runs.parquet, a warning (not a dead report) for an unreadable curves.parquet,
and failure reasons that never break the Markdown table they sit in."""

from __future__ import annotations

import re
import warnings
from pathlib import Path
from typing import Any

import pytest

from adaptune.report import build_report
from adaptune.report.results import CURVES_FILE, RUNS_FILE, ResultsReadError, ResultsWarning, read_results, write_results
from adaptune.train.config import TrainConfig
from adaptune.train.record import run_record

UGLY_REASON = 'Traceback (most recent call last):\n  File "x.py", line 1\nValueError: lr | too high\nsee the log'


def _records() -> list[dict[str, Any]]:
    """One finished run with a learning curve, one failed run whose reason has newlines and a `|`."""
    ok_config = TrainConfig(task="rte", method={"name": "adapters", "size": 8}, epochs=2)
    ok = run_record(ok_config, "accuracy", "cpu")
    ok.update(best_epoch=2, val_metrics={"accuracy": 0.61}, trained_params=100, total_params=1000, wall_time_s=1.0,
              curve=[{"epoch": e, "step": 4 * e, "train_loss": 0.7, "val_metrics": {"accuracy": 0.6}} for e in (1, 2)])
    failed = run_record(TrainConfig(task="rte", method={"name": "full"}, lr=1e6), "accuracy", "cpu")
    failed.update(status="failed", reason=UGLY_REASON)
    return [ok, failed]


@pytest.fixture
def results_dir(tmp_path: Path) -> Path:
    write_results(_records(), tmp_path / "results")
    return tmp_path / "results"


def _unescaped_pipes(line: str) -> int:
    return len(re.findall(r"(?<!\\)\|", line))


def test_failure_reasons_with_newlines_and_pipes_stay_in_their_row(results_dir: Path, tmp_path: Path) -> None:
    report = build_report(results_dir, tmp_path / "report")
    table = (tmp_path / "report" / "tables" / "excluded_runs.md").read_text().strip().splitlines()
    header_pipes = _unescaped_pipes(table[0])
    assert len(table) == 3  # header, rule, the one failed run: no row split by the reason's newlines
    assert all(_unescaped_pipes(line) == header_pipes for line in table)
    assert "ValueError: lr \\| too high see the log" in table[2]
    assert "ValueError: lr \\| too high see the log" in report.read_text()
    assert read_results(results_dir)["runs"]["reason"].str.contains("\n").any()  # the store keeps the text as it was


def test_unreadable_runs_parquet_is_one_line_naming_the_file(results_dir: Path) -> None:
    runs = results_dir / RUNS_FILE
    runs.write_bytes(runs.read_bytes()[: len(runs.read_bytes()) // 2])  # truncated, as by a full disk
    with pytest.raises(ResultsReadError) as error:
        read_results(results_dir)
    message = str(error.value)
    assert str(runs) in message and "\n" not in message
    assert "truncated" in message


def test_unreadable_curves_parquet_is_left_out_with_a_warning(results_dir: Path, tmp_path: Path) -> None:
    (results_dir / CURVES_FILE).write_bytes(b"not parquet at all")
    with pytest.warns(ResultsWarning, match=re.escape(str(results_dir / CURVES_FILE))):
        frames = read_results(results_dir)
    assert frames["curves"].empty and len(frames["runs"]) == 2

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = build_report(results_dir, tmp_path / "report")
    assert any(issubclass(w.category, ResultsWarning) for w in caught)  # the caller still sees it
    text = report.read_text()
    assert "Left out, unreadable" in text and CURVES_FILE in text
    assert "1 ok, 1 failed" in text
