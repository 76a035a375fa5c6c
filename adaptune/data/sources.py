"""Where a task's rows come from: the local mirror (the publisher's files under a data dir) or the hub.

Both sources give records (text_a, text_b, raw label, where it came from) that go through the same
canonicalisation (adaptune.data.splits), so a mirror and the hub give identical datasets when their raw
rows match. The hub is asked once per process whether it answers (`hub_usable`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import datasets

from adaptune.core import environment
from adaptune.core.errors import UserError
from adaptune.data.readers import READERS, RawRow, read_header
from adaptune.data.tasks import Task, get_task

DATA_DIR_ENV = "ADAPTUNE_DATA_DIR"
HUB = "hub"  # data_dir value that forces the hub even when a mirror could be found


class DataNotFoundError(UserError, FileNotFoundError):
    """A task's data is not where it was expected; the message names the path and the hub alternative."""


class DataError(UserError, ValueError):
    """Rows that cannot become a valid dataset: an unknown label, a bad value, an empty split."""


@dataclasses.dataclass(frozen=True)
class Record:
    where: str  # "file: line N" or "hub id/config split row N"
    text_a: str
    text_b: str | None
    label: str


@contextlib.contextmanager
def quiet_datasets() -> Iterator[None]:
    """No `datasets` progress bars or info logs inside (map, save_to_disk, load_from_disk, hub loads),
    so that a run's or a pipeline's output shows adaptune's own lines; the previous settings come back
    on exit. Also a decorator."""
    from datasets.utils import logging as datasets_logging

    bars_were_on = datasets.is_progress_bar_enabled()
    verbosity = datasets_logging.get_verbosity()
    datasets.disable_progress_bars()
    datasets_logging.set_verbosity_error()
    try:
        yield
    finally:
        datasets_logging.set_verbosity(verbosity)
        if bars_were_on:
            datasets.enable_progress_bars()


def resolve_data_dir(data_dir: str | os.PathLike[str] | None = None) -> Path | None:
    """The local mirror: the argument, else $ADAPTUNE_DATA_DIR, else the first `shared/data` found
    walking up from the current directory (then from this package's location), else None (the hub).
    The value "hub" (argument or variable) skips the mirror search and forces the hub."""
    from_env = environment.settings().data_dir
    if str(data_dir) == HUB or (data_dir is None and from_env == HUB):
        return None
    if data_dir is not None and str(data_dir) != "":
        path = Path(data_dir).expanduser()
        if not path.is_dir():
            raise DataNotFoundError(f"data dir {path} does not exist: pass an existing mirror directory, or none to use the hub")
        return path.resolve()
    if from_env:
        path = Path(from_env).expanduser()
        if not path.is_dir():
            raise DataNotFoundError(f"${DATA_DIR_ENV}={from_env} is not a directory: fix it or unset it to use the hub")
        return path.resolve()
    for start in (Path.cwd(), Path(__file__).resolve().parent):
        for directory in (start, *start.parents):
            candidate = directory / "shared" / "data"
            if candidate.is_dir():
                return candidate.resolve()
    return None


def local_files_status(task: Task | str, data_dir: Path | None) -> str:
    """'yes', 'only <splits>' or 'no': which of the task's files the mirror holds."""
    task = get_task(task)
    if data_dir is None:
        return "no"
    present = [split for split, rel in task.source.files if (data_dir / rel).is_file()]
    if len(present) == len(task.source.files):
        header = read_header(data_dir / task.source.files[0][1], task.source.reader)
        needed = [c for c in (*task.source.text_columns, task.source.label_column) if c]
        if header is not None and not set(needed) <= set(header):
            return f"file lacks {','.join(sorted(set(needed) - set(header)))}"
        return "yes"
    return f"only {','.join(present)}" if present else "no"


def hub_hint(task: Task, split: str | None = None) -> str:
    source = task.source
    if source.hub_id:
        hub_split = source.hub_split_map.get(split or "", "") if split else ""
        where = f"{source.hub_id!r}" + (f", {source.hub_config!r}" if source.hub_config else "")
        return (f"or load it from the Hugging Face hub (datasets.load_dataset({where}"
                + (f", split={hub_split!r}" if hub_split else "")
                + f"): pass --data-dir hub (data_dir='hub', or ${DATA_DIR_ENV}=hub) where the hub is reachable")
    return f"no hub copy exists: download the publisher's file from {source.url}"


