"""The numbers a sweep's aggregate step logs as KFP Metrics (shown on the Vertex AI console): run
counts by status, accelerator-hours the records took, and the GLUE mean of each method."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pandas as pd

from adaptune.data.tasks import get_task
from adaptune.sweep.throughput import accelerator_hours
from adaptune.train.record import with_companions


def sweep_metrics(records: Sequence[dict[str, Any]], planned: int, accelerators_per_run: int) -> dict[str, float]:
    """{"runs_planned", "runs_finished", "runs_ok", "runs_degenerate", "runs_failed", "accelerator_hours",
    "glue_mean_<method label>" (percent)}."""
    metrics: dict[str, float] = {"runs_planned": planned, "runs_finished": len(records)}
    for status in ("ok", "degenerate", "failed"):
        metrics[f"runs_{status}"] = sum(record.get("status") == status for record in records)
    metrics["accelerator_hours"] = round(accelerator_hours(records, accelerators_per_run), 3)
    for method, mean in glue_means(records).items():
        metrics[f"glue_mean_{method}"] = round(mean, 2)
    return metrics


def glue_means(records: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Per method label, the mean over the GLUE tasks measured of the reported score (percent) of its
    configuration best on validation (mean over seeds); failed runs have no score and are left out."""
    rows = []
    for record in records:
        for row in with_companions(record):
            task = get_task(row["task"])
            reported, validation = (row.get("test_metrics") or {}), (row.get("val_metrics") or {})
            if task.family != "glue" or row.get("status") == "failed" or task.primary_metric not in reported \
                    or validation.get(task.primary_metric) is None:
                continue
            rows.append({"method": row["method_label"], "task": task.name, "config": (row["lr"], row["epochs"]),
                         "validation": validation.get(task.primary_metric), "reported": reported[task.primary_metric]})
    if not rows:
        return {}
    frame = pd.DataFrame(rows)
    configs = frame.groupby(["method", "task", "config"], as_index=False)[["validation", "reported"]].mean()
    best = configs.loc[configs.groupby(["method", "task"])["validation"].idxmax()]
    return {method: 100 * float(score) for method, score in best.groupby("method")["reported"].mean().items()}
