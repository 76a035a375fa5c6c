"""The head alone trained as a linear probe (method "head" on a classification or regression task).

The frozen backbone's features, the pooled vector the model's classifier reads, are computed once per split by the
model's own evaluation forward and kept; the head (its dropout and classifier) then trains on them with the run's own
AdamW, schedule, seeded batches and dropout stream. A step is a (batch, hidden) matmul instead of a pass through the
backbone, so a probe can take the epochs and rates a probe needs for about the cost of one forward pass over its data,
and the head-alone runs of one task in a shard share that pass (FeatureCache).

What differs from training the head inside the whole model: the backbone's own dropout (in every layer) is off, as
for any linear probe of a frozen encoder; the head's dropout stays. The features are read by a hook on the
classifier during the model's evaluation forward, in evaluation batches, so the checkpoint (the whole model, its
classifier trained here) scores every row as the probe did.
"""

from __future__ import annotations

import dataclasses
import hashlib
import time
from array import array
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from adaptune.core.devices import Device
from adaptune.data.batching import epoch_batches, evaluation_batches, iterate_batches
from adaptune.data.tasks import Task
from adaptune.fused.grouping import trains_as_probe
from adaptune.fused.run_dropout import RunRandomness
from adaptune.train import phase_times
from adaptune.train.epochs import Plan
from adaptune.train.evaluate import EvalResult, EvalSplit, evaluation_batch_size, scored_outputs
from adaptune.train.finite_guard import RunFailed, StepResult
from adaptune.train.optimizer_step import start_alone, training_step
from adaptune.train.run_book import Evaluator, RunBook
from adaptune.train.run_data import RunData

MODEL_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
# Splits kept at once: a task's train, validation and test (and a companion's test), for the two tasks a shard may
# hold; QQP's 364k training rows are 1.1 GB at BERT-base's 768 floats.
CACHED_SPLITS = 8


@dataclasses.dataclass
class ProbeOutput:
    loss: torch.Tensor | None
    logits: torch.Tensor


class ProbeHead(nn.Module):
    """The model's head as it reads the pooled features: its dropout (the run's stream), then its classifier, and the
    loss the model's forward computes (cross-entropy, or mean squared error for one output)."""

    def __init__(self, classifier: nn.Linear, dropout: nn.Module, advance: Callable[[], None], regression: bool) -> None:
        super().__init__()
        self.classifier, self.dropout = classifier, dropout
        self.advance, self.regression = advance, regression  # advance: the run's dropout counts, before each training pass

    def forward(self, features: torch.Tensor, labels: torch.Tensor | None = None) -> ProbeOutput:
        if self.training:
            self.advance()
        logits = self.classifier(self.dropout(features))
        if labels is None:
            return ProbeOutput(None, logits)
        if self.regression:
            return ProbeOutput(F.mse_loss(logits.squeeze(-1), labels), logits)
        return ProbeOutput(F.cross_entropy(logits.view(-1, logits.shape[-1]), labels.view(-1)), logits)


def probe_head(model: nn.Module, method_cfg: Any, task: Task, randomness: RunRandomness) -> ProbeHead | None:
    """The head a run trains as a probe; None where it trains otherwise: another method, a span task (its head reads
    every token, too much to keep), or a head that reads more than one pooled vector (not a BERT classifier's)."""
    if not trains_as_probe(method_cfg.to_dict(), task.kind):
        return None
    classifier, dropout = getattr(model, "classifier", None), getattr(model, "dropout", None)
    if not isinstance(classifier, nn.Linear) or not isinstance(dropout, nn.Module):
        return None
    return ProbeHead(classifier, dropout, randomness.advance, regression=task.kind == "regression")


class FeatureCache:
    """Features by what determines them (the backbone, the device and its precision, the rows' tokens), the last
    CACHED_SPLITS kept: the head-alone runs of a shard read their task's splits once."""

    def __init__(self, limit: int = CACHED_SPLITS) -> None:
        self.limit, self.entries = limit, OrderedDict[tuple, torch.Tensor]()

    def get(self, key: tuple, compute: Callable[[], torch.Tensor]) -> tuple[torch.Tensor, bool]:
        """The features under `key`, computed where not kept; and whether they were kept."""
        if key in self.entries:
            self.entries.move_to_end(key)
            return self.entries[key], True
        features = compute()
        self.entries[key] = features
        while len(self.entries) > self.limit:
            self.entries.popitem(last=False)
        return features, False


SHARED_FEATURES = FeatureCache()


def rows_fingerprint(rows: Sequence[dict[str, Any]]) -> str:
    """A digest of the rows' model inputs, in order: equal rows give equal features."""
    digest = hashlib.blake2b(digest_size=16)
    for row in rows:
        for name in MODEL_INPUTS:
            if name in row:
                digest.update(array("q", row[name]).tobytes())
        digest.update(b"|")
    return digest.hexdigest()


