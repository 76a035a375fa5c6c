"""What aggregate logs as KFP Metrics: run counts, accelerator-hours, each method's GLUE mean."""

from __future__ import annotations

import pytest

from adaptune.sweep.console_metrics import sweep_metrics
from adaptune.train.config import TrainConfig
from adaptune.train.record import run_record


def record(task: str, method: dict, lr: float, seed: int, validation: float, reported: float, status: str = "ok") -> dict:
    config = TrainConfig(task=task, method=method, lr=lr, epochs=3, seed=seed)
    metric = "accuracy"
    result = run_record(config, metric)
    result.update(status=status, val_metrics={metric: validation}, test_metrics={metric: reported}, wall_time_s=1800.0)
    return result


def test_the_glue_mean_is_of_each_methods_configuration_best_on_validation() -> None:
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
    assert metrics["glue_mean_full"] == pytest.approx((61 + 91) / 2)
    assert metrics["glue_mean_adapters64"] == pytest.approx(66)
