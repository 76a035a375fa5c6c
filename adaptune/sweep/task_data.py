"""An experiment's tasks resolved against the data source: the tasks whose files are there, and one line for each left out.

An experiment that declares `skip_tasks_without_data` (extra_local: every additional task) trains the tasks the data
source holds, so a user who stages more files gets them in the same experiment. Resolution happens once, where a
command starts (`get_experiment`, and `plan` for a spec not yet resolved): the resolved spec names only the tasks that
were there, with the flag cleared, and that spec is the JSON every pod re-plans, so no pod looks at data to decide
what the plan is and every run id stays what it was. A task left out is one line naming the file and its publisher's page.

Where a task's files count as there: a mirror of the publishers' files holds every file the task reads, with the
columns it reads (data.sources.local_files_status); a prepared folder (data.prepared) holds the task; with no data dir
(the hub), the task has a hub copy. A file that is there but truncated or re-exported is not left out: the data check
names it before anything trains (data_check, data_prep).
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from adaptune.core.errors import UserError
from adaptune.data.tasks import Task, get_task
from adaptune.sweep.spec import ExperimentSpec


class NoTaskDataError(UserError, ValueError):
    """Not one of an experiment's tasks has its files in the data source."""


def missing_data_line(task: Task, root: Path | None) -> str | None:
    """None where the data source holds the task's data; else one line naming the file and where its publisher has it."""
    from adaptune.data.prepared import PreparedData, is_prepared
    from adaptune.data.sources import local_files_status

    if is_prepared(root):
        return None if PreparedData.open(root).holds(task) else f"{task.name}: not in the prepared data"
    if root is None:
        if task.source.hub_id:
            return None
        where = "no data mirror found and no hub copy"
    else:
        status = local_files_status(task, root)
        if status == "yes":
            return None
        # the mirror is not named by its path: the line travels in the spec JSON, and a compiled spec is the same on
        # every machine that holds the same files
        where = f"not in the data mirror ({status})" if status != "no" else "not in the data mirror"
    files = ", ".join(dict.fromkeys(path for _, path in task.source.files))
    page = task.source.url or (f"the hub's {task.source.hub_id}" if task.source.hub_id else "no public page known")
    return f"{task.name}: {files} {where}; its publisher's page: {page}"


def with_tasks_that_have_data(spec: ExperimentSpec, data_dir: str | os.PathLike[str] | None = None) -> ExperimentSpec:
    """`spec` itself unless it skips tasks without data; else the spec of the tasks the data source holds
    (data.sources.resolve_data_dir(data_dir)), each task left out named in `tasks_left_out` and at the end of
    `grid_left_out` (the report prints it under the claims), the flag cleared so that nothing resolves it again."""
    if not spec.skip_tasks_without_data:
        return spec
    from adaptune.data.sources import resolve_data_dir

    root = resolve_data_dir(data_dir)
    missing = {name: missing_data_line(get_task(name), root) for name in spec.tasks}
    lines = tuple(line for line in missing.values() if line)
    kept = [name for name, line in missing.items() if line is None]
    if not kept:
        raise NoTaskDataError(f"experiment {spec.name!r}: the data source ({root or 'the hub'}) holds none of its tasks "
                              f"({', '.join(missing)}): stage the publishers' files (make stage-data) or pass --data-dir")
    sweeps = tuple(dataclasses.replace(sweep, tasks=tuple(task for task in sweep.tasks if task in kept))
                   for sweep in spec.sweeps)
    ablation = spec.ablation
    if ablation is not None:
        ablation = dataclasses.replace(ablation, tasks=tuple(task for task in ablation.tasks if task in kept))
    left_out = ""
    if lines:
        left_out = f"{len(lines)} of its {len(missing)} tasks, whose files the data source lacks: " + ", ".join(
            name for name, line in missing.items() if line)
    return dataclasses.replace(
        spec, sweeps=tuple(sweep for sweep in sweeps if sweep.tasks), ablation=ablation if ablation and ablation.tasks else None,
        skip_tasks_without_data=False, tasks_left_out=spec.tasks_left_out + lines,
        grid_left_out="; ".join(text for text in (spec.grid_left_out, left_out) if text),
    )
