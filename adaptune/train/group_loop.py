"""A group of runs trained in lock step through one shared frozen backbone (adaptune.fused.run_groups):
the runs of one task and method that differ only in learning rate, seed and init std.

Each run stays the run it would be alone (adaptune.train.loop), by construction:
- its model starts as its solo model does (its seed, then the backbone and the method's init), and its
  trained tensors are then stacked beside the others';
- each step takes one batch from each run's own seeded order, exactly the batch it would take alone;
  the loss is the sum of the runs' own mean losses, so each run's gradients are its own;
- each run has its own AdamW, warmup-and-decay schedule, gradient clipping and finiteness check (the
  solo trainer's own objects), and its own books (adaptune.train.run_book), kept by the epoch loop a run
  alone trains with (adaptune.train.epochs); a diverging run is recorded as failed and leaves the group;
- dropout masks come from each run's own generator, at its own shape (adaptune.fused.run_dropout);
- each epoch's evaluation is one pass for every run (adaptune.train.evaluate.evaluate_runs), scored per
  run; each run writes the solo run's record, curve, state and compact checkpoint in its own directory.
So a run's result does not depend on which runs shared its group beyond rounding, and a resumed run may train
alone or in another group. Rounding: the group's stacked forward sums in another order than a run alone, so a
fused run is not its solo run bit for bit (a step's loss can differ by one ulp from the first step): in float32
tests/test_fused_groups.py holds it within 1e-4 of its run alone (measured up to 7e-6, issue 73), in bf16
tests/test_bf16_precision.py within 2 points. Runs whose saved states stand at different steps train as separate groups.
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
from transformers import set_seed

from adaptune.core.devices import Device, is_out_of_memory, pick_device, release_memory
from adaptune.data.batching import epoch_batches, make_collator
from adaptune.data.tasks import get_task
from adaptune.fused.group_optimizer import clip_and_step
from adaptune.fused.grouping import GROUPABLE_METHODS, group_key, trains_whole_model
from adaptune.fused.run_dropout import RowLayout, RunRandomness, dropout_stream, use_run_dropout
from adaptune.fused.run_groups import group_model, keep_runs, move_group_model, recorded_layer_norm, run_parameters, trained_tensors
from adaptune.fused.settings import StepSettings
from adaptune.fused.step_graphs import GraphedFusedStep
from adaptune.model.backbone import fresh_head_copy, load_model, load_tokenizer
from adaptune.model.methods import apply_method, method_from_dict
from adaptune.model.params import count_parameters
from adaptune.train import phase_times
from adaptune.train.config import TrainConfig
from adaptune.train.epochs import EpochDriver, Plan, StepCallback
from adaptune.train.evaluate import evaluate_runs
from adaptune.train.finite_guard import FiniteGuard, RunFailed, StepResult
from adaptune.train.loop import check_config, frozen_backbone_for_autocast, prepare_data, recorded_step_settings, seed_everything
from adaptune.train.optimizer_step import adamw, decayed_names
from adaptune.train.record import record_in_run_dir, run_record, with_provenance
from adaptune.train.run_book import Evaluator, RunBook
from adaptune.train.run_data import RunData
from adaptune.train.state import resume_point
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
    a run's dir is returned as is, as the solo trainer does. Out of memory is raised for the caller. `progress` is
    taken as the solo trainer takes it; a group shows no progress bar."""
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
        for index, record in zip(indices, group.train(data_dir, cache_dir, step_callback, write_record), strict=True):
            records[index] = record
    return [records[index] for index in range(len(configs))]


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
        again = fresh_head_copy(loaded)
        assert again is not None  # the same model's head, copied once above
        yield again


