"""`python -m adaptune tasks`: the registry as a table, with what the local mirror holds of each task.

Apart from the registry (adaptune.data.tasks imports nothing of the loaders, as seqio's does not)."""

from __future__ import annotations

from pathlib import Path

from adaptune.data.sources import local_files_status, resolve_data_dir
from adaptune.data.tasks import TASKS, Task

UNVERIFIED = "UNVERIFIED: declared from docs, never read"


def definition_status(task: Task) -> str:
    """UNVERIFIED where the task's file name and columns were declared from the publisher's documentation and never
    checked on a real copy (Source.verified False); else blank."""
    return "" if task.source.verified else UNVERIFIED


def format_task_table(data_dir: str | Path | None = None) -> str:
    """One line per task: name, family, kind, metrics, whether the local mirror has its files, whether its
    definition (file name, columns) was never checked on a real copy (`definition_status`), and its source."""
    root = resolve_data_dir(data_dir)
    header = f"data dir: {root if root else 'none found (hub)'}"
    rows = [("task", "family", "kind", "metrics", "local data", "definition", "source")]
    for task in TASKS.values():
        rows.append((task.name, task.family, task.kind, ",".join(task.metrics), local_files_status(task, root),
                     definition_status(task), task.source.describe()))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row[:-1], widths)) + "  " + row[-1] for row in rows]
    return "\n".join([header, *lines])
