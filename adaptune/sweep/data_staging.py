"""Stage an experiment's data files in the run store once, checked, so every pod reads the same mirror.

A data mirror is the publishers' files in the layout adaptune.data.tasks declares (`Source.files`:
`glue/RTE/train.tsv`, `extra/sms_spam/SMSSpamCollection`, ...). `make stage-data PIPELINE=glue_full FROM=DIR`
copies each file of each task the plan trains (with the tasks those runs are also scored as: MNLI-mm with
MNLI) from DIR, a local folder in that layout, to `<run store>/data/<path>`; a submission's data_dir names that
folder (on Vertex AI, its /gcs mount). Before a file is copied:
- its md5 is compared with the copy the project checked (adaptune.data.checksums.KNOWN_MD5): another release,
  a re-export or a truncated download is refused;
- it is read as its task reads it (adaptune.data.loading: the reader, the columns, the labels, the splits),
  so a malformed file or a missing column is refused before any pod trains on it.
A file whose staged copy has the same md5 (Cloud Storage's md5Hash on a bucket, else hashed) is left as it is.
What cannot be staged (a refused file, a task whose files are neither in DIR nor staged) is one line each,
naming what to download from where; the lines are raised together, as one DataStagingError, after
everything else has been staged.

The hub's copies (GLUE, SQuAD, SMS spam) are not staged: the loaders read a mirror in the publishers' layout
only (adaptune.data.sources), not a hub snapshot. A task missing from DIR is downloaded from its publisher
into DIR, or the submission loads every task from the hub (data_dir "").
"""

from __future__ import annotations

import base64
import hashlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from adaptune.core.errors import UserError
from adaptune.data.checksums import file_md5, md5_problem
from adaptune.data.tasks import SQUAD_STANDIN, STANDARD_SPLIT, Task, get_task
from adaptune.sweep.data_prep import data_needs
from adaptune.sweep.plan import plan
from adaptune.sweep.spec import ExperimentSpec
from adaptune.sweep.store import DATA_MIRROR_DIR, RunStore
from adaptune.sweep.store_files import StoreFiles

GLUE_URL = "https://gluebenchmark.com/tasks"  # the GLUE tasks' download page (their Source has no url: the hub has them)

# What a line's `action` says: a new copy; one over another staged copy; a staged copy left as it is; the same
# file staged a moment ago for another task; a file not staged (the DataStagingError says why); no file to stage.
STAGED, REPLACED, ALREADY, SHARED, REFUSED, MISSING = "staged", "replaced", "already staged", "staged above", "refused", "missing"


class DataStagingError(UserError, RuntimeError):
    """Data cannot be staged: a --from that is no folder; or some files, one line each (what to download from
    where), `staged` holding the lines of every file, the staged ones too."""

    def __init__(self, message: str, staged: list[dict[str, Any]] | None = None) -> None:
        super().__init__(message)
        self.staged = staged or []


def data_tasks(spec: ExperimentSpec) -> list[str]:
    """The tasks whose files the plan reads: those it trains (and ablates), and those their runs are also scored as."""
    return list(data_needs(plan(spec)))  # the preparation step's tasks: it reads what is staged


