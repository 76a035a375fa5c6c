"""Before a local sweep runs anything: the data it plans to read is on this machine, each file the copy the project
checked (or the hub is reachable); and the one rule for what is wrong with a task's files, which the
data-preparation step (adaptune.sweep.data_prep) applies too. A problem is one line per task, naming the file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from adaptune.core.errors import UserError
from adaptune.data.checksums import checksum_problem
from adaptune.data.readers import read_header
from adaptune.data.sources import hub_hint
from adaptune.data.tasks import Task, get_task
from adaptune.sweep.plan import Plan, PlanError

PROBLEMS_HEADER = "the data of the plan cannot be prepared; nothing was trained:"


class DataPreparationError(UserError, ValueError):
    """Tasks whose data cannot be prepared: one line per task, what is wrong and what to do."""

    @classmethod
    def of_tasks(cls, problems: dict[str, str]) -> DataPreparationError:
        """The error for {task: its one line}, each line led by its task's name, under one header."""
        return cls("\n".join([PROBLEMS_HEADER, *(f"{task}: {line}" for task, line in sorted(problems.items()))]))


def check_local_data(planned: Plan, data_dir: Any) -> None:
    """Every planned task's files are in the local mirror, with their columns and known checksums (or, with no mirror,
    the hub is reachable); every task with a problem is named at once, one line each (DataPreparationError)."""
    if data_dir is None and not _hub_reachable():
        raise PlanError("no local data mirror was found and the Hugging Face hub cannot be reached: pass --data-dir "
                        "(a copy in the publishers' layout, like shared/data) or run where the hub is reachable")
    problems = {task: problem for task in planned.tasks if (problem := data_file_problem(get_task(task), data_dir))}
    if problems:
        raise DataPreparationError.of_tasks(problems)


def data_file_problem(task: Task, data_dir: Path | None) -> str | None:
    """What is wrong with the task's files in the mirror (SQuAD needs its dev file alone), each file named: missing,
    lacking a column its task reads, or not the copy the project checked (KNOWN_MD5); and what to do. None where
    nothing is."""
    if data_dir is None:
        if task.source.hub_id:
            return None
        return (f"no data mirror was given and it has no hub copy: {hub_hint(task)}, into a mirror, and pass it as the "
                "pipeline's data_dir (make stage-data PIPELINE=... FROM=DIR)")
    data_dir = Path(data_dir)
    files = {split: data_dir / relative for split, relative in task.source.files}
    missing = [path for split, path in files.items() if not path.is_file()]
    if task.family == "squad" and [path for split, path in files.items() if split != "train" and path in missing] == []:
        missing = []  # its dev file alone makes the local stand-in split
    problems = [f"{', '.join(map(str, missing))} not found"] if missing else []
    needed = {column for column in (*task.source.text_columns, task.source.label_column) if column}
    for (_, relative), path in zip(task.source.files, files.values(), strict=True):
        if not path.is_file():
            continue
        header = read_header(path, task.source.reader)
        if header is not None and not needed <= set(header):
            problems.append(f"{path} lacks the column(s) {', '.join(sorted(needed - set(header)))} (it has {', '.join(header)})")
        elif checksum := checksum_problem(path, relative):
            problems.append(checksum.removesuffix(": download the publisher's file again"))
    if not problems:
        return None
    hint = f", {hub_hint(task)}" if task.source.hub_id else f" from {task.source.url}"
    return "; ".join(problems) + f": download the publisher's file again{hint}"


def _hub_reachable() -> bool:
    from adaptune.model.backbone import hub_reachable  # imports torch and transformers: asked only where no mirror is found

    return hub_reachable()
