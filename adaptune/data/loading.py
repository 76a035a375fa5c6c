"""Task data: sources (local mirror or hub), canonical columns, deterministic splits, cached tokenization.

Both sources give records (text_a, text_b, raw label, where it came from) that go through the same
canonicalisation (`_canonical_columns`) and, for the additional tasks, the same split
(`split_indices`), so a mirror and the hub give identical datasets when their raw rows match.

Canonical columns: idx (the row's position in the source after filtering), text_a, text_b (None for
single-text tasks), label (ClassLabel index; float32 for STS-B). SQuAD keeps the official fields.

Data splits (`TaskData.data_split`, carried into every run record): "standard" is the project's split
of the task's own files. GLUE: train = train.tsv less a held-out validation slice (seeded, stratified,
`holdout_indices`), validation = that slice (every selection uses it), test = dev.tsv (the reported
score, never seen by selection; GLUE's test labels are private). The additional tasks: 80/10/10 of
their one file. SQuAD: train-v1.1 / dev-v1.1, each split from the mirror where it holds the file, else
from the hub. Where the mirror has only SQuAD's dev file and the hub cannot be used, a run trains on the named
local stand-in "squad_dev_standin" instead: dev-v1.1's articles split 80/20 by a hash of their title
(`squad_standin_titles`), which is not the paper's split and says so in every record.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import io
import json
import sys
import uuid
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import datasets
import pyarrow as pa
from datasets.table import InMemoryTable

from adaptune.core import environment
from adaptune.core.files import write_json
from adaptune.data.batching import column_values
from adaptune.data.readers import READERS, RawRow, read_header
from adaptune.data.tasks import DATA_SPLITS, SQUAD_STANDIN, STANDARD_SPLIT, Task, get_task  # noqa: F401 (split names, read here too)

DATA_DIR_ENV = "ADAPTUNE_DATA_DIR"
CACHE_DIR_ENV = "ADAPTUNE_CACHE_DIR"
HUB = "hub"  # data_dir value that forces the hub even when a mirror could be found
SPLIT_SEED = 0
TOKENIZED_FORMAT_VERSION = 1  # bump when tokenize_task's output changes, to invalidate old caches
STANDIN_TRAIN_FRACTION = 0.8  # of the dev articles (by count) that the stand-in trains on
# GLUE: the source file ("train" = train.tsv, "dev" = dev.tsv) each canonical split comes from.
GLUE_SPLIT_SOURCES = {"train": "train", "validation": "train", "test": "dev"}
HOLDOUT_FRACTION = 0.1  # of a GLUE train file held out as validation ...
HOLDOUT_MAX_ROWS = 10_000  # ... capped (MNLI, QQP, QNLI): about the size of their dev sets


class DataNotFoundError(FileNotFoundError):
    """A task's data is not where it was expected; the message names the path and the hub alternative."""


class DataError(ValueError):
    """Rows that cannot become a valid dataset: an unknown label, a bad value, an empty split."""


@dataclasses.dataclass(frozen=True)
class TaskData:
    """A task's loaded splits and which split scheme they follow (named in every run record)."""

    splits: datasets.DatasetDict
    data_split: str  # STANDARD_SPLIT or SQUAD_STANDIN
    split_note: str | None  # one line for records and reports where the split is not the paper's; else None


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


# --------------------------------------------------------------------------------------- sources
def resolve_data_dir(data_dir: str | Path | None = None) -> Path | None:
    """The local mirror: the argument, else $ADAPTUNE_DATA_DIR, else the first `shared/data` found
    walking up from the current directory (then from this package's location), else None (the hub).
    The value "hub" (argument or variable) skips the mirror search and forces the hub."""
    from_env = environment.read(DATA_DIR_ENV)
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


def _hub_hint(task: Task, split: str | None = None) -> str:
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
            f"{_hub_hint(task, split)}")
    rows = READERS[task.source.reader](path)
    return _records_from_rows(task, rows, str(path), task.source.text_columns, task.source.label_column)


