"""SQuAD v1.1's rows: the official fields, each split from the mirror where it holds the file, else the hub.

Where the mirror has only SQuAD's dev file and the hub cannot be used, a run trains on the named local
stand-in "squad_dev_standin" instead: dev-v1.1's articles split 80/20 by a hash of their title
(`squad_standin_titles`), which is not the paper's split and says so in every record. (Its features,
the sliding windows, are adaptune.data.squad's.)
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import datasets

from adaptune.data import sources
from adaptune.data.readers import READERS
from adaptune.data.sources import DataError, DataNotFoundError, hub_hint, say
from adaptune.data.splits import SPLIT_SEED, TaskData, seeded_order
from adaptune.data.tasks import SQUAD_STANDIN, Task

STANDIN_TRAIN_FRACTION = 0.8  # of the dev articles (by count) that the stand-in trains on
_SQUAD_FEATURES = datasets.Features({
    "id": datasets.Value("string"), "title": datasets.Value("string"), "context": datasets.Value("string"),
    "question": datasets.Value("string"),
    "answers": {"text": datasets.List(datasets.Value("string")), "answer_start": datasets.List(datasets.Value("int32"))},
})


def load_squad(task: Task, root: Path | None, wanted: tuple[str, ...]) -> datasets.DatasetDict:
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
        if not sources.hub_usable():
            raise DataNotFoundError(
                f"squad: {split} file not found: expected {path} (official SQuAD v1.1 JSON from {task.source.url}), "
                f"and the hub cannot be used ({sources.hub_unusable_reason()}); {hub_hint(task, split)}; or load only the splits "
                f"present, e.g. load_task_data('squad', splits=['validation']), or the local stand-in "
                f"(data_split={SQUAD_STANDIN!r}: train and validation from disjoint dev articles, not the paper's split)")
        parts[split] = _squad_hub(task, split, instead_of=path)
        say(f"squad: {path} is not in the mirror: its {split} split comes from the hub "
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


def load_squad_standin(task: Task, root: Path | None, wanted: tuple[str, ...], announce: bool) -> TaskData:
    """SQUAD_STANDIN: train and validation from disjoint articles of dev-v1.1 (the mirror's file, or the
    hub's validation split where there is no mirror)."""
    unknown = [split for split in wanted if split not in ("train", "validation")]
    if unknown:
        raise ValueError(f"the SQuAD stand-in has splits train and validation, not {unknown}")
    if root is not None:
        path = root / task.source.file_map["validation"]
        if not path.is_file():
            raise DataNotFoundError(f"squad: the stand-in split is made from the dev file, expected at {path} "
                                    f"(official SQuAD v1.1 JSON from {task.source.url}); {hub_hint(task, 'validation')}")
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
        say(f"squad: no {task.source.file_map['train']} in the mirror and the hub cannot be used ({sources.hub_unusable_reason()}): "
             f"using the local stand-in split, {note}")
    return TaskData(datasets.DatasetDict(parts), SQUAD_STANDIN, note)
