"""Evaluate a model on one prepared split: predictions in the data's order, then the task's metrics."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
from datasets import Dataset
from torch import nn
from transformers import DataCollatorWithPadding

from adaptune.core.devices import Device
from adaptune.data.batching import column_values, evaluation_batches, iterate_batches
from adaptune.data.splits import seeded_order
from adaptune.data.squad import postprocess_predictions
from adaptune.data.tasks import Task
from adaptune.train.metrics import compute_metrics, squad_scores

# Rows a batch on a CPU (batches are sorted by length, so larger ones add little padding): MiniLM on SST-2's
# validation rows in bf16, 64 a batch took 1.25 ms a row on 1 thread against 1.41 at 32 and 1.33 at 128, and 0.80 on 2
# threads against 1.02 at 32 and 0.79 at 128 (bench/LOG.md, 2026-12-07).
EVAL_BATCH_SIZE = 64
# On a GPU an evaluation batch is bound by the host launching its kernels (a fused group's forward pass launches
# what its training step's does), so fewer, larger batches: sorted by length, they add little padding.
GPU_EVAL_BATCH_SIZE = 128
# An epoch's curve point before the last scores a seeded subset of the validation split, at most this many rows: the
# curve only shows how training went, while the result (and selection) is the final epoch's whole validation split.
# 1,000 rows put a curve point's accuracy within about 1.5 points (one standard error) of the whole split's.
CURVE_ROWS = 1000


def evaluation_batch_size(device: Device) -> int:
    """Rows a batch when evaluating on this device."""
    return GPU_EVAL_BATCH_SIZE if device.kind == "cuda" else EVAL_BATCH_SIZE


@dataclasses.dataclass
class EvalSplit:
    """One split ready to evaluate: model rows, and what the metric compares them with.

    Classification/regression: `references` are the labels, one per row. Span (SQuAD): rows are
    sliding-window features; `features` keeps their example ids and offsets and `examples` the
    raw questions with their gold answers.
    """

    name: str
    rows: list[dict[str, Any]]
    references: list[Any] | None = None
    examples: Dataset | None = None
    features: Dataset | None = None
    # A subset of another split (EvalSplit.subset): which split, and the positions of its rows there.
    parent: EvalSplit | None = None
    positions: list[int] | None = None

    @property
    def lengths(self) -> list[int]:
        return [len(row["input_ids"]) for row in self.rows]

    def subset(self, positions: list[int]) -> EvalSplit:
        """These rows of a classification or regression split, in this order (a span split's windows are not rows)."""
        assert self.references is not None, "a span split has no row subsets"
        return EvalSplit(self.name, [self.rows[i] for i in positions], [self.references[i] for i in positions],
                         parent=self, positions=positions)


def curve_split(validation: EvalSplit, rows: int | None = None) -> EvalSplit:
    """The rows an epoch's curve point scores: the whole split where it has at most `rows` (CURVE_ROWS) or is a span
    split, else a seeded subset of `rows` of them, in the split's order."""
    rows = CURVE_ROWS if rows is None else rows
    if len(validation.rows) <= rows or validation.references is None:
        return validation
    return validation.subset(sorted(seeded_order(range(len(validation.rows)))[:rows]))


@dataclasses.dataclass
class EvalResult:
    metrics: dict[str, float]
    predicted_classes: int | None  # distinct predicted classes (classification only): 1 means collapsed
    # SQuAD: {question id: answer text} for every question of the split, in its order (the official
    # evaluate-v1.1.py's prediction file); None for other tasks.
    predictions: dict[str, str] | None = None
    outputs: list[Any] | None = None  # each row's logits, in the split's order (classification and regression)

    def on_subset(self, task: Task, subset: EvalSplit) -> EvalResult:
        """The scores of the same outputs on a subset of the split scored (EvalSplit.subset): no second pass."""
        if subset.positions is None:
            return self
        assert self.outputs is not None
        return scored_outputs(task, subset, [self.outputs[i] for i in subset.positions])


def evaluate_split(
    model: nn.Module, task: Task, split: EvalSplit, device: Device, collator: DataCollatorWithPadding, batch_size: int | None = None
) -> EvalResult:
    """The task's metrics on this split (model left in eval mode; the caller switches back to train)."""
    return evaluate_runs(model, 1, task, split, device, collator, batch_size)[0]


def evaluate_runs(
    model: nn.Module, runs: int, task: Task, split: EvalSplit, device: Device, collator: DataCollatorWithPadding,
    batch_size: int | None = None,
) -> list[EvalResult]:
    """Each run's metrics on this split, in one pass: a group's model (adaptune.fused.run_groups) reads
    every batch replicated once per run, block i scored for run i. `runs=1`: a solo model. `batch_size`: rows
    a batch, else evaluation_batch_size(device)."""
    with device.no_grad():
        return _evaluate_runs(model, runs, task, split, device, collator, batch_size)


def _evaluate_runs(
    model: nn.Module, runs: int, task: Task, split: EvalSplit, device: Device, collator: DataCollatorWithPadding, batch_size: int | None,
) -> list[EvalResult]:
    model.eval()
    batches = evaluation_batches(split.lengths, batch_size or evaluation_batch_size(device))
    model_inputs = [{k: v for k, v in row.items() if k in ("input_ids", "attention_mask", "token_type_ids")} for row in split.rows]
    outputs: list[list[Any]] = [[None] * len(split.rows) for _ in range(runs)]
    on_device = []  # read back after the last batch: no wait for the device per batch (a GPU runs ahead of the host)
    for batch in iterate_batches(model_inputs, batches, collator, device.torch_device):
        if runs > 1:
            batch = {name: tensor.repeat(runs, *([1] * (tensor.dim() - 1))) for name, tensor in batch.items()}
        with device.autocast():
            output = model(**batch)
        heads = (output.start_logits, output.end_logits) if task.kind == "span" else (output.logits,)
        on_device.append(tuple(head.float() for head in heads))
        device.mark_step()  # XLA: one small graph per batch shape, not the whole pass traced as one
    for indices, heads in zip(batches, on_device, strict=True):
        read = [head.cpu().numpy().reshape(runs, len(indices), -1) for head in heads]
        for run in range(runs):
            for position, index in enumerate(indices):
                outputs[run][index] = tuple(head[run, position] for head in read) if task.kind == "span" else read[0][run, position]
    return [scored_outputs(task, split, run_outputs) for run_outputs in outputs]


def scored_outputs(task: Task, split: EvalSplit, outputs: list[Any]) -> EvalResult:
    """The task's metrics from a model's outputs on every row of the split, in its order: (start, end) logits a span
    window, else a row's logits."""
    if task.kind == "span":
        assert split.examples is not None and split.features is not None
        predictions = postprocess_predictions(
            split.examples, split.features, [start for start, _ in outputs], [end for _, end in outputs]
        )
        answers = {example_id: answer["text"] for example_id, answer in
                   zip(column_values(split.examples, "id"), column_values(split.examples, "answers"), strict=True)}
        return EvalResult(metrics=dict(squad_scores(predictions, answers)), predicted_classes=None, predictions=predictions)

    logits = np.stack(outputs)
    assert split.references is not None
    if task.kind == "regression":
        return EvalResult(metrics=dict(compute_metrics(task, logits[:, 0], np.asarray(split.references))), predicted_classes=None,
                          outputs=outputs)
    classes = logits.argmax(axis=-1)
    metrics = compute_metrics(task, classes, np.asarray(split.references))
    return EvalResult(metrics=dict(metrics), predicted_classes=int(len(np.unique(classes))), outputs=outputs)
