"""What aggregate logs as KFP Metrics: run counts, accelerator-hours, each method's mean over the tasks it was
measured on, called a GLUE mean only where it covers every GLUE column."""

from __future__ import annotations

import pytest

from adaptune.data.tasks import GLUE_SCORE_TASKS, get_task
from adaptune.sweep.console_metrics import sweep_metrics
from adaptune.train.config import TrainConfig
from adaptune.train.record import run_record


def record(task: str, method: dict, lr: float, seed: int, validation: float, reported: float, status: str = "ok") -> dict:
    config = TrainConfig(task=task, method=method, lr=lr, epochs=3, seed=seed)
    metric = get_task(task).primary_metric
    result = run_record(config, metric)
    result.update(status=status, val_metrics={metric: validation}, test_metrics={metric: reported}, wall_time_s=1800.0)
    return result


def test_each_mean_is_of_each_methods_configuration_best_on_validation_and_named_for_its_tasks() -> None:
    full, adapters = {"name": "full"}, {"name": "adapters", "size": 64}
    records = [
        record("rte", full, 1e-4, 0, 0.70, 0.60), record("rte", full, 1e-4, 1, 0.72, 0.62),  # best on validation: mean 61
        record("rte", full, 3e-4, 0, 0.60, 0.90),  # better reported, worse on validation: not selected
        record("sst2", full, 1e-4, 0, 0.90, 0.91),
        record("rte", adapters, 1e-3, 0, 0.65, 0.66),
        record("sms_spam", adapters, 1e-3, 0, 0.99, 0.99),  # not GLUE
        record("rte", adapters, 3e-3, 0, 0.50, 0.50, status="failed"),
    ]
    metrics = sweep_metrics(records, planned=10, accelerators_per_run=2)
    assert metrics["runs_planned"] == 10 and metrics["runs_finished"] == 7
    assert (metrics["runs_ok"], metrics["runs_failed"], metrics["runs_degenerate"]) == (6, 1, 0)
    assert metrics["accelerator_hours"] == pytest.approx(7 * 0.5 * 2)
    # Two GLUE tasks, or one, are not GLUE: each mean is named for what it averages.
    assert metrics["mean_2_glue_tasks_full"] == pytest.approx((61 + 91) / 2)
    assert metrics["rte_adapters64"] == pytest.approx(66)
    assert metrics["sms_spam_adapters64"] == pytest.approx(99)  # an additional task: never in a GLUE mean
    assert not [name for name in metrics if name.startswith("glue_mean")]


def test_a_glue_mean_covers_every_glue_column() -> None:
    full = {"name": "full"}
    records = [record(task, full, 1e-4, 0, 0.80, 0.70) for task in GLUE_SCORE_TASKS]
    records += [record(task, full, 1e-4, 0, 0.80, 0.50) for task in ("disasters", "sms_spam")]
    metrics = sweep_metrics(records, planned=11, accelerators_per_run=1)
    assert metrics["glue_mean_full"] == pytest.approx(70) and metrics["mean_2_extra_tasks_full"] == pytest.approx(50)
    metrics = sweep_metrics(records[1:], planned=11, accelerators_per_run=1)  # CoLA missing: 8 of GLUE's 9 columns
    assert "glue_mean_full" not in metrics and metrics["mean_8_glue_tasks_full"] == pytest.approx(70)