class _Group:
    """A fused group's runs, trained as one (an adaptune.train.epochs.Stepper): each step one forward and backward
    through the shared backbone for all of them, each run's books its own (RunBook), as alone."""

    drops_diverged = True  # a diverged run is recorded as failed and leaves; the others go on

    def __init__(self, configs: list[TrainConfig], outs: list[Path], callbacks: list[Callable[[], None] | None],
                 settings: StepSettings) -> None:
        for config in configs:
            check_config(config)
        self.device: Device = pick_device()
        self.task = get_task(configs[0].task)
        self.runs = [
            RunBook(config, self.task, method_from_dict(config.method), self.device, out,
                    run_record(config, self.task.primary_metric, self.device.name), callback, settings)
            for config, out, callback in zip(configs, outs, callbacks, strict=True)
        ]
        self.settings = settings
        for run in self.runs:
            run.record.update(group_size=len(self.runs), **recorded_step_settings(settings))
        self.finished: dict[str, dict[str, Any]] = {}
        self.graphed: GraphedFusedStep | None = None

    def train(self, data_dir: Any, cache_dir: Any, step_callback: StepCallback | None, write_record: bool) -> list[dict[str, Any]]:
        """Every run's record, in order (a run that diverged: its failed record)."""
        self.started, self.write_record = time.perf_counter(), write_record
        order = [run.config.run_id for run in self.runs]
        for run in self.runs:
            with_provenance(run.record, data_dir)
        try:
            setup_started = time.perf_counter()
            saves = StateSaves()  # one decision for every run, so they stay at one step; a malformed setting fails before loading
            total_steps = self._set_up(data_dir, cache_dir)
            phase_times.add(self.sharing, "setup", time.perf_counter() - setup_started)
            EpochDriver(self, saves, total_steps, show_progress=False, step_callback=step_callback).run()  # a group shows no bar
        except Exception as error:
            if is_out_of_memory(error):
                release_memory(self.device)
            raise
        self._record_graph_counts(self.runs)
        for run in self.runs:
            self.finished[run.config.run_id] = run.finish_record(self.started, write_record)
        return [self.finished[run_id] for run_id in order]

    def _record_graph_counts(self, runs: Sequence[RunBook]) -> None:
        """The group's step-graph counts (GraphedFusedStep.counts, over the step objects it had) into these runs' records."""
        if self.graphed is not None:
            for run in runs:
                run.record["step_graphs"] = self.graphed.counts()

    def _set_up(self, data_dir: Any, cache_dir: Any) -> int:
        """The group's data, model and each run's training objects, resumed where the runs saved states; returns
        how many steps each run takes in all."""
        first, device = self.runs[0].config, self.device
        seed_everything(first.seed, device)
        tokenizer = load_tokenizer(first.backbone)
        data, companions = prepare_data(first, self.task, tokenizer, data_dir, cache_dir)
        model, decayed, counts = self._group_model(data, companions)
        self.randomness = use_run_dropout(model, [dropout_stream(run.config.seed, device.torch_device, self.settings.dropout_masks)
                                                  for run in self.runs], self.settings)
        move_group_model(model, device.torch_device)
        backbone_fields = frozen_backbone_for_autocast(model, device.autocast_dtype)
        layer_norm = recorded_layer_norm(model)
        total_steps = math.ceil(len(data.train_rows) / first.batch_size) * first.epochs
        for run, params, generator in zip(self.runs, run_parameters(model), self.randomness.streams, strict=True):
            run.record.update(trained_params=counts.trained, total_params=counts.total, layer_norm=layer_norm, **backbone_fields)
            run.dropout = generator
            run.start_training(params, adamw(params, decayed, run.config.lr, run.config.weight_decay), FiniteGuard(device), total_steps)
        self.model, self.collator, self.tokenizer = model, make_collator(tokenizer, pad_to_multiple_of=device.pad_multiple), tokenizer
        self.graphed = self._graphed_step()
        self.sharing = [run.progress for run in self.runs]  # the group's phases are each run's
        for run in self.runs:
            run.sharing = self.sharing
        self.rows, self.lengths = data.train_rows, [len(row["input_ids"]) for row in data.train_rows]
        return total_steps

    def _group_model(self, data: RunData, companions: dict[str, Any]) -> tuple[torch.nn.Module, set[str], Any]:
        """Each run's model started exactly as it would be alone, their trained tensors then stacked in one group
        model; returns it, the names weight decay applies to and the parameter counts (a solo model's). Keeps a
        solo-shaped copy (template) that each run's checkpoint is written from."""
        first, trained = self.runs[0].config, []
        models = _models_as_alone(first.backbone, self.task.kind, self.task.num_labels, [run.config.seed for run in self.runs])
        for run, model in zip(self.runs, models, strict=True):
            run.use_data(data, companions)
            apply_method(model, run.method_cfg)
            trained.append(trained_tensors(model))
        counts, decayed = count_parameters(model), decayed_names(model)
        self.template = copy.deepcopy(model)
        return group_model(model, trained, self.settings), decayed, counts

    def _graphed_step(self, replacing: GraphedFusedStep | None = None) -> GraphedFusedStep | None:
        if not self.settings.step_graphs:
            return None
        return GraphedFusedStep(self.model, self.randomness, self.task.kind, self.device, run_losses, counted_from=replacing)

    def start_epoch(self, epoch: int) -> list[Plan]:
        plans = [epoch_batches(self.lengths, run.config.batch_size, run.config.seed, epoch) for run in self.runs]
        self.model.train()
        return plans

    def prepare(self, batches: list[list[int]]) -> list[list[int]]:
        return batches  # collated and stacked within the timed step (step), as a group always was

    def step(self, batches: list[list[int]]) -> list[StepResult]:
        inputs, labels, weights, layout = self._fused_batch(batches)
        if self.graphed is not None:
            return self.graphed(inputs, labels, weights, layout, self.runs)
        return fused_step(self.model, self.randomness, inputs, labels, weights, layout, self.task.kind, self.runs, self.device)

    def _fused_batch(self, batches: list[list[int]]) -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor, RowLayout]:
        """The runs' batches, each collated as it would be alone, stacked (stack_run_batches)."""
        per_run = [self.collator([self.rows[i] for i in batch]) for batch in batches]
        return stack_run_batches(per_run, self.tokenizer.pad_token_id or 0, self.device.torch_device)

    def drop(self, failed: list[tuple[int, RunFailed]]) -> None:
        """Diverged runs are recorded as failed and leave the group; the others go on."""
        gone = {index for index, _ in failed}
        self._record_graph_counts([self.runs[index] for index, _ in failed])
        for index, failure in failed:
            run = self.runs[index]
            run.record.update(status="failed", reason=str(failure))
            self.finished[run.config.run_id] = run.finish_record(self.started, self.write_record)
            print(f"{run.config.run_id}: {failure}; it leaves its group, the others go on", flush=True)
        kept = [index for index in range(len(self.runs)) if index not in gone]
        keep_runs(self.model, kept)
        self.randomness.keep(kept)
        self.runs = [self.runs[index] for index in kept]
        for run, params in zip(self.runs, run_parameters(self.model), strict=True):
            run.params = params
        if self.graphed is not None:  # its graphs hold the old stacks
            self.graphed = self._graphed_step(replacing=self.graphed)

    def evaluators(self) -> list[Evaluator]:
        evaluation = _FusedEvaluation(self.model, len(self.runs), self.device, self.collator, self.sharing)
        self.randomness.layout = None
        return [evaluation.for_run(index) for index in range(len(self.runs))]

    def checkpoint_model(self, run: RunBook) -> torch.nn.Module:
        with torch.no_grad():
            for name, parameter in run.params.items():
                self.template.get_parameter(name).copy_(parameter.detach().to(self.template.get_parameter(name).device))
        return self.template

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
