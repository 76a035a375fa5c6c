"""The majority-class baseline beside every task: what always predicting the training labels' most
common class scores on the split a table reports.

So that a number that only looks like learning (MRPC F1 0.81 from predicting "paraphrase" for
everything) cannot pass as learning. The majority class comes from the training labels of the split
the runs used (the same seeded subset when they subsampled, `max_train_examples`); it is scored on
the reported split (the same seeded subset, `max_eval_examples`) with the task's own metrics:
accuracy and F1 of that constant prediction, MCC 0, and a correlation 0 for regression (a constant
prediction has no correlation; metrics.py reports 0, as GLUE does).

Only a local data mirror is read (never the hub): where the mirror lacks a task's files the baseline
is None and the table shows "—".
"""

from __future__ import annotations

import json
from collections import Counter
from functools import lru_cache
from pathlib import Path
from typing import Any

import pandas as pd

from adaptune.data.batching import column_values, subsample
from adaptune.data.loading import load_task_data
from adaptune.data.prepared import PreparedData, is_prepared
from adaptune.data.sources import local_files_status, resolve_data_dir
from adaptune.data.tasks import get_task
from adaptune.train.metrics import compute_metrics


def majority_baseline(
    task_name: str,
    split: str,
    max_train_examples: int | None = None,
    max_eval_examples: int | None = None,
    data_dir: str | Path | None = None,
) -> dict[str, float] | None:
    """{metric: value (a fraction, as metrics.py gives)} of predicting the training majority class on
    `split`; None where the local mirror lacks the task's train or `split` data (or the task is SQuAD)."""
    root = found_data_dir(data_dir)
    if root is None:
        return None
    return _majority_baseline(task_name, split, max_train_examples, max_eval_examples, root)


def found_data_dir(data_dir: str | Path | None) -> str | None:
    """The data dir resolve_data_dir finds from `data_dir`, as a string; None where it finds none."""
    try:
        root = resolve_data_dir(data_dir)
    except FileNotFoundError:
        return None
    return None if root is None else str(root)


@lru_cache(maxsize=256)
def _majority_baseline(task_name: str, split: str, max_train: int | None, max_eval: int | None, root: str) -> dict[str, float] | None:
    task = get_task(task_name)
    prepared = PreparedData.open(Path(root)) if is_prepared(Path(root)) else None
    available = prepared.holds(task) if prepared else local_files_status(task, Path(root)) == "yes"
    if task.kind == "span" or not available:
        return None
    try:
        data = load_task_data(task, root, splits=("train", split))
    except (OSError, ValueError):  # the mirror holds the files but not this split (or a malformed file)
        return None
    gold = column_values(subsample(data[split], max_eval), "label")  # one Arrow read, not one per row
    if task.kind == "regression":
        return {metric: 0.0 for metric in task.metrics}
    counts = Counter(column_values(subsample(data["train"], max_train), "label"))
    majority = min(counts, key=lambda label: (-counts[label], label))  # ties: the smaller label
    return compute_metrics(task, [majority] * len(gold), gold)


def run_baseline(
    task_name: str, run: pd.Series | dict[str, Any], metric: str, split: str, data_dir: str | Path | None = None
) -> float | None:
    """The baseline in percent for `task_name`, `metric` and the reported `split`, on the subsets the
    run's config used (its `config_json`); None where it cannot be computed."""
    config = json.loads(run["config_json"]) if isinstance(run.get("config_json"), str) else {}
    values = majority_baseline(task_name, split, config.get("max_train_examples"), config.get("max_eval_examples"), data_dir)
    if values is None or values.get(metric) is None:
        return None
    return 100.0 * float(values[metric])


def task_baseline(task_name: str, metric: str, split: str, data_dir: str | Path | None = None) -> float | None:
    """The baseline in percent on the whole splits (for a task no run measured)."""
    values = majority_baseline(task_name, split, None, None, data_dir)
    return None if values is None or values.get(metric) is None else 100.0 * float(values[metric])


def reported_split(task_name: str) -> str:
    """The split tables report for a task with no run: test (GLUE: dev.tsv) where the task has a labelled
    test split; SQuAD: validation (dev-v1.1)."""
    return "validation" if get_task(task_name).kind == "span" else "test"
