"""A group of runs trained in lock step through one shared frozen backbone (adaptune.fused.run_groups):
the runs of one task and method that differ only in learning rate, seed and init std.

Each run stays the run it would be alone (adaptune.train.loop), by construction:
- its model starts as its solo model does (its seed, then the backbone and the method's init), and its
  trained tensors are then stacked beside the others';
- each step takes one batch from each run's own seeded order, exactly the batch it would take alone;
  the loss is the sum of the runs' own mean losses, so each run's gradients are its own;
- each run has its own AdamW, warmup-and-decay schedule, gradient clipping and finiteness check (the
  solo trainer's own objects); a diverging run is recorded as failed and leaves the group;
- dropout masks come from each run's own generator, at its own shape (adaptune.fused.run_dropout);
- each epoch's evaluation is one pass for every run (adaptune.train.evaluate.evaluate_runs), scored per
  run; each run writes the solo run's record, curve, state and compact checkpoint in its own directory.
So a run's result does not depend on which runs shared its group, and a resumed run may train alone or
in another group. Runs whose saved states stand at different steps train as separate groups.
"""

from __future__ import annotations

import copy
import math
import os
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol

import torch
from torch.nn import functional as F
from transformers import get_linear_schedule_with_warmup, set_seed

from adaptune.core.devices import Device, is_out_of_memory, pick_device, release_memory
from adaptune.data.batching import epoch_batches, make_collator
from adaptune.data.tasks import get_task
from adaptune.fused.group_optimizer import clip_and_step
from adaptune.fused.grouping import GROUPABLE_METHODS, group_key, trains_whole_model
from adaptune.fused.run_dropout import RowLayout, RunRandomness, dropout_stream, use_run_dropout
from adaptune.fused.run_groups import group_model, keep_runs, recorded_layer_norm, run_parameters, trained_tensors
from adaptune.fused.settings import StepSettings
from adaptune.fused.step_graphs import GraphedFusedStep
from adaptune.model.backbone import fresh_head_copy, load_model, load_tokenizer
from adaptune.model.methods import apply_method, method_from_dict
from adaptune.model.params import count_parameters
from adaptune.train import phase_times
from adaptune.train.config import TrainConfig
from adaptune.train.evaluate import evaluate_runs
from adaptune.train.loop import (
    Evaluator,
    FiniteGuard,
    RunFailed,
    StepCallback,
    StepResult,
    _check_config,
    _Run,
    _seed_everything,
    adamw,
    decayed_names,
    frozen_backbone_for_autocast,
    prepare_data,
    recorded_step_settings,
)
from adaptune.train.record import record_in_run_dir, run_record, with_provenance
from adaptune.train.state import load_state, resume_point
from adaptune.train.state_saves import StateSaves

_PAD_VALUES = {"attention_mask": 0, "token_type_ids": 0}
# What a span task's collated batch holds besides the model's inputs (others: "labels"): the answer's
# first and last token, stacked as a step's labels with each row's run's own token count (rows x 3:
# SPAN_TARGETS), so that the loss reads every length from the device and a replayed step takes new ones.
_SPAN_LABELS = ("start_positions", "end_positions")
SPAN_TARGETS = (*_SPAN_LABELS, "run_tokens")