def _records_from_rows(task: Task, rows: list[RawRow], origin: str, text_columns: tuple[str, ...],
                       label_column: str | None) -> list[Record]:
    if rows:
        missing = [c for c in (*text_columns, label_column) if c and c not in rows[0].fields]
        if missing:
            raise DataError(
                f"{origin}: column(s) {missing} needed by task {task.name} are not in this file "
                f"(columns: {list(rows[0].fields)}); get the complete file: {_hub_hint(task)}")
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


# ------------------------------------------------------------------------------- canonicalisation
def _canonical_columns(task: Task, records: list[Record], labels: tuple[str, ...]) -> dict[str, list[Any]]:
    """text_a / text_b / label columns; drops the task's filtered labels; unknown labels are errors."""
    aliases = task.alias_map
    dropped = set(task.drop_labels)
    index = {name: i for i, name in enumerate(labels)}
    columns: dict[str, list[Any]] = {"idx": [], "text_a": [], "text_b": [], "label": []}
    for record in records:
        raw = record.label.strip()
        if raw in dropped:
            continue
        if task.kind == "regression":
            try:
                value: Any = float(raw)
            except ValueError:
                raise DataError(f"{record.where}: label {raw!r} is not a number ({task.name} is a regression task)") from None
        else:
            name = aliases.get(raw, raw)
            if name not in index:
                raise DataError(
                    f"{record.where}: unknown label {raw!r} for task {task.name} (known: {list(labels)}"
                    + (f", aliases {sorted(aliases)}" if aliases else "") + (f", dropped {sorted(dropped)}" if dropped else "")
                    + "); fix the file, or declare the value in the task's label_aliases / drop_labels in adaptune/data/tasks.py")
            value = index[name]
        columns["idx"].append(len(columns["idx"]))
        columns["text_a"].append(record.text_a.strip())
        columns["text_b"].append(record.text_b.strip() if record.text_b is not None else None)
        columns["label"].append(value)
    return columns


def _label_names(task: Task, records: list[Record], origin: str) -> tuple[str, ...]:
    """The declared labels, or (for tasks whose label set is not declared) the sorted values read, checked
    against the paper's class count."""
    if task.labels or task.kind != "classification":
        return task.labels
    aliases, dropped = task.alias_map, set(task.drop_labels)
    found = sorted({aliases.get(r.label.strip(), r.label.strip()) for r in records} - dropped)
    if task.num_classes and len(found) != task.num_classes:
        raise DataError(f"{origin}: {len(found)} distinct labels, but {task.name} has {task.num_classes} classes "
                        f"(paper, Table 3); found {found[:30]}")
    return tuple(found)


def _features(task: Task, labels: tuple[str, ...]) -> datasets.Features:
    label = datasets.Value("float32") if task.kind == "regression" else datasets.ClassLabel(names=list(labels))
    return datasets.Features({"idx": datasets.Value("int64"), "text_a": datasets.Value("string"),
                              "text_b": datasets.Value("string"), "label": label})


def _to_dataset(columns: dict[str, list[Any]], features: datasets.Features) -> datasets.Dataset:
    """An in-memory Dataset built straight from Arrow arrays (from_dict encodes row by row: ~6x slower)."""
    table = pa.table({name: pa.array(columns[name]) for name in features}).cast(features.arrow_schema)
    return datasets.Dataset(InMemoryTable(table), info=datasets.DatasetInfo(features=features))


def seeded_order(items: Sequence[Any], seed: int = SPLIT_SEED) -> list[Any]:
    """`items` ordered by sha256(f"{seed}:{item}"): the same order on every machine and library version
    (hand-written instead of a numpy permutation, which does not promise the same stream across versions)."""
    return sorted(items, key=lambda item: hashlib.sha256(f"{seed}:{item}".encode()).digest())


