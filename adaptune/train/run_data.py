"""A run's data: load a task's splits, subsample them (seeded), tokenize, and shape them for the loop."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from typing import Any

from datasets import Dataset, DatasetDict

from adaptune.data.batching import column_values, model_rows, subsample
from adaptune.data.loading import load_task_splits
from adaptune.data.prepared import PreparedData, is_prepared
from adaptune.data.sources import quiet_datasets, resolve_data_dir
from adaptune.data.squad import check_window, prepare_features
from adaptune.data.tasks import STANDARD_SPLIT, Task
from adaptune.data.token_cache import tokenize_task
from adaptune.train.evaluate import EvalSplit, curve_split

EVAL_SPLITS = ("validation", "test")


@dataclasses.dataclass
class RunData:
    train_rows: list[dict[str, Any]]  # empty when prepared for evaluation only
    eval_splits: dict[str, EvalSplit]  # "validation", and "test" where the task has a labelled test split
    data_split: str = STANDARD_SPLIT  # the split scheme (adaptune.data.splits.TaskData), named in the run record
    split_note: str | None = None  # where it is not the paper's split: what it is instead
    split_sizes: dict[str, int] = dataclasses.field(default_factory=dict)  # rows each split was used with
    # What an epoch's curve point scores before the last (evaluate.curve_split): made once, shared by a group's runs.
    curve: EvalSplit | None = None

    def __post_init__(self) -> None:
        if self.curve is None and "validation" in self.eval_splits:
            self.curve = curve_split(self.eval_splits["validation"])


@quiet_datasets()  # no progress bars from map/save/load: a run prints its own per-epoch lines
def prepare_run_data(
    task: Task,
    tokenizer: Any,
    max_length: int,
    doc_stride: int,
    max_train_examples: int | None,
    max_eval_examples: int | None,
    data_dir: str | os.PathLike[str] | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    with_train: bool = True,
    data_split: str | None = None,
    eval_only: Sequence[str] = ("validation",),
) -> RunData:
    """Everything a run (or, `with_train=False`, an evaluation of the `eval_only` splits) feeds its
    model, from the real splits.

    `data_split` None: the task's standard splits, or SQuAD's local stand-in where a run needs a train
    split that neither the mirror nor the hub has (adaptune.data.loading.load_task_splits). An ablation passes
    the split its run was trained on, so that it scores the same validation questions.
    """
    # Evaluation alone loads only the splits it scores: the local SQuAD mirror lacks a train file, and
    # scoring MNLI-mm's dev set needs no parse of MNLI's train file.
    loaded = load_task_splits(task, data_dir, splits=None if with_train else tuple(eval_only), data_split=data_split)
    raw = loaded.splits
    if with_train and "validation" not in raw:
        raise ValueError(f"task {task.name!r} has no validation split (splits: {list(raw)}); the run is selected on it")
    wanted = {"validation": max_eval_examples, "test": max_eval_examples}
    if with_train:
        wanted["train"] = max_train_examples
    root = resolve_data_dir(data_dir)
    prepared = PreparedData.open(root) if is_prepared(root) else None
    if task.kind == "span":
        subsets = _subsample_splits(raw, wanted)
        windows = prepared.tokenized(task, tokenizer, max_length, list(subsets), doc_stride) if prepared else None
        span = _span_data(subsets, tokenizer, max_length, doc_stride, windows)
        return dataclasses.replace(span, split_sizes={name: len(split) for name, split in subsets.items()},
                                   data_split=loaded.data_split, split_note=loaded.split_note)
    # Tokenize whole splits (cached per task, shared by every run of every shard; prepared data: tokenized by the
    # preparation step), then subsample: the subset depends only on the split's length, so it picks the same rows.
    whole = (prepared.tokenized(task, tokenizer, max_length, list(raw)) if prepared
             else tokenize_task(task, raw, tokenizer, max_length, cache_dir))
    tokenized = _subsample_splits(whole, wanted)
    eval_splits = {}
    for name in EVAL_SPLITS:
        if name in tokenized and _has_labels(tokenized[name]):
            eval_splits[name] = EvalSplit(name, model_rows(tokenized[name]), references=column_values(tokenized[name], "labels"))
    sizes = {name: len(split) for name, split in tokenized.items()}
    return RunData(train_rows=model_rows(tokenized["train"]) if with_train else [], eval_splits=eval_splits,
                   split_sizes=sizes, data_split=loaded.data_split, split_note=loaded.split_note)


def _subsample_splits(splits: DatasetDict, wanted: dict[str, int | None]) -> DatasetDict:
    return DatasetDict({name: subsample(splits[name], limit) for name, limit in wanted.items() if name in splits})


def _has_labels(split: Dataset) -> bool:
    """A split is scored only when it carries real labels (GLUE-style hidden test labels are -1 or None)."""
    if "labels" not in split.column_names or len(split) == 0:
        return False
    return all(label is not None and label != -1 for label in column_values(split, "labels"))


def _span_data(splits: DatasetDict, tokenizer: Any, max_length: int, doc_stride: int, windows: DatasetDict | None = None) -> RunData:
    """The windows of each split's questions: made here, or (`windows`, the prepared data's) taken for the questions
    sampled, in their order: a question's windows do not depend on the others it is tokenized with."""
    check_window(max_length, doc_stride)
    options = {"tokenizer": tokenizer, "max_length": max_length, "doc_stride": doc_stride}

    def features_of(name: str, examples: Dataset, for_evaluation: bool) -> Dataset:
        if windows is not None:
            return _windows_of(windows[name], examples["id"])
        return examples.map(prepare_features, batched=True, remove_columns=examples.column_names,
                            fn_kwargs={**options, "for_evaluation": for_evaluation})

    train_rows: list[dict[str, Any]] = []
    if "train" in splits:
        train_rows = model_rows(features_of("train", splits["train"], False))
    eval_splits = {}
    for name in EVAL_SPLITS:
        if name not in splits:
            continue
        examples = splits[name]
        features = features_of(name, examples, True)
        rows = [{k: v for k, v in row.items() if k not in ("start_positions", "end_positions")} for row in model_rows(features)]
        eval_splits[name] = EvalSplit(name, rows, examples=examples, features=features.select_columns(["example_id", "offset_mapping"]))
    return RunData(train_rows=train_rows, eval_splits=eval_splits)


def _windows_of(windows: Dataset, question_ids: list[str]) -> Dataset:
    """The windows of these questions, question after question, each question's in their own order."""
    positions: dict[str, list[int]] = {}
    for index, question_id in enumerate(column_values(windows, "example_id")):
        positions.setdefault(question_id, []).append(index)
    return windows.select([index for question_id in question_ids for index in positions[question_id]])