def train_group(
    configs: Sequence[TrainConfig],
    out_dirs: Sequence[str | os.PathLike[str]],
    data_dir: str | os.PathLike[str] | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    progress: bool = False,
    on_state_saved: Sequence[Callable[[], None] | None] | None = None,
    write_record: bool = True,
    step_callback: StepCallback | None = None,
    settings: StepSettings | None = None,
) -> list[dict[str, Any]]:
    """Train these runs as one group, each in its own out dir; returns their records in order (also
    written to each out dir's record.json unless `write_record` is False). A finished record already in
    a run's dir is returned as is, as the solo trainer does. Out of memory is raised for the caller."""
    settings = settings or StepSettings.from_environment()  # an entry point's: read once, passed down
    keys = {group_key(config) for config in configs}
    alone = len(configs) == 1 and trains_whole_model(configs[0])  # a group of one: nothing to share, a step to replay
    if not alone and (None in keys or len(keys) != 1):
        raise ValueError(f"runs {[config.run_id for config in configs]} cannot train as one group: they must share task, "
                         f"backbone, data sizes, epochs, batch size and a groupable method ({', '.join(sorted(GROUPABLE_METHODS))}), "
                         "and differ only in lr, seed and init_std")
    if len({config.run_id for config in configs}) != len(configs) or len(out_dirs) != len(configs):
        raise ValueError("a group needs distinct runs, one out dir each")
    callbacks = list(on_state_saved) if on_state_saved is not None else [None] * len(configs)
    outs = [Path(out) for out in out_dirs]
    records: dict[int, dict[str, Any]] = {}
    by_resume_point: dict[tuple[int, StepSettings], list[int]] = {}
    for index, (config, out) in enumerate(zip(configs, outs, strict=True)):
        out.mkdir(parents=True, exist_ok=True)
        finished = record_in_run_dir(out, config.run_id)
        if finished is not None and finished.get("status") != "failed":
            records[index] = finished
        else:
            by_resume_point.setdefault(resume_point(out, settings), []).append(index)
    # Runs resumed at different steps cannot share a step, nor runs that keep different masks' schemes.
    for (_, kept), indices in by_resume_point.items():
        group = _Group([configs[i] for i in indices], [outs[i] for i in indices], [callbacks[i] for i in indices], kept)
        for index, record in zip(indices, group.train(data_dir, cache_dir, progress, step_callback, write_record), strict=True):
            records[index] = record
    return [records[index] for index in range(len(configs))]