def split_indices(n: int, seed: int = SPLIT_SEED) -> dict[str, list[int]]:
    """The additional tasks' 80/10/10 split of n rows, identical on every machine and library version.

    train = floor(0.8 n), validation = floor((n - train) / 2), test = the rest: this reproduces every
    size in the paper's Table 3. Rows are taken in `seeded_order`; each split keeps source order.
    """
    order = seeded_order(range(n), seed)
    n_train = 8 * n // 10
    n_validation = (n - n_train) // 2
    cuts = {"train": order[:n_train], "validation": order[n_train:n_train + n_validation],
            "test": order[n_train + n_validation:]}
    return {split: sorted(rows) for split, rows in cuts.items()}


def holdout_size(n_rows: int) -> int:
    """Rows of a GLUE train file held out for validation: 10%, at most 10,000, at least 1."""
    return max(1, min(int(HOLDOUT_FRACTION * n_rows), HOLDOUT_MAX_ROWS))


def holdout_indices(labels: Sequence[Any], n_holdout: int, seed: int = SPLIT_SEED) -> dict[str, list[int]]:
    """A stratified validation slice of n_holdout rows: {"train": rows kept, "validation": rows held out}.

    Each stratum (a class; for a regression score, its integer part, 5.0 with 4) gives its share of
    n_holdout by largest remainder, so class proportions match the file's. Within a stratum the first
    rows in `seeded_order` are held out. Both lists keep source order.
    """
    n = len(labels)
    if not 0 < n_holdout < n:
        raise ValueError(f"cannot hold out {n_holdout} of {n} rows")
    strata: dict[Any, list[int]] = {}
    for row, label in enumerate(labels):
        key = min(int(label), 4) if isinstance(label, float) else label
        strata.setdefault(key, []).append(row)
    exact = {key: n_holdout * len(rows) / n for key, rows in strata.items()}
    quota = {key: int(value) for key, value in exact.items()}
    by_remainder = sorted(strata, key=lambda key: (-(exact[key] - quota[key]), str(key)))
    for key in by_remainder[: n_holdout - sum(quota.values())]:
        quota[key] += 1
    held: set[int] = set()
    for key, rows in strata.items():
        held.update(seeded_order(rows, seed)[: quota[key]])
    return {"train": [i for i in range(n) if i not in held], "validation": sorted(held)}


def _glue_parts(task: Task, root: Path | None, wanted: tuple[str, ...], origin: str) -> dict[str, datasets.Dataset]:
    """GLUE's canonical splits: train and validation from train.tsv (`holdout_indices`), test = dev.tsv."""
    unknown = sorted(set(wanted) - set(GLUE_SPLIT_SOURCES))
    if unknown:
        raise ValueError(f"{task.name} has no split(s) {unknown}; its splits are {list(GLUE_SPLIT_SOURCES)} "
                         "(validation: a held-out slice of train.tsv; test: dev.tsv)")
    roles = [role for role in task.source.file_map if role in {GLUE_SPLIT_SOURCES[split] for split in wanted}]
    records = {role: _source_records(task, root, role) for role in roles}
    labels = _label_names(task, [r for rs in records.values() for r in rs], origin)
    files = {role: _to_dataset(_canonical_columns(task, rs, labels), _features(task, labels)) for role, rs in records.items()}
    parts: dict[str, datasets.Dataset] = {}
    if "train" in files:
        whole = files["train"]
        if len(whole) < 2:
            raise DataError(f"{task.name}: {_split_origin(task, root, 'train')} has {len(whole)} usable row(s); "
                            "a validation slice needs at least 2")
        rows = holdout_indices(whole["label"], holdout_size(len(whole)))
        parts = {"train": whole.select(rows["train"]), "validation": whole.select(rows["validation"])}
    if "dev" in files:
        parts["test"] = files["dev"]
    return {split: parts[split] for split in wanted}


def splits_in_files(task: Task | str, roles: Sequence[str]) -> tuple[str, ...]:
    """The canonical splits that can be built from the given source files (e.g. QNLI's mirror, dev.tsv
    alone: ("test",))."""
    task = get_task(task)
    if task.family == "glue":
        return tuple(split for split, role in GLUE_SPLIT_SOURCES.items() if role in roles)
    if "all" in task.source.file_map:
        return ("train", "validation", "test") if "all" in roles else ()
    return tuple(role for role in task.source.file_map if role in roles)


