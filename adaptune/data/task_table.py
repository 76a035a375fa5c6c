"""`python -m adaptune tasks`: the registry as a table, with what the local mirror holds of each task.

Apart from the registry (adaptune.data.tasks imports nothing of the loaders, as seqio's does not)."""

from __future__ import annotations

from pathlib import Path

from adaptune.data.checksums import file_md5
from adaptune.data.sources import local_files_status, resolve_data_dir
from adaptune.data.tasks import TASKS, Task

UNVERIFIED = "UNVERIFIED: declared from docs, never read"
READ_HERE = "read here, sizes = Table 3"


def definition_status(task: Task, data_dir: Path | None = None) -> str:
    """Blank where the task's definition (file name, columns) was checked on a real copy (Source.verified). Else, where
    `data_dir` holds its file: READ_HERE with the file's md5 (for the user to keep) when it reads and splits to the
    paper's Table 3 sizes, or what it splits to instead; UNVERIFIED where no file is at hand."""
    if task.source.verified:
        return ""
    if data_dir is None or local_files_status(task, data_dir) != "yes":
        return UNVERIFIED
    from adaptune.data.loading import load_task_data  # datasets, only where a definition is read

    try:
        splits = load_task_data(task, data_dir)
    except (OSError, ValueError) as error:
        return f"{UNVERIFIED}; its file is here but does not read: {' '.join(str(error).split())[:200]}"
    sizes = tuple(len(splits[split]) for split in ("train", "validation", "test") if split in splits)
    md5 = "; ".join(f"md5 {file_md5(Path(data_dir) / rel)} {rel}" for _, rel in task.source.files)
    if task.paper_sizes is not None and sizes != task.paper_sizes:
        return (f"{UNVERIFIED}; read here, splits {'/'.join(map(str, sizes))}, not Table 3's "
                f"{'/'.join(map(str, task.paper_sizes))} ({md5})")
    return f"{READ_HERE} ({md5})"


def format_task_table(data_dir: str | Path | None = None) -> str:
    """One line per task: name, family, kind, metrics, whether the local mirror has its files, whether its
    definition (file name, columns) was never checked on a real copy (`definition_status`), and its source."""
    root = resolve_data_dir(data_dir)
    header = f"data dir: {root if root else 'none found (hub)'}"
    rows = [("task", "family", "kind", "metrics", "local data", "definition", "source")]
    for task in TASKS.values():
        rows.append((task.name, task.family, task.kind, ",".join(task.metrics), local_files_status(task, root),
                     definition_status(task, root), task.source.describe()))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row[:-1], widths)) + "  " + row[-1] for row in rows]
    return "\n".join([header, *lines])