def stage_data(spec: ExperimentSpec, store: RunStore, from_dir: str | os.PathLike[str] | None = None, force: bool = False,
               on_file: Callable[[dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
    """Stage every data file of `spec`'s tasks from `from_dir` into `<store>/data/` (see the module doc).

    Returns one line of facts per task and file: task, file (its mirror path), action, bytes, where; `on_file`
    is called with each as its task is done. `force` copies (and checks) again files already staged with the same md5.
    Raises DataStagingError, after staging the rest, where a file is refused or a task's file is found nowhere."""
    source = None
    if from_dir is not None:
        source = Path(from_dir).expanduser().resolve()
        if not source.is_dir():
            raise DataStagingError(f"--from {from_dir}: no such folder; pass the folder holding the publishers' files "
                                   "(glue/RTE/train.tsv, extra/sms_spam/SMSSpamCollection, ...)")
    staging = _Staging(store.files, source, force)
    lines: list[dict[str, Any]] = []
    for name in data_tasks(spec):
        for line in staging.task(get_task(name)):
            lines.append(line)
            if on_file is not None:
                on_file(line)
    if staging.problems:
        raise DataStagingError(f"{len(staging.problems)} problem(s) staging the data of {spec.name} (everything else is staged "
                               "in " + store.files.url(DATA_MIRROR_DIR) + "):\n  " + "\n  ".join(staging.problems), lines)
    return lines


def mirror_hint(store: RunStore) -> str:
    """Where the store's data mirror is and how a run or a submission reads it, in one line."""
    where = store.files.url(DATA_MIRROR_DIR)
    local = store.data_mirror()
    if local is not None and not store.files.is_bucket_mount:
        return f"data mirror: {where}; a local run reads it with --data-dir {local}"
    return (f"data mirror: {where}; a submission with this run store reads it when its data_dir is empty "
            "(the data-preparation step, adaptune.sweep.data_prep.source_data_dir)")


class _Staging:
    """One call's state: what the store held before it, what it has hashed, read, copied and refused."""

    def __init__(self, files: StoreFiles, source: Path | None, force: bool) -> None:
        self.files, self.source, self.force = files, source, force
        self.staged: dict[str, tuple[str | None, int]] = {}  # mirror path -> (md5, bytes) of the store's copy before this call
        self.hashed: dict[str, str] = {}  # mirror path -> md5 of the source file
        self.read_ok: dict[tuple, str | None] = {}  # what a read found (None: readable), by file and how a task reads it
        self.copied: set[str] = set()
        self.refused: set[str] = set()
        self.problems: list[str] = []
        files.fs.invalidate_cache(files.path(DATA_MIRROR_DIR))

    def task(self, task: Task) -> list[dict[str, Any]]:
        lines = [self.file(task, role, relative) for role, relative in task.source.files]
        missing = [line["file"] for line in lines if line["action"] == MISSING]
        if missing:
            self.problems.append(self.missing_line(task, missing))
        return lines

    def file(self, task: Task, role: str, relative: str) -> dict[str, Any]:
        line = {"task": task.name, "file": relative, "where": self.files.url(DATA_MIRROR_DIR, relative)}
        staged_md5, staged_bytes = self.staged_copy(relative)
        path = self.source / relative if self.source is not None else None
        if path is None or not path.is_file():
            if staged_md5 is None:
                return {**line, "action": MISSING, "bytes": 0}
            problem = md5_problem(line["where"], relative, staged_md5)
            if problem is None:
                return {**line, "action": ALREADY, "bytes": staged_bytes}
            self.refuse(task, relative, f"{problem} into {self.source or 'DIR'}/{relative.rpartition('/')[0]}/ and pass "
                                        f"--from {self.source or 'DIR'}")
            return {**line, "action": REFUSED, "bytes": staged_bytes}
        size = path.stat().st_size
        if relative not in self.hashed:
            self.hashed[relative] = file_md5(path)
        md5 = self.hashed[relative]
        problem = md5_problem(path, relative, md5)
        if problem is not None:
            self.refuse(task, relative, problem)
            return {**line, "action": REFUSED, "bytes": size}
        if staged_md5 == md5 and not self.force and relative not in self.copied:
            return {**line, "action": ALREADY, "bytes": size}
        problem = self.read_problem(task, role, relative, path)
        if problem is not None:
            self.problems.append(f"{task.name}: {problem}")
            return {**line, "action": REFUSED, "bytes": size}
        if relative in self.copied:
            return {**line, "action": SHARED, "bytes": size}
        self.files.put_file(path, DATA_MIRROR_DIR, relative)
        self.copied.add(relative)
        return {**line, "action": REPLACED if staged_md5 is not None and staged_md5 != md5 else STAGED, "bytes": size}

    def refuse(self, task: Task, relative: str, problem: str) -> None:
        """A file whose bytes are not the known copy's: one line, however many tasks read it."""
        if relative not in self.refused:
            self.refused.add(relative)
            self.problems.append(f"{task.name}: {problem}")

    def staged_copy(self, relative: str) -> tuple[str | None, int]:
        """(md5, bytes) of the store's copy of a mirror file as it was before this call; (None, 0) where it has none."""
        if relative not in self.staged:
            self.staged[relative] = _store_md5(self.files, DATA_MIRROR_DIR, relative)
        return self.staged[relative]

    def read_problem(self, task: Task, role: str, relative: str, path: Path) -> str | None:
        """None where the task reads the file (its splits from it build); else one line saying why not. A file two
        tasks read alike (MNLI's train.tsv for mnli_m and mnli_mm) is read once."""
        key = (relative, role, task.source.reader, task.source.text_columns, task.source.label_column, task.labels,
               task.label_aliases, task.drop_labels, task.num_classes, task.kind)
        if key not in self.read_ok:
            from adaptune.data.loading import load_task_data  # datasets and torch: only where a file is read
            from adaptune.data.splits import splits_in_files

            assert self.source is not None
            try:
                load_task_data(task, self.source, splits=splits_in_files(task, [role]), data_split=STANDARD_SPLIT)
                self.read_ok[key] = None
            except Exception as error:  # noqa: BLE001 -- any reader's refusal (a bad row, a missing column): one line
                first = str(error).splitlines()[0] if str(error) else ""
                self.read_ok[key] = (f"{path} does not read as {task.name}'s {role} file ({type(error).__name__}: {first}); "
                                     f"not staged: download it again from {publisher_url(task)}")
        return self.read_ok[key]

    def missing_line(self, task: Task, missing: list[str]) -> str:
        """What to download from where, into which folder of --from, for a task whose files are found nowhere."""
        into = "DIR" if self.source is None else str(self.source)
        folders: dict[str, list[str]] = {}
        for relative in missing:
            folder, _, name = relative.rpartition("/")
            folders.setdefault(folder, []).append(name)
        if len(folders) == 1:
            ((folder, names),) = folders.items()
            what = f"{', '.join(names)} from {publisher_url(task)} into {into}/{folder}/"
        else:
            what = f"from {publisher_url(task)}: " + "; ".join(f"{', '.join(names)} into {into}/{folder}/" for folder, names in folders.items())
        where = "not staged" + (f" and not in {self.source}" if self.source is not None else " and no --from DIR given")
        line = f"{task.name}: {where}: download {what} and pass --from {into}"
        if not task.source.verified:
            line += " (file name and columns as the publisher documents them: no copy was at hand to check)"
        if task.family == "squad":  # adaptune.data.squad_data: a split the mirror lacks comes from the hub, else the stand-in
            standin = missing == [task.source.file_map["train"]]
            line += (f"; or leave it: a run takes it from the hub ({task.source.hub_id}) where the hub is reachable"
                     + (f", else trains on the stand-in {SQUAD_STANDIN} (dev articles split 80/20, named in every record)" if standin else ""))
        elif task.source.hub_id:
            config = f" {task.source.hub_config}" if task.source.hub_config else ""
            line += f"; or, where the hub is reachable, submit with data_dir = \"\" (every task from the hub: {task.source.hub_id}{config})"
        return line


def publisher_url(task: Task) -> str:
    return task.source.url or (GLUE_URL if task.family == "glue" else f"https://huggingface.co/datasets/{task.source.hub_id}")


def _store_md5(files: StoreFiles, *parts: str) -> tuple[str | None, int]:
    """(md5, bytes) of a store file, (None, 0) where there is none: Cloud Storage's md5Hash where the object has one
    (a composite upload has not), else hashed as it is read."""
    path = files.path(*parts)
    try:
        info = files.fs.info(path)
    except FileNotFoundError:
        return None, 0
    if info.get("type") == "directory":
        return None, 0
    if info.get("md5Hash"):
        return base64.b64decode(info["md5Hash"]).hex(), int(info.get("size") or 0)
    if files.is_local:
        return file_md5(path), int(info.get("size") or 0)
    with files.fs.open(path, "rb") as handle:
        return hashlib.file_digest(handle, "md5").hexdigest(), int(info.get("size") or 0)