# ------------------------------------------------------------------------------------------ loading
_LOADED: dict[tuple, TaskData] = {}  # parsed datasets, keyed by source files and their mtimes


def load_task_data(task: Task | str, data_dir: str | Path | None = None, splits: Sequence[str] | None = None,
                   data_split: str | None = None) -> datasets.DatasetDict:
    """The task's canonical splits (train / validation / test where labelled) from the mirror or the hub.

    `splits` restricts which splits to load (e.g. ("validation",) for evaluation alone). `data_split`:
    see `load_task_splits`, which also says which split scheme the data follows.
    """
    return load_task_splits(task, data_dir, splits, data_split).splits


@quiet_datasets()
def load_task_splits(task: Task | str, data_dir: str | Path | None = None, splits: Sequence[str] | None = None,
                     data_split: str | None = None) -> TaskData:
    """`load_task_data`'s splits, with the split scheme they follow and its note for the run record.

    `data_split` None chooses (`choose_data_split`): the task's standard splits, each from the mirror
    where it holds the file, else from the hub; SQuAD asked for its train split where neither the
    mirror nor the hub has it gets the local stand-in SQUAD_STANDIN, and one line on stderr says so.
    "standard" never falls back to the stand-in; SQUAD_STANDIN always uses it (from the mirror's dev
    file, or the hub's validation split).
    """
    task = get_task(task)
    root = resolve_data_dir(data_dir)
    wanted = tuple(splits) if splits is not None else None
    chosen = _choose_data_split(task, root, wanted) if data_split is None else _checked_data_split(task, data_split)
    key = (task.name, str(root), wanted, _files_signature(task, root), chosen)
    if key not in _LOADED:
        if chosen == SQUAD_STANDIN:
            loaded = _load_squad_standin(task, root, wanted or tuple(task.source.file_map), announce=data_split is None)
        elif task.family == "squad":
            loaded = TaskData(_load_squad(task, root, wanted or tuple(task.source.file_map)), STANDARD_SPLIT, None)
        else:
            loaded = TaskData(_load_classification(task, root, wanted), STANDARD_SPLIT, None)
        _LOADED[key] = loaded
    return _LOADED[key]


def choose_data_split(task: Task | str, data_dir: str | Path | None = None, splits: Sequence[str] | None = None) -> str:
    """The split scheme `load_task_splits` uses by default: SQUAD_STANDIN for SQuAD when its train split
    is wanted, the mirror lacks train-v1.1.json but holds dev-v1.1.json, and the hub cannot be used
    (offline mode, or its host does not answer); else STANDARD_SPLIT."""
    return _choose_data_split(get_task(task), resolve_data_dir(data_dir), tuple(splits) if splits is not None else None)


def _choose_data_split(task: Task, root: Path | None, splits: tuple[str, ...] | None) -> str:
    if task.family != "squad" or root is None or (splits is not None and "train" not in splits):
        return STANDARD_SPLIT
    files = task.source.file_map
    if (root / files["train"]).is_file() or not (root / files["validation"]).is_file():
        return STANDARD_SPLIT
    return STANDARD_SPLIT if _hub_usable() else SQUAD_STANDIN


def _checked_data_split(task: Task, data_split: str) -> str:
    if data_split not in DATA_SPLITS:
        raise ValueError(f"unknown data split {data_split!r}; known: {list(DATA_SPLITS)}")
    if data_split == SQUAD_STANDIN and task.family != "squad":
        raise ValueError(f"the data split {SQUAD_STANDIN!r} is SQuAD's local stand-in, not one of {task.name}'s")
    return data_split


_HUB_ANSWERS: list[bool] = []  # whether the hub's host answered, asked once per process


def _hub_usable() -> bool:
    """Whether `datasets` can load from the hub now: not in offline mode (HF_HUB_OFFLINE or
    HF_DATASETS_OFFLINE) and the hub's host answers (asked once per process)."""
    if datasets.config.HF_HUB_OFFLINE or datasets.config.HF_DATASETS_OFFLINE:
        return False
    if not _HUB_ANSWERS:
        from adaptune.model.backbone import hub_reachable

        _HUB_ANSWERS.append(hub_reachable())
    return _HUB_ANSWERS[0]