class _Member(_Run):
    """One run of a group: the solo run's bookkeeping, with its tensors held in the group's model."""

    params: dict[str, torch.nn.Parameter]
    template: torch.nn.Module  # a solo-shaped model its checkpoint is written from

    def _trained(self, model: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
        return self.params

    def _checkpoint_model(self, model: torch.nn.Module) -> torch.nn.Module:
        with torch.no_grad():
            for name, parameter in self.params.items():
                self.template.get_parameter(name).copy_(parameter.detach().to(self.template.get_parameter(name).device))
        return self.template


def _models_as_alone(backbone: str | None, task_kind: str, num_labels: int, seeds: Sequence[int]) -> Iterator[torch.nn.Module]:
    """For each seed in turn, what load_model returns after set_seed(seed), the generator left where load_model leaves
    it. The encoder is read once where the first load shows that load_model draws nothing but a fresh head (the
    generator after it stands where fresh_head_copy leaves it): each run then takes a copy sharing the encoder's
    tensors. Else (a checkpoint with its own head, or missing more than a head) every run loads it."""
    set_seed(seeds[0])
    loaded = load_model(backbone, task_kind, num_labels)
    after_load = torch.get_rng_state()
    set_seed(seeds[0])
    copied = fresh_head_copy(loaded)
    if copied is None or not torch.equal(torch.get_rng_state(), after_load):
        for seed in seeds:
            set_seed(seed)
            yield load_model(backbone, task_kind, num_labels)
        return
    yield copied
    for seed in seeds[1:]:
        set_seed(seed)
        yield fresh_head_copy(loaded)


class _Group:
    def __init__(self, configs: list[TrainConfig], outs: list[Path], callbacks: list[Callable[[], None] | None],
                 settings: StepSettings) -> None:
        for config in configs:
            _check_config(config)
        self.device: Device = pick_device()
        self.task = get_task(configs[0].task)
        self.members = [
            _Member(config, self.task, method_from_dict(config.method), self.device, out,
                    run_record(config, self.task.primary_metric, self.device.name), callback)
            for config, out, callback in zip(configs, outs, callbacks, strict=True)
        ]
        self.settings = settings
        for member in self.members:
            member.settings = settings
            member.record.update(group_size=len(self.members), **recorded_step_settings(settings))
        self.finished: dict[str, dict[str, Any]] = {}
        self.graphed: GraphedFusedStep | None = None

    def train(self, data_dir: Any, cache_dir: Any, progress: bool, step_callback: StepCallback | None,
              write_record: bool) -> list[dict[str, Any]]:
        started = time.perf_counter()
        order = [member.config.run_id for member in self.members]
        for member in self.members:
            with_provenance(member.record, data_dir)
        try:
            self._execute(data_dir, cache_dir, progress, step_callback, started, write_record)
        except Exception as error:
            if is_out_of_memory(error):
                release_memory(self.device)
            raise
        self._record_graph_counts(self.members)
        for member in self.members:
            self.finished[member.config.run_id] = member.finish_record(started, write_record)
        return [self.finished[run_id] for run_id in order]

    def _record_graph_counts(self, members: Sequence[_Member]) -> None:
        """The group's step-graph counts (GraphedFusedStep.counts, over the step objects it had) into these runs' records."""
        if self.graphed is not None:
            for member in members:
                member.record["step_graphs"] = self.graphed.counts()

    def _execute(self, data_dir: Any, cache_dir: Any, show_progress: bool, step_callback: StepCallback | None,
                 started: float, write_record: bool) -> None:
        first, device, task = self.members[0].config, self.device, self.task
        setup_started = time.perf_counter()
        saves = StateSaves()  # one decision for every run, so they stay at one step; a malformed setting fails before loading
        _seed_everything(first.seed, device)
        tokenizer = load_tokenizer(first.backbone)
        data, companions = prepare_data(first, task, tokenizer, data_dir, cache_dir)
        trained = []
        models = _models_as_alone(first.backbone, task.kind, task.num_labels, [member.config.seed for member in self.members])
        for member, model in zip(self.members, models, strict=True):  # each run's model starts exactly as it would alone
            member.record.update(data_split=data.data_split, split_note=data.split_note, split_sizes=data.split_sizes)
            member.companion_splits = companions
            apply_method(model, member.method_cfg)
            trained.append(trained_tensors(model))
        counts, decayed = count_parameters(model), decayed_names(model)
        template = copy.deepcopy(model)
        model = group_model(model, trained, self.settings)
        del trained
        self.randomness = use_run_dropout(model, [dropout_stream(member.config.seed, device.torch_device, self.settings.dropout_masks)
                                                  for member in self.members], self.settings)
        model.to(device.torch_device)
        backbone_fields = frozen_backbone_for_autocast(model, device.autocast_dtype)
        layer_norm = recorded_layer_norm(model)
        steps_per_epoch = math.ceil(len(data.train_rows) / first.batch_size)
        total_steps = steps_per_epoch * first.epochs
        for member, params, generator in zip(self.members, run_parameters(model), self.randomness.streams, strict=True):
            member.record.update(trained_params=counts.trained, total_params=counts.total, layer_norm=layer_norm,
                                 **backbone_fields)
            member.params, member.template, member.dropout = params, template, generator
            member.optimizer = adamw(params, decayed, member.config.lr, member.config.weight_decay)
            member.scheduler = get_linear_schedule_with_warmup(member.optimizer, int(first.warmup_fraction * total_steps), total_steps)
            member.guard = FiniteGuard(device)
            member.segment_started = time.perf_counter()
        for member in self.members:
            resumed = load_state(member.out, member.config.run_id, member.params, member.optimizer, member.scheduler, member.dropout)
            if resumed is not None:
                member.progress = resumed
            member.curve_log.start(member.progress.global_step)
        self.model, self.collator, self.tokenizer = model, make_collator(tokenizer, pad_to_multiple_of=device.pad_multiple), tokenizer
        self.forward = model
        self.graphed = self._graphed_step()
        sharing = [member.progress for member in self.members]  # the group's phases are each run's
        for member in self.members:
            member.sharing = sharing
        phase_times.add(sharing, "setup", time.perf_counter() - setup_started)
        lengths = [len(row["input_ids"]) for row in data.train_rows]
        while self.members and self.members[0].progress.epoch < first.epochs:
            epoch, start = self.members[0].progress.epoch, self.members[0].progress.step_in_epoch
            plans = [epoch_batches(lengths, first.batch_size, member.config.seed, epoch) for member in self.members]
            model.train()
            for step in range(start, len(plans[0])):
                step_started = time.perf_counter()
                self._step([plan[step] for plan in plans], data.train_rows)
                failed = []
                for index, member in enumerate(self.members):
                    p = member.progress
                    p.examples_trained += len(plans[index][step])
                    p.global_step += 1
                    p.step_in_epoch += 1
                    every = member.config.checkpoint_every_steps
                    member.saving = bool(every and p.global_step % every == 0 and p.step_in_epoch < len(plans[0]))
                    if member.saving or p.step_in_epoch == len(plans[0]) or member.guard.due():
                        try:
                            member._check(member.guard, p)
                        except RunFailed as failure:
                            failed.append((index, failure))
                elapsed = time.perf_counter() - step_started
                for member in self.members:
                    member.progress.train_time_s += elapsed
                if failed:
                    plans = self._drop(failed, plans, started, write_record)
                if any(member.saving for member in self.members):
                    with saves.saving():
                        for member in self.members:
                            if member.saving:
                                member._save(model, member.optimizer, member.scheduler, member.segment_started)
                if step_callback is not None and self.members:
                    step_callback(self.members[0].progress.global_step)
                if not self.members:
                    return
            evaluation = _FusedEvaluation(model, len(self.members), device, self.collator, sharing)
            self.randomness.layout = None
            for index, member in enumerate(self.members):
                member._end_epoch(model, data, evaluation.for_run(index))
            if saves.due_at_epoch_end(last_epoch=self.members[0].progress.epoch == first.epochs):
                with saves.saving():
                    for member in self.members:
                        member._save(model, member.optimizer, member.scheduler, member.segment_started)
        for member in self.members:
            member._finish()

    def _graphed_step(self, replacing: GraphedFusedStep | None = None) -> GraphedFusedStep | None:
        if not self.settings.step_graphs:
            return None
        return GraphedFusedStep(self.forward, self.randomness, self.task.kind, self.device, run_losses, counted_from=replacing)

    def _step(self, batches: list[list[int]], rows: list[dict[str, Any]]) -> None:
        inputs, labels, weights, layout = self._fused_batch(batches, rows)
        if self.graphed is not None:
            results = self.graphed(inputs, labels, weights, layout, self.members)
        else:
            results = fused_step(self.forward, self.randomness, inputs, labels, weights, layout, self.task.kind, self.members, self.device)
        for member, result in zip(self.members, results, strict=True):
            member.guard.add(result)

    def _fused_batch(self, batches: list[list[int]], rows: list[dict[str, Any]]
                     ) -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor, RowLayout]:
        """The runs' batches, each collated as it would be alone, stacked (stack_run_batches)."""
        per_run = [self.collator([rows[i] for i in batch]) for batch in batches]
        return stack_run_batches(per_run, self.tokenizer.pad_token_id or 0, self.device.torch_device)

    def _drop(self, failed: list[tuple[int, RunFailed]], plans: list[list[list[int]]], started: float,
              write_record: bool) -> list[list[list[int]]]:
        """Diverged runs are recorded as failed and leave the group; the others go on."""
        gone = {index for index, _ in failed}
        self._record_graph_counts([self.members[index] for index, _ in failed])
        for index, failure in failed:
            member = self.members[index]
            member.record.update(status="failed", reason=str(failure))
            self.finished[member.config.run_id] = member.finish_record(started, write_record)
            print(f"{member.config.run_id}: {failure}; it leaves its group, the others go on", flush=True)
        kept = [index for index in range(len(self.members)) if index not in gone]
        keep_runs(self.model, kept)
        self.randomness.keep(kept)
        self.members = [self.members[index] for index in kept]
        for member, params in zip(self.members, run_parameters(self.model), strict=True):
            member.params = params
        if self.graphed is not None:  # its graphs hold the old stacks
            self.graphed = self._graphed_step(replacing=self.graphed)
        return [plans[index] for index in kept]


