"""Task data: a task's canonical splits from its source, and `prepare`, which also tokenizes them (cached).

The parts: sources (adaptune.data.sources: mirror or hub), canonical columns and deterministic splits
(adaptune.data.splits), SQuAD's rows and its local stand-in (adaptune.data.squad_data), and the
tokenization cache (adaptune.data.token_cache). Which split scheme a load follows is chosen here
(`choose_data_split`) and named in every run record (`TaskData`).
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import datasets

from adaptune.data import sources
from adaptune.data.batching import column_values
from adaptune.data.prepared import PreparedData, is_prepared
from adaptune.data.sources import DataNotFoundError, files_signature, hub_hint, quiet_datasets, resolve_data_dir
from adaptune.data.splits import TaskData, load_classification, splits_in_files
from adaptune.data.squad_data import load_squad, load_squad_standin
from adaptune.data.tasks import DATA_SPLITS, SQUAD_STANDIN, STANDARD_SPLIT, Task, get_task
from adaptune.data.token_cache import dataset_fingerprint, default_cache_dir, tokenize_task

_LOADED: dict[tuple, TaskData] = {}  # parsed datasets, keyed by source files and their mtimes


def load_task_data(task: Task | str, data_dir: str | Path | None = None, splits: Sequence[str] | None = None,
                   data_split: str | None = None) -> datasets.DatasetDict:
    """The task's canonical splits (train / validation / test where labelled) from the mirror or the hub.

    `splits` restricts which splits to load (e.g. ("validation",) for evaluation alone). `data_split`:
    see `load_task_splits`, which also says which split scheme the data follows.
    """
    return load_task_splits(task, data_dir, splits, data_split).splits


@quiet_datasets()
def load_task_splits(task: Task | str, data_dir: str | os.PathLike[str] | None = None, splits: Sequence[str] | None = None,
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
    if is_prepared(root):
        return _prepared_splits(task, root, wanted, data_split)
    chosen = _choose_data_split(task, root, wanted) if data_split is None else _checked_data_split(task, data_split)
    key = (task.name, str(root), wanted, files_signature(task, root), chosen)
    if key not in _LOADED:
        if chosen == SQUAD_STANDIN:
            loaded = load_squad_standin(task, root, wanted or tuple(task.source.file_map), announce=data_split is None)
        elif task.family == "squad":
            loaded = TaskData(load_squad(task, root, wanted or tuple(task.source.file_map)), STANDARD_SPLIT, None)
        else:
            loaded = TaskData(load_classification(task, root, wanted), STANDARD_SPLIT, None)
        _LOADED[key] = loaded
    return _LOADED[key]


def _prepared_splits(task: Task, root: Path, wanted: tuple[str, ...] | None, data_split: str | None) -> TaskData:
    loaded = PreparedData.open(root).task_data(task, wanted)
    if data_split is not None and data_split != loaded.data_split:
        raise DataNotFoundError(f"{task.name}: the prepared data {root} follows the {loaded.data_split!r} split, not the "
                                f"{data_split!r} this run was trained on; prepare it from the data that run used")
    return loaded


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
    return STANDARD_SPLIT if sources.hub_usable() else SQUAD_STANDIN


def _checked_data_split(task: Task, data_split: str) -> str:
    if data_split not in DATA_SPLITS:
        raise ValueError(f"unknown data split {data_split!r}; known: {list(DATA_SPLITS)}")
    if data_split == SQUAD_STANDIN and task.family != "squad":
        raise ValueError(f"the data split {SQUAD_STANDIN!r} is SQuAD's local stand-in, not one of {task.name}'s")
    return data_split


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
        missing = {s: f"{root / rel} not found; {hub_hint(task, s)}" for s, rel in task.source.files if s not in present}
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