def _hub_unusable_reason() -> str:
    if datasets.config.HF_HUB_OFFLINE or datasets.config.HF_DATASETS_OFFLINE:
        return "HF_HUB_OFFLINE / HF_DATASETS_OFFLINE is set"
    return "the hub's host does not answer"


def _files_signature(task: Task, root: Path | None) -> tuple:
    if root is None:
        return ()
    stats = []
    for _, rel in task.source.files:
        path = root / rel
        stats.append((rel, path.stat().st_mtime_ns, path.stat().st_size) if path.is_file() else (rel, None))
    return tuple(stats)


def _source_records(task: Task, root: Path | None, source_split: str) -> list[Record]:
    return _local_records(task, root, source_split) if root is not None else _hub_records(task, source_split)


def _load_classification(task: Task, root: Path | None, wanted: tuple[str, ...] | None) -> datasets.DatasetDict:
    origin = str(root / task.source.file_map[next(iter(task.source.file_map))]) if root else f"hub {task.source.hub_id}"
    if "all" in task.source.file_map:  # one file, split 80/10/10
        records = _source_records(task, root, "all")
        labels = _label_names(task, records, origin)
        columns = _canonical_columns(task, records, labels)
        pooled = _to_dataset(columns, _features(task, labels))
        parts = {split: pooled.select(rows) for split, rows in split_indices(len(pooled)).items()}
    else:
        parts = _glue_parts(task, root, wanted or tuple(GLUE_SPLIT_SOURCES), origin)
    if wanted is not None:
        unknown = sorted(set(wanted) - set(parts))
        if unknown:
            raise ValueError(f"{task.name} has no split(s) {unknown}; its splits are {sorted(parts)}")
        parts = {s: parts[s] for s in wanted}
    for split, dataset in parts.items():
        if len(dataset) == 0:
            raise DataError(f"{task.name}: the {split} split is empty after reading {_split_origin(task, root, split)}; "
                            "the file holds no usable rows (check it, or re-download it)")
    return datasets.DatasetDict(parts)


def _split_origin(task: Task, root: Path | None, split: str) -> str:
    """Where a split's rows come from: its own file, the file it is cut from (GLUE's validation slice of
    train.tsv; the additional tasks' 80/10/10), or its hub split."""
    source = task.source
    role = GLUE_SPLIT_SOURCES[split] if task.family == "glue" and split in GLUE_SPLIT_SOURCES else split
    held_out = " (its held-out validation slice)" if task.family == "glue" and split == "validation" else ""
    if root is None:
        return f"hub {source.hub_id}/{source.hub_config} split {source.hub_split_map.get(role, role)}{held_out}"
    if role in source.file_map:
        return str(root / source.file_map[role]) + held_out
    return f"{root / source.file_map['all']} (its {split} part of the 80/10/10 split)"


_SQUAD_FEATURES = datasets.Features({
    "id": datasets.Value("string"), "title": datasets.Value("string"), "context": datasets.Value("string"),
    "question": datasets.Value("string"),
    "answers": {"text": datasets.List(datasets.Value("string")), "answer_start": datasets.List(datasets.Value("int32"))},
})


