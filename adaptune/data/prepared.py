"""Prepared data: a task's canonical splits and their tokenized forms, written once by the data-preparation
step (adaptune.sweep.data_prep) and read by every run, so no run parses a source file, asks the hub, or tokenizes.

A task's folder, named by its content (the task, its source files' sha256 or hub id, its split scheme):

    raw-<id>/                             the canonical splits (datasets' save_to_disk)
    tokenized/<tokenizer>-<length>-<id>/  the splits tokenized by one tokenizer (its content's hash) at one max length
    tokenized/<tokenizer>-<length>.json   written after that folder, naming it: it is whole
    TASK.json                             written after raw-<id>/, naming it: task, split scheme, data provenance, rows,
                                          label counts
Each writer's folders carry an id of their own, so two writers never write the same file; a marker is created once
(adaptune.sweep.data_prep: the first writer to finish names its own folders), never rewritten, so what it names is whole.

A plan's folder holds only PREPARED.json: each task's folder, relative to it. A run is given the plan's folder as
its data dir (`is_prepared`); adaptune.data.loading and adaptune.train.run_data then read from it alone.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeGuard

import datasets

from adaptune.core.files import write_json
from adaptune.data.sources import DataNotFoundError, quiet_datasets
from adaptune.data.splits import TaskData
from adaptune.data.tasks import Task, get_task
from adaptune.data.token_cache import tokenizer_fingerprint

PLAN_MARKER = "PREPARED.json"
TASK_MARKER = "TASK.json"
RAW_DIR = "raw"
TOKENIZED_DIR = "tokenized"
FORMAT_VERSION = 1  # bump when what a task's folder holds changes: every folder is then prepared again


def is_prepared(root: Path | None) -> TypeGuard[Path]:
    """Whether a data dir is a plan's prepared folder rather than a mirror of the publishers' files."""
    return root is not None and (root / PLAN_MARKER).is_file()


def tokenized_name(tokenizer: Any, max_length: int, doc_stride: int | None = None) -> str:
    """The name of one tokenization of a task: its tokenizer's content, max length (and SQuAD's doc stride)."""
    return f"{tokenizer_fingerprint(tokenizer)[:16]}-{max_length}" + (f"-s{doc_stride}" if doc_stride is not None else "")


@dataclasses.dataclass(frozen=True)
class PreparedData:
    """A plan's prepared folder, opened: where each task's data is."""

    root: Path
    tasks: dict[str, str]  # task name -> its folder, relative to root

    @classmethod
    def open(cls, root: Path) -> PreparedData:
        manifest = json.loads((root / PLAN_MARKER).read_text())
        return cls(root=root, tasks=dict(manifest["tasks"]))

    def holds(self, task: Task | str) -> bool:
        return get_task(task).name in self.tasks

    def task_dir(self, task: Task | str) -> Path:
        task = get_task(task)
        if task.name not in self.tasks:
            raise DataNotFoundError(f"the prepared data {self.root} holds no {task.name} (it holds {', '.join(sorted(self.tasks))}): "
                                    "the data-preparation step prepares the tasks its plan names; run the pipeline again")
        return (self.root / self.tasks[task.name]).resolve()

    def info(self, task: Task | str) -> dict[str, Any]:
        """The task's TASK.json: split scheme and note, data provenance, rows and labels per split, checks."""
        return json.loads((self.task_dir(task) / TASK_MARKER).read_text())

    @quiet_datasets()
    def task_data(self, task: Task | str, splits: Sequence[str] | None = None) -> TaskData:
        task = get_task(task)
        info = self.info(task)
        loaded = datasets.load_from_disk(str(self.task_dir(task) / info["raw"]))
        wanted = list(loaded) if splits is None else [split for split in splits if split in loaded]
        return TaskData(datasets.DatasetDict({split: loaded[split] for split in wanted}), info["data_split"], info["split_note"])

    @quiet_datasets()
    def tokenized(self, task: Task | str, tokenizer: Any, max_length: int, splits: Sequence[str],
                  doc_stride: int | None = None) -> datasets.DatasetDict:
        """The splits as the preparation step tokenized them (SQuAD: windowed at `doc_stride`); one line where it
        did not (a run never tokenizes)."""
        task = get_task(task)
        name = tokenized_name(tokenizer, max_length, doc_stride)
        folder = self.task_dir(task) / TOKENIZED_DIR
        marker = folder / f"{name}.json"
        if not marker.is_file():
            stride = f" and doc_stride {doc_stride}" if doc_stride is not None else ""
            raise DataNotFoundError(f"the prepared data of {task.name} ({folder.parent}) was not tokenized by this tokenizer at "
                                    f"max_length {max_length}{stride}: the data-preparation step tokenizes for each backbone and "
                                    "length its plan names; run the pipeline again")
        loaded = datasets.load_from_disk(str(folder / json.loads(marker.read_text())["dir"]))
        return datasets.DatasetDict({split: loaded[split] for split in splits if split in loaded})


@quiet_datasets()
def write_task(folder: Path, loaded: TaskData, info: dict[str, Any], raw_dir: str = RAW_DIR) -> None:
    """A task's canonical splits into `folder`/`raw_dir`, then TASK.json (`info`, the split scheme, where they are)."""
    loaded.splits.save_to_disk(str(folder / raw_dir))
    write_json(folder / TASK_MARKER, {**info, "format": FORMAT_VERSION, "raw": raw_dir, "data_split": loaded.data_split,
                                      "split_note": loaded.split_note})


@quiet_datasets()
def write_tokenized(folder: Path, tokenized: datasets.DatasetDict, name: str, label: str, folder_name: str | None = None) -> str:
    """Tokenized splits (`tokenized_name`'s `name`) into `folder`/tokenized/<folder_name>, then their marker naming
    it; returns the marker's name."""
    folder_name = folder_name or name
    tokenized.save_to_disk(str(folder / TOKENIZED_DIR / folder_name))
    write_json(folder / TOKENIZED_DIR / f"{name}.json", {"dir": folder_name, "tokenization": label,
                                                          "rows": {split: len(rows) for split, rows in tokenized.items()}})
    return f"{name}.json"


def write_plan(folder: Path, tasks: dict[str, str], facts: dict[str, Any]) -> None:
    write_json(folder / PLAN_MARKER, {"format": FORMAT_VERSION, "tasks": tasks, **facts})
