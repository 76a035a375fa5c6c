"""Canonical columns and deterministic splits of the classification and regression tasks.

Canonical columns: idx (the row's position in the source after filtering), text_a, text_b (None for
single-text tasks), label (ClassLabel index; float32 for STS-B).

Data splits (`TaskData.data_split`, carried into every run record): "standard" is the project's split
of the task's own files. GLUE: train = train.tsv less a held-out validation slice (seeded, stratified,
`holdout_indices`), validation = that slice (every selection uses it), test = dev.tsv (the reported
score, never seen by selection; GLUE's test labels are private). The additional tasks: 80/10/10 of
their one file (`split_indices`).
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import datasets
import pyarrow as pa
from datasets.table import InMemoryTable

from adaptune.data.sources import DataError, Record, source_records
from adaptune.data.tasks import Task, get_task

SPLIT_SEED = 0
# GLUE: the source file ("train" = train.tsv, "dev" = dev.tsv) each canonical split comes from.
GLUE_SPLIT_SOURCES = {"train": "train", "validation": "train", "test": "dev"}
HOLDOUT_FRACTION = 0.1  # of a GLUE train file held out as validation ...
HOLDOUT_MAX_ROWS = 10_000  # ... capped (MNLI, QQP, QNLI): about the size of their dev sets


@dataclasses.dataclass(frozen=True)
class TaskData:
    """A task's loaded splits and which split scheme they follow (named in every run record)."""

    splits: datasets.DatasetDict
    data_split: str  # STANDARD_SPLIT or SQUAD_STANDIN
    split_note: str | None  # one line for records and reports where the split is not the paper's; else None


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
    records = {role: source_records(task, root, role) for role in roles}
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


def load_classification(task: Task, root: Path | None, wanted: tuple[str, ...] | None) -> datasets.DatasetDict:
    origin = str(root / task.source.file_map[next(iter(task.source.file_map))]) if root else f"hub {task.source.hub_id}"
    if "all" in task.source.file_map:  # one file, split 80/10/10
        records = source_records(task, root, "all")
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