def _load_squad(task: Task, root: Path | None, wanted: tuple[str, ...]) -> datasets.DatasetDict:
    """The official splits, each from the mirror where it holds the file, else from the hub (per split:
    a mirror with only dev-v1.1.json gets train from the hub where the hub can be used)."""
    parts: dict[str, datasets.Dataset] = {}
    for split in wanted:
        if split not in task.source.file_map:
            raise ValueError(f"squad has no split {split!r}; its splits are {list(task.source.file_map)}")
        if root is None:
            parts[split] = _squad_hub(task, split)
            continue
        path = root / task.source.file_map[split]
        if path.is_file():
            parts[split] = _squad_local(path, split)
            continue
        if not _hub_usable():
            raise DataNotFoundError(
                f"squad: {split} file not found: expected {path} (official SQuAD v1.1 JSON from {task.source.url}), "
                f"and the hub cannot be used ({_hub_unusable_reason()}); {_hub_hint(task, split)}; or load only the splits "
                f"present, e.g. load_task_data('squad', splits=['validation']), or the local stand-in "
                f"(data_split={SQUAD_STANDIN!r}: train and validation from disjoint dev articles, not the paper's split)")
        parts[split] = _squad_hub(task, split, instead_of=path)
        _say(f"squad: {path} is not in the mirror: its {split} split comes from the hub "
             f"({task.source.hub_id} {task.source.hub_split_map[split]}), the other splits from {root}")
    return datasets.DatasetDict(parts)


def _squad_hub(task: Task, split: str, instead_of: Path | None = None) -> datasets.Dataset:
    hub_split = task.source.hub_split_map[split]
    try:
        dataset = datasets.load_dataset(task.source.hub_id, task.source.hub_config, split=hub_split,
                                        revision=task.source.hub_revision)
    except Exception as error:
        missing = f"{instead_of} is not in the mirror and " if instead_of is not None else ""
        raise DataNotFoundError(f"squad: {missing}could not load {task.source.hub_id} {hub_split} from the hub ({error}); "
                                f"pass a data dir holding {task.source.file_map[split]}") from error
    return dataset.cast(_SQUAD_FEATURES)


def _squad_local(path: Path, split: str) -> datasets.Dataset:
    rows = READERS["squad_json"](path)
    columns: dict[str, list[Any]] = {name: [] for name in _SQUAD_FEATURES}
    for row in rows:
        for name in ("id", "title", "context", "question"):
            columns[name].append(row.fields[name])
        columns["answers"].append(json.loads(row.fields["answers"]))
    if not rows:
        raise DataError(f"{path}: the {split} split is empty (no questions)")
    return datasets.Dataset.from_dict(columns, features=_SQUAD_FEATURES)


def squad_standin_titles(titles: Sequence[str], seed: int = SPLIT_SEED) -> dict[str, list[str]]:
    """The stand-in's articles: {"train": titles, "validation": titles}, disjoint, in first-seen order.

    Distinct titles are taken in `seeded_order`; the first floor(0.8 n) of that order train (at least one, and one left to evaluate on),
    the rest validate. Whole articles go to one side, so no context is both trained and scored on.
    """
    distinct = list(dict.fromkeys(titles))
    if len(distinct) < 2:
        raise DataError(f"the SQuAD stand-in needs at least 2 articles to split, got {len(distinct)}")
    order = seeded_order(distinct, seed)
    n_train = min(max(int(STANDIN_TRAIN_FRACTION * len(distinct)), 1), len(distinct) - 1)
    train = set(order[:n_train])
    return {"train": [t for t in distinct if t in train], "validation": [t for t in distinct if t not in train]}