def pooled_features(model: nn.Module, rows: Sequence[dict[str, Any]], device: Device, collator: Any) -> torch.Tensor:
    """What the model's classifier reads for every row (in the rows' order): its evaluation forward, in evaluation
    batches (those the probe scores in), the classifier's input caught by a hook."""
    caught: list[torch.Tensor] = []
    hook = model.classifier.register_forward_pre_hook(lambda module, args: caught.append(args[0]))  # type: ignore[union-attr]
    batches = evaluation_batches([len(row["input_ids"]) for row in rows], evaluation_batch_size(device))
    inputs = [{name: row[name] for name in MODEL_INPUTS if name in row} for row in rows]
    try:
        with device.no_grad():
            model.eval()
            for batch in iterate_batches(inputs, batches, collator, device.torch_device):
                with device.autocast():
                    model(**batch)
                device.mark_step()
    finally:
        hook.remove()
    with torch.no_grad():  # out of inference mode: a tensor made there could not be trained on
        stacked = torch.cat(caught)
        order = torch.tensor([index for batch in batches for index in batch], device=stacked.device)
        features = torch.empty_like(stacked)
        features[order] = stacked
    return features


class ProbeSteps:
    """A probe's steps (an adaptune.train.epochs.Stepper): the head on the cached features of its seeded batches."""

    drops_diverged = False

    def __init__(self, run: RunBook, model: nn.Module, head: ProbeHead, features: torch.Tensor, labels: torch.Tensor,
                 lengths: list[int], split_features: Callable[[EvalSplit], torch.Tensor]) -> None:
        self.runs = [run]
        self.model, self.head, self.features, self.labels, self.lengths = model, head, features, labels, lengths
        self.split_features = split_features
        self.trainable = [p for p in head.parameters() if p.requires_grad]

    @classmethod
    def start(cls, run: RunBook, model: nn.Module, head: ProbeHead, data: RunData, collator: Any) -> tuple[ProbeSteps, int]:
        """The features of the run's splits (kept or computed), its training objects over the head, resumed where it
        saved a state; returns its steps and how many it takes in all. The record's `probe` says what it read."""
        config, device = run.config, run.device
        started, reused = time.perf_counter(), []
        known: dict[int, torch.Tensor] = {}  # this run's splits by identity: each one's rows digested once, not every epoch

        def split_features(rows: Sequence[dict[str, Any]]) -> torch.Tensor:
            if id(rows) not in known:
                key = (config.backbone, device.name, str(device.autocast_dtype), rows_fingerprint(rows))
                known[id(rows)], kept = SHARED_FEATURES.get(key, lambda: pooled_features(model, rows, device, collator))
                reused.append(kept)
            return known[id(rows)]

        features = split_features(data.train_rows)
        for split in data.eval_splits.values():
            split_features(split.rows)
        run.record["probe"] = {"features": "the frozen backbone's pooled output, evaluation mode, computed once",
                               "feature_rows": len(data.train_rows) + sum(len(split.rows) for split in data.eval_splits.values()),
                               "feature_s": round(time.perf_counter() - started, 3), "features_reused": all(reused)}
        labels = torch.tensor([row["labels"] for row in data.train_rows], device=features.device,
                              dtype=torch.float32 if head.regression else torch.long)
        total_steps = start_alone(run, model, len(data.train_rows))
        lengths = [len(row["input_ids"]) for row in data.train_rows]

        def features_of(split: EvalSplit) -> torch.Tensor:  # a subset's rows are read from its whole split's features
            if split.parent is not None and split.positions is not None:
                return split_features(split.parent.rows)[torch.tensor(split.positions, device=features.device)]
            return split_features(split.rows)

        return cls(run, model, head, features, labels, lengths, features_of), total_steps

    def start_epoch(self, epoch: int) -> list[Plan]:
        config = self.runs[0].config
        self.head.train()
        return [epoch_batches(self.lengths, config.batch_size, config.seed, epoch)]  # the batches the whole model would take

    def prepare(self, batches: list[list[int]]) -> dict[str, torch.Tensor]:
        rows = torch.tensor(batches[0], device=self.features.device)
        return {"features": self.features[rows], "labels": self.labels[rows]}

    def step(self, inputs: dict[str, torch.Tensor]) -> list[StepResult]:
        run = self.runs[0]
        return [training_step(self.head, inputs, run.optimizer, run.scheduler, self.trainable, run.device, run.config.max_grad_norm)]

    def drop(self, failed: list[tuple[int, RunFailed]]) -> None:
        raise failed[0][1]  # never asked (drops_diverged is False)

    def evaluators(self) -> list[Evaluator]:
        return [self._evaluate]

    def _evaluate(self, task: Task, split: EvalSplit) -> EvalResult:
        run = self.runs[0]
        with phase_times.timed(run.phase_owners(), "evaluation"):
            features = self.split_features(split)
            batches = evaluation_batches(split.lengths, evaluation_batch_size(run.device))
            on_device = []  # read back after the last batch, as evaluate_runs does
            with run.device.no_grad():
                self.head.eval()
                for batch in batches:
                    with run.device.autocast():
                        on_device.append(self.head(features[torch.tensor(batch, device=features.device)]).logits.float())
                    run.device.mark_step()
            outputs: list[Any] = [None] * len(split.rows)
            for batch, logits in zip(batches, on_device, strict=True):
                for index, row_logits in zip(batch, logits.cpu().numpy(), strict=True):
                    outputs[index] = row_logits
            return scored_outputs(task, split, outputs)

    def checkpoint_model(self, run: RunBook) -> nn.Module:
        return self.model  # its classifier is the head trained here
