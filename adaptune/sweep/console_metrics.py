"""The numbers a sweep's aggregate step logs as KFP Metrics (shown on the Vertex AI console): run
counts by status, accelerator-hours the records took, and each method's mean score over the tasks it was
measured on, named for what it averages (only a mean over all nine of GLUE's scored columns is a GLUE mean)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pandas as pd

from adaptune.data.tasks import GLUE_SCORE_TASKS, get_task
from adaptune.sweep.throughput import accelerator_hours
from adaptune.train.record import with_companions

MEAN_FAMILIES = ("glue", "extra")  # SQuAD's span scores are not averaged with anything


def sweep_metrics(records: Sequence[dict[str, Any]], planned: int, accelerators_per_run: int) -> dict[str, float]:
    """{"runs_planned", "runs_finished", "runs_ok", "runs_degenerate", "runs_failed", "accelerator_hours"}
    and, per method label and task family, the mean (percent) task_means gives under mean_name's name:
    "glue_mean_<method label>" only over every GLUE column (GLUE_SCORE_TASKS), else "<task>_<method label>"
    for one task and "mean_<n>_<family>_tasks_<method label>" for n of them (e.g. mean_3_glue_tasks_full)."""
    metrics: dict[str, float] = {"runs_planned": planned, "runs_finished": len(records)}
    for status in ("ok", "degenerate", "failed"):
        metrics[f"runs_{status}"] = sum(record.get("status") == status for record in records)
    metrics["accelerator_hours"] = round(accelerator_hours(records, accelerators_per_run), 3)
    for (method, family), (tasks, mean) in task_means(records).items():
        metrics[mean_name(method, family, tasks)] = round(mean, 2)
    return metrics


def mean_name(method: str, family: str, tasks: Sequence[str]) -> str:
    """The metric's name, saying what it averages: a GLUE mean only over all of GLUE's scored columns."""
    if family == "glue" and set(GLUE_SCORE_TASKS) <= set(tasks):
        return f"glue_mean_{method}"
    if len(tasks) == 1:
        return f"{tasks[0]}_{method}"
    return f"mean_{len(tasks)}_{family}_tasks_{method}"


def task_means(records: Sequence[dict[str, Any]]) -> dict[tuple[str, str], tuple[list[str], float]]:
    """Per (method label, task family in MEAN_FAMILIES): the tasks measured and the mean over them of the
    reported score (percent) of the configuration best on validation (mean over seeds); failed runs have no
    score and are left out."""
    rows = []
    for record in records:
        for row in with_companions(record):
            task = get_task(row["task"])
            reported, validation = (row.get("test_metrics") or {}), (row.get("val_metrics") or {})
            if task.family not in MEAN_FAMILIES or row.get("status") == "failed" or task.primary_metric not in reported \
                    or validation.get(task.primary_metric) is None:
                continue
            rows.append({"method": row["method_label"], "family": task.family, "task": task.name, "config": (row["lr"], row["epochs"]),
                         "validation": validation.get(task.primary_metric), "reported": reported[task.primary_metric]})
    if not rows:
        return {}
    frame = pd.DataFrame(rows)
    configs = frame.groupby(["method", "family", "task", "config"], as_index=False)[["validation", "reported"]].mean()
    best = configs.loc[configs.groupby(["method", "family", "task"])["validation"].idxmax()]
    return {(str(method), str(family)): (sorted(group["task"]), 100 * float(group["reported"].mean()))
            for (method, family), group in best.groupby(["method", "family"])}