def _load_squad_standin(task: Task, root: Path | None, wanted: tuple[str, ...], announce: bool) -> TaskData:
    """SQUAD_STANDIN: train and validation from disjoint articles of dev-v1.1 (the mirror's file, or the
    hub's validation split where there is no mirror)."""
    unknown = [split for split in wanted if split not in ("train", "validation")]
    if unknown:
        raise ValueError(f"the SQuAD stand-in has splits train and validation, not {unknown}")
    if root is not None:
        path = root / task.source.file_map["validation"]
        if not path.is_file():
            raise DataNotFoundError(f"squad: the stand-in split is made from the dev file, expected at {path} "
                                    f"(official SQuAD v1.1 JSON from {task.source.url}); {_hub_hint(task, 'validation')}")
        dev, origin = _squad_local(path, "validation"), str(path)
    else:
        dev, origin = _squad_hub(task, "validation"), f"hub {task.source.hub_id} validation"
    titles = squad_standin_titles(dev["title"])
    side = {title: split for split, names in titles.items() for title in names}
    rows_of: dict[str, list[int]] = {"train": [], "validation": []}
    for index, title in enumerate(dev["title"]):
        rows_of[side[title]].append(index)
    parts = {split: dev.select(rows_of[split]) for split in wanted}
    note = (f"{SQUAD_STANDIN}: NOT the paper's split (the paper trains on train-v1.1 and scores all of dev-v1.1): "
            f"train = {len(rows_of['train'])} questions of {len(titles['train'])} dev-v1.1 articles, validation = "
            f"{len(rows_of['validation'])} questions of the other {len(titles['validation'])} articles (articles assigned "
            f"by sha256 of their title, {int(STANDIN_TRAIN_FRACTION * 100)}% of them to train), from {origin}")
    if announce:
        _say(f"squad: no {task.source.file_map['train']} in the mirror and the hub cannot be used ({_hub_unusable_reason()}): "
             f"using the local stand-in split, {note}")
    return TaskData(datasets.DatasetDict(parts), SQUAD_STANDIN, note)


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------- tokenization
def default_cache_dir() -> Path:
    """$ADAPTUNE_CACHE_DIR, empty or unset ~/.cache/adaptune: one rule with the status cache's."""
    return environment.cache_dir()