def _local_records(task: Task, root: Path, split: str) -> list[Record]:
    relative = task.source.file_map[split]
    path = root / relative
    if not path.is_file():
        raise DataNotFoundError(
            f"{task.name}: {split} file not found: expected {path} (the publisher's layout under the data dir {root}); "
            f"{hub_hint(task, split)}")
    rows = READERS[task.source.reader](path)
    return _records_from_rows(task, rows, str(path), task.source.text_columns, task.source.label_column)


def _records_from_rows(task: Task, rows: list[RawRow], origin: str, text_columns: tuple[str, ...],
                       label_column: str | None) -> list[Record]:
    if rows:
        missing = [c for c in (*text_columns, label_column) if c and c not in rows[0].fields]
        if missing:
            raise DataError(
                f"{origin}: column(s) {missing} needed by task {task.name} are not in this file "
                f"(columns: {list(rows[0].fields)}); get the complete file: {hub_hint(task)}")
    text_b_column = text_columns[1] if len(text_columns) == 2 else None
    return [
        Record(where=f"{origin}: line {row.line}", text_a=row.fields[text_columns[0]],
               text_b=row.fields[text_b_column] if text_b_column else None,
               label=row.fields[label_column] if label_column else "")
        for row in rows
    ]


def _hub_records(task: Task, split: str) -> list[Record]:
    source = task.source
    hub_split = source.hub_split_map.get(split)
    if not source.hub_id or hub_split is None:
        raise DataNotFoundError(
            f"{task.name}: no local data dir was found and the task has no hub copy of its {split} split; "
            f"download the publisher's file from {source.url} to <data dir>/{source.file_map.get(split)} and pass "
            f"--data-dir / ${DATA_DIR_ENV}")
    try:
        dataset = datasets.load_dataset(source.hub_id, source.hub_config, split=hub_split, revision=source.hub_revision)
    except Exception as error:  # network, offline mode, missing dataset: say what to do instead
        raise DataNotFoundError(
            f"{task.name}: could not load {source.hub_id}/{source.hub_config} split {hub_split} from the hub ({error}); "
            f"without the hub, pass a local mirror (--data-dir / ${DATA_DIR_ENV}) holding "
            f"{source.file_map.get(split)}") from error
    label_feature = dataset.features.get(source.hub_label_column) if source.hub_label_column else None
    to_name = label_feature.int2str if isinstance(label_feature, datasets.ClassLabel) else str
    origin = f"hub {source.hub_id}/{source.hub_config} {hub_split}"
    rows = [RawRow(i + 1, {**row, "_label": to_name(row[source.hub_label_column]) if label_feature else ""})
            for i, row in enumerate(dataset)]
    return _records_from_rows(task, rows, origin, source.hub_text_columns, "_label" if label_feature else None)


def source_records(task: Task, root: Path | None, source_split: str) -> list[Record]:
    return _local_records(task, root, source_split) if root is not None else _hub_records(task, source_split)


def files_signature(task: Task, root: Path | None) -> tuple:
    if root is None:
        return ()
    stats = []
    for _, rel in task.source.files:
        path = root / rel
        stats.append((rel, path.stat().st_mtime_ns, path.stat().st_size) if path.is_file() else (rel, None))
    return tuple(stats)


_HUB_ANSWERS: list[bool] = []  # whether the hub's host answered, asked once per process


def hub_usable() -> bool:
    """Whether `datasets` can load from the hub now: not in offline mode (HF_HUB_OFFLINE or
    HF_DATASETS_OFFLINE) and the hub's host answers (asked once per process)."""
    if datasets.config.HF_HUB_OFFLINE or datasets.config.HF_DATASETS_OFFLINE:
        return False
    if not _HUB_ANSWERS:
        from adaptune.model.backbone import hub_reachable

        _HUB_ANSWERS.append(hub_reachable())
    return _HUB_ANSWERS[0]


def hub_unusable_reason() -> str:
    if datasets.config.HF_HUB_OFFLINE or datasets.config.HF_DATASETS_OFFLINE:
        return "HF_HUB_OFFLINE / HF_DATASETS_OFFLINE is set"
    return "the hub's host does not answer"


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