def stack_run_batches(per_run: list[dict[str, torch.Tensor]], pad_token_id: int, target: Any
                      ) -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor, RowLayout]:
    """Collated batches, one per run, padded to one length and one block size (short blocks repeat
    their first row, weighted 0) and stacked run after run on `target`: a fused step's inputs, labels
    (a span task's: SPAN_TARGETS), row weights (runs x block) and row layout."""
    sizes = [collated["input_ids"].shape[0] for collated in per_run]
    lengths = [collated["input_ids"].shape[1] for collated in per_run]
    block, length = max(sizes), max(lengths)
    stacked: dict[str, list[torch.Tensor]] = {}
    for collated in per_run:
        for name, tensor in collated.items():
            if tensor.dim() == 2:
                tensor = F.pad(tensor, (0, length - tensor.shape[1]), value=_PAD_VALUES.get(name, pad_token_id))
            if tensor.shape[0] < block:
                tensor = torch.cat([tensor, tensor[:1].expand(block - tensor.shape[0], *tensor.shape[1:])])
            stacked.setdefault(name, []).append(tensor)
    inputs = {name: torch.cat(parts).to(target, non_blocking=True) for name, parts in stacked.items() if name not in ("labels", *_SPAN_LABELS)}
    if "labels" in stacked:
        labels = torch.cat(stacked["labels"])
    else:
        own_tokens = torch.tensor(lengths).repeat_interleave(block)
        labels = torch.stack([*(torch.cat(stacked[name]) for name in _SPAN_LABELS), own_tokens], dim=1)
    labels = labels.to(target, non_blocking=True)
    weights = torch.tensor([[1.0] * size + [0.0] * (block - size) for size in sizes], device=target)
    layout = RowLayout(block, sizes, lengths)
    return inputs, labels, weights, layout