def dataset_fingerprint(dataset_dict: datasets.DatasetDict) -> str:
    """A content hash of every split (its features, and the Arrow IPC bytes of its rows in one record batch,
    without the schema's metadata, where datasets keeps a fingerprint of how the table was made), so equal
    data gives an equal cache key however it was selected or chunked."""
    digest = hashlib.sha256()
    for split in sorted(dataset_dict):
        dataset = dataset_dict[split]
        table = dataset.with_format(None).data.table
        if dataset._indices is not None:  # a select()ed view: the rows it shows, taken in Arrow (flatten_indices
            table = table.take(dataset._indices.column(0))  # rewrote them row by row: 9 s for SST-2's, every run)
        table = table.combine_chunks().replace_schema_metadata(None)
        sink = io.BytesIO()
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
        features = json.dumps(dataset.features.to_dict(), sort_keys=True)
        digest.update(split.encode() + b"\0" + features.encode() + b"\0" + sink.getvalue())
    return digest.hexdigest()


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """Hash of what decides token ids: the fast tokenizer's full JSON (vocab, normaliser), else the vocab."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        # Truncation/padding state changes with every call (it records the last max_length): not content.
        state = {k: v for k, v in json.loads(backend.to_str()).items() if k not in ("truncation", "padding")}
        content = json.dumps(state, sort_keys=True)
    else:
        content = json.dumps(sorted(tokenizer.get_vocab().items()))
    return hashlib.sha256(f"{type(tokenizer).__name__}\0{content}".encode()).hexdigest()


def tokenization_key(task: Task | str, dataset_dict: datasets.DatasetDict, tokenizer: Any, max_length: int) -> str:
    task = get_task(task)
    parts = [task.name, dataset_fingerprint(dataset_dict), tokenizer_fingerprint(tokenizer), str(max_length),
             str(TOKENIZED_FORMAT_VERSION)]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


@quiet_datasets()
def tokenize_task(task: Task | str, dataset_dict: datasets.DatasetDict, tokenizer: Any, max_length: int = 128,
                  cache_dir: str | Path | None = None) -> datasets.DatasetDict:
    """input_ids, attention_mask, token_type_ids (if the tokenizer gives them), labels; unpadded.

    Cached under <cache_dir>/tokenized/, the key hashing the data content, the tokenizer's content and
    max_length: a task is tokenized once and reused by every run (and across processes). Each writer
    saves into a directory of its own, then publishes it by writing the small file <task>-<key>.json
    last: no directory is ever renamed (Cloud Storage FUSE refuses that: adaptune/sweep/store.py), and a
    reader never sees half a cache. Two racing writers both finish; the later marker wins.
    """
    task = get_task(task)
    if task.kind == "span":
        raise ValueError("squad is tokenized with sliding windows by adaptune.data.squad.prepare_features, not tokenize_task")
    cache_root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    name = f"{task.name}-{tokenization_key(task, dataset_dict, tokenizer, max_length)}"
    published = _published_cache(cache_root / "tokenized", name)
    if published is not None:
        return datasets.load_from_disk(str(published))

    def encode(batch: dict[str, list]) -> dict[str, list]:
        second = batch["text_b"] if task.is_pair else None
        encoded = tokenizer(batch["text_a"], second, truncation=True, max_length=max_length)
        return {**encoded, "labels": batch["label"]}

    tokenized = dataset_dict.map(encode, batched=True, batch_size=1000,
                                 remove_columns=["text_a", "text_b", "label"], desc=f"tokenize {task.name}")
    tokenized = tokenized.cast_column("labels", next(iter(dataset_dict.values())).features["label"])
    own = cache_root / "tokenized" / f"{name}.{uuid.uuid4().hex[:12]}"
    tokenized.save_to_disk(str(own))
    write_json(cache_root / "tokenized" / f"{name}.json", {"dir": own.name})
    return datasets.load_from_disk(str(own))


def _published_cache(tokenized_root: Path, name: str) -> Path | None:
    """The directory the marker <name>.json points to, if it is whole; a cache written before markers
    (<name>/dataset_dict.json) is still read."""
    marker = tokenized_root / f"{name}.json"
    if marker.is_file():
        target = tokenized_root / json.loads(marker.read_text())["dir"]
        if (target / "dataset_dict.json").is_file():
            return target
    legacy = tokenized_root / name
    return legacy if (legacy / "dataset_dict.json").is_file() else None


# ------------------------------------------------------------------------------------------ prepare
@quiet_datasets()
def prepare(task: Task | str, data_dir: str | Path | None = None, tokenizer_name: str | None = None,
            cache_dir: str | Path | None = None, max_length: int = 128) -> dict[str, Any]:
    """Load, split and tokenize one task (cached); returns where it went, split sizes and label counts.

    With a local mirror, splits whose files the mirror lacks (QNLI and SQuAD train) are skipped and
    listed under `missing_splits`. SQuAD is saved untokenized (its windows belong to adaptune.data.squad).
    """
    task = get_task(task)
    root = resolve_data_dir(data_dir)
    splits = None
    missing: dict[str, str] = {}
    if root is not None:
        present = [s for s, rel in task.source.files if (root / rel).is_file()]
        missing = {s: f"{root / rel} not found; {_hub_hint(task, s)}" for s, rel in task.source.files if s not in present}
        if not present:
            raise DataNotFoundError(f"{task.name}: none of its files are in {root}: " + "; ".join(missing.values()))
        splits = splits_in_files(task, present) if missing else None
    raw = load_task_data(task, root, splits=splits)
    cache_root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    if task.kind == "span":
        output = cache_root / "raw" / f"{task.name}-{dataset_fingerprint(raw)[:16]}"
        if not (output / "dataset_dict.json").is_file():
            raw.save_to_disk(str(output))
    else:
        from adaptune.model.backbone import load_tokenizer

        tokenized = tokenize_task(task, raw, load_tokenizer(tokenizer_name), max_length=max_length, cache_dir=cache_root)
        output = Path(next(iter(tokenized.values())).cache_files[0]["filename"]).parent.parent
    return {
        "task": task.name,
        "source": str(root) if root else f"hub {task.source.hub_id}",
        "output_dir": str(output),
        "splits": {split: {"rows": len(ds), "labels": _label_distribution(task, ds)} for split, ds in raw.items()},
        "missing_splits": missing,
    }


def _label_distribution(task: Task, dataset: datasets.Dataset) -> dict[str, Any]:
    if task.kind == "span":
        return {}
    if task.kind == "regression":
        values = column_values(dataset, "label")
        return {"min": float(min(values)), "max": float(max(values)), "mean": float(sum(values) / len(values))}
    names = dataset.features["label"].names
    counts = Counter(column_values(dataset, "label"))
    return {names[i]: counts.get(i, 0) for i in range(len(names))}
