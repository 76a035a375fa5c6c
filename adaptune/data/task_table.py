"""`python -m adaptune tasks`: the registry as a table, with what the local mirror holds of each task.

Apart from the registry (adaptune.data.tasks imports nothing of the loaders, as seqio's does not)."""

from __future__ import annotations

from pathlib import Path

from adaptune.data.sources import local_files_status, resolve_data_dir
from adaptune.data.tasks import TASKS


def format_task_table(data_dir: str | Path | None = None) -> str:
    """One line per task: name, family, kind, metrics, source, and whether the local mirror has its files."""
    root = resolve_data_dir(data_dir)
    header = f"data dir: {root if root else 'none found (hub)'}"
    rows = [("task", "family", "kind", "metrics", "local data", "source")]
    for task in TASKS.values():
        rows.append((task.name, task.family, task.kind, ",".join(task.metrics), local_files_status(task, root),
                     task.source.describe()))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row[:-1], widths)) + "  " + row[-1] for row in rows]
    return "\n".join([header, *lines])