class GroupRun(Protocol):
    """What a fused step needs of each run: its tensors, optimizer, schedule and clipping norm."""

    params: dict[str, torch.nn.Parameter]
    optimizer: torch.optim.Optimizer
    scheduler: Any
    config: TrainConfig


def fused_step(model: Callable[..., Any], randomness: RunRandomness, inputs: dict[str, torch.Tensor], labels: torch.Tensor,
               weights: torch.Tensor, layout: RowLayout, kind: str, runs: Sequence[GroupRun], device: Device,
               together: bool = True) -> list[StepResult]:
    """One optimizer step of every run of a group: one forward and backward through the shared backbone,
    then each run's own clipping, finiteness check (at once on the CPU, before its update, as alone) and
    AdamW step, all runs' in one set of multi-tensor operators (adaptune.fused.group_optimizer; `together`
    False: one run after another). Returns each run's (loss, gradient norm), still on the device. The
    benchmark times this."""
    randomness.layout = layout
    with device.autocast():
        output = model(**inputs)
    losses = run_losses(kind, output, labels, weights, layout)
    losses.sum().backward()
    results = clip_and_step(runs, losses.detach().unbind(), device.kind == "cpu", together)
    device.mark_step()
    return results


def run_losses(kind: str, output: Any, labels: torch.Tensor, weights: torch.Tensor, layout: RowLayout) -> torch.Tensor:
    """Each run's mean loss over its real rows (a vector of runs): what the model computes alone."""
    runs = len(layout.rows)
    if kind == "span":
        per_row = _span_losses(output.start_logits, output.end_logits, labels)
    elif kind == "regression":
        per_row = (output.logits.float().reshape(-1) - labels.float().reshape(-1)) ** 2
    else:
        logits = output.logits
        per_row = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1), reduction="none")
    per_row = per_row.reshape(runs, -1) * weights
    return per_row.sum(dim=1) / weights.sum(dim=1)


def _span_losses(starts: torch.Tensor, ends: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Each row's question-answering loss as BertForQuestionAnswering computes it alone (the mean of the
    start's and the end's cross-entropy over token positions), over the positions its own run's batch
    has (`targets`: SPAN_TARGETS): a span's softmax runs over every position of the batch, padding
    included, so the positions a longer run's batch, or a step graph's bucket, added are masked out."""
    beyond = torch.arange(starts.shape[1], device=starts.device).unsqueeze(0) >= targets[:, 2:]
    start = F.cross_entropy(starts.float().masked_fill(beyond, -math.inf), targets[:, 0], reduction="none")
    end = F.cross_entropy(ends.float().masked_fill(beyond, -math.inf), targets[:, 1], reduction="none")
    return (start + end) / 2


class _FusedEvaluation:
    """Every run's scores on a split from one pass (memoised per split), handed out run by run."""

    def __init__(self, model: torch.nn.Module, runs: int, device: Device, collator: Any, sharing: list[Any]) -> None:
        self.model, self.runs, self.device, self.collator, self.sharing = model, runs, device, collator, sharing
        self.scored: dict[tuple[str, int], list[Any]] = {}

    def for_run(self, index: int) -> Evaluator:
        def evaluate(task: Any, split: Any) -> Any:
            key = (task.name, id(split))
            if key not in self.scored:
                with phase_times.timed(self.sharing, "evaluation"):
                    self.scored[key] = evaluate_runs(self.model, self.runs, task, split, self.device, self.collator)
            return self.scored[key][index]

        return evaluate
