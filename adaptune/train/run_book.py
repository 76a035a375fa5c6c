"""One run's bookkeeping while it trains, alone (adaptune.train.loop) or in a fused group (adaptune.train.group_loop):
its progress, curve, checks, state saves, epoch-end evaluation, checkpoint and record. Kept apart from how its
steps are computed, so a run in a group keeps exactly the books it would keep alone."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import get_linear_schedule_with_warmup

from adaptune.core.devices import Device
from adaptune.core.files import write_json
from adaptune.core.run_files import CHECKPOINT_DIR, PREDICTIONS_FILE, RECORD_FILE
from adaptune.data.tasks import Task, get_task
from adaptune.fused.run_dropout import CounterStream
from adaptune.fused.settings import StepSettings
from adaptune.model.checkpoint import save_task_checkpoint
from adaptune.train import phase_times
from adaptune.train.config import TrainConfig
from adaptune.train.epoch_log import report_epoch
from adaptune.train.evaluate import EvalResult, EvalSplit
from adaptune.train.event_log import CurveLog, write_run_summary
from adaptune.train.finite_guard import FiniteGuard, RunFailed
from adaptune.train.record import degenerate_reason
from adaptune.train.run_data import RunData
from adaptune.train.state import Progress, load_state, remove_state, save_state

Evaluator = Callable[[Task, EvalSplit], EvalResult]  # one run's scores on a split


class RunBook:
    """The state of one run while it trains: kept on an object so a failure can still report it. The trainer
    that builds it sets its training objects (params, optimizer, scheduler, dropout, guard) before it resumes."""

    params: dict[str, nn.Parameter]  # its trained tensors by solo name: what a state saves, what a fused step updates
    optimizer: torch.optim.Optimizer
    scheduler: Any
    dropout: torch.Generator | CounterStream | None
    guard: FiniteGuard
    segment_started: float  # when this attempt's timed part began: a saved state's wall time counts from it

    def __init__(self, config: TrainConfig, task: Task, method_cfg: Any, device: Device, out: Path, record: dict[str, Any],
                 on_state_saved: Callable[[], None] | None = None, settings: StepSettings = StepSettings()) -> None:
        self.config, self.task, self.method_cfg, self.device, self.out, self.record = config, task, method_cfg, device, out, record
        self.settings = settings  # as given; a resumed run's masks' scheme is its own (resume_point)
        self.on_state_saved = on_state_saved
        self.progress = Progress()
        self.curve_log = CurveLog(out)  # TensorBoard's view of the curve, beside the record's
        self.sharing: list[Progress] | None = None  # a fused group's runs' progress: its phases are theirs too
        self.saving = False  # whether the step just taken saves the state (checkpoint_every_steps)
        self.eval_splits: dict[str, EvalSplit] = {}
        self.curve_split: EvalSplit | None = None  # what an epoch before the last scores (RunData.curve)
        self.companion_splits: dict[str, EvalSplit] = {}

    def phase_owners(self) -> list[Progress]:
        """The Progress objects a phase's time is added to: this run's, or its whole group's."""
        return self.sharing if self.sharing is not None else [self.progress]

    def use_data(self, data: RunData, companion_splits: dict[str, EvalSplit]) -> None:
        """The splits this run evaluates on, and their sizes in its record."""
        self.eval_splits, self.companion_splits, self.curve_split = data.eval_splits, companion_splits, data.curve
        curve_rows = len(data.curve.rows) if data.curve is not None else None
        self.record.update(data_split=data.data_split, split_note=data.split_note, split_sizes=data.split_sizes, curve_rows=curve_rows)

    def start_training(self, params: dict[str, nn.Parameter], optimizer: torch.optim.Optimizer, guard: FiniteGuard,
                       total_steps: int) -> None:
        """Its training objects, as alone or in a group: its trained tensors, AdamW and finiteness check, the
        warmup-then-decay schedule over `total_steps`; then resumed where it saved a state, this attempt's time
        counted from here."""
        self.params, self.optimizer, self.guard = params, optimizer, guard
        self.scheduler = get_linear_schedule_with_warmup(optimizer, int(self.config.warmup_fraction * total_steps), total_steps)
        self.resume()
        self.segment_started = time.perf_counter()

    def resume(self) -> None:
        """Continue from a saved state in the run's dir, where there is one (load_state)."""
        resumed = load_state(self.out, self.config.run_id, self.params, self.optimizer, self.scheduler, self.dropout)
        if resumed is not None:
            self.progress = resumed
        self.curve_log.start(self.progress.global_step)

    def check(self) -> None:
        """Fold the steps since the last check into the epoch's loss; a non-finite one fails the run."""
        guard, p = self.guard, self.progress
        try:
            total, steps = guard.collect(first_step=p.global_step - guard.pending + 1)
        except RunFailed as failure:
            raise RunFailed(f"{failure} (epoch {p.epoch + 1}, lr {self.config.lr:g}): the learning rate is likely too high") from None
        p.epoch_loss_sum += total
        p.epoch_loss_steps += steps
        if steps:
            self.curve_log.train_step(p.global_step, total / steps, float(self.scheduler.get_last_lr()[0]))  # a tensor under step graphs

    def save(self) -> None:
        """Save the full training state (adaptune.train.state), then tell whoever uploads it."""
        # Saved wall time = earlier attempts + this one so far; resumed, the record adds the rest.
        elapsed_before = self.progress.elapsed_s
        self.progress.elapsed_s = elapsed_before + (time.perf_counter() - self.segment_started)
        with phase_times.timed(self.phase_owners(), "saving"):
            save_state(self.out, self.config.run_id, self.params, self.optimizer, self.scheduler, self.progress, self.dropout)
            self.curve_log.flush()
        self.progress.elapsed_s = elapsed_before
        if self.on_state_saved is not None:
            self.on_state_saved()

    def end_epoch(self, evaluate: Evaluator, checkpoint_model: Callable[[], nn.Module]) -> None:
        """Record the epoch's curve point (and at the last epoch: the whole validation split, test, companions,
        checkpoint); `evaluate` scores this run's model on a split, `checkpoint_model()` gives a model holding its
        trained tensors under solo names. Every curve point scores the same rows (curve_split): an epoch before the
        last scores only those, the last scores the whole split once and its curve point reads those rows of it."""
        p, config = self.progress, self.config
        final = p.epoch + 1 == config.epochs
        whole = self.eval_splits["validation"]
        curve = self.curve_split or whole
        validation = evaluate(self.task, whole) if final else None
        point = validation.on_subset(self.task, curve) if validation is not None else evaluate(self.task, curve)
        p.curve.append(
            {
                "epoch": p.epoch + 1,
                "step": p.global_step,
                "train_loss": p.epoch_loss_sum / max(p.epoch_loss_steps, 1),
                "val_metrics": _finite_or_none(point.metrics),
            }
        )
        self.curve_log.epoch(p.global_step, p.epoch + 1, p.curve[-1]["train_loss"], p.curve[-1]["val_metrics"])
        value = _selection_value(point, self.task.primary_metric)
        if p.best_value is None or value > p.best_value:  # kept for the record; the result is the final epoch's
            p.best_epoch, p.best_value = p.epoch + 1, value
        if validation is not None:  # as the official code: train N epochs, evaluate the final model
            self._final_epoch(validation, evaluate, checkpoint_model)
        report_epoch(config.run_id, config.epochs, self.task.primary_metric, p.curve[-1], p.best_epoch)
        p.epoch += 1
        p.step_in_epoch = 0
        p.epoch_loss_sum, p.epoch_loss_steps = 0.0, 0

    def _final_epoch(self, validation: EvalResult, evaluate: Evaluator, checkpoint_model: Callable[[], nn.Module]) -> None:
        """The run's result: the final model's validation, test and companion scores, its predictions and checkpoint."""
        p, config = self.progress, self.config
        p.final_val_metrics = _finite_or_none(validation.metrics)
        p.final_predicted_classes = validation.predicted_classes
        test = self.eval_splits.get("test")
        tested = evaluate(self.task, test) if test else None
        p.final_test_metrics = _finite_or_none(tested.metrics) if tested else {}
        p.final_test_predicted_classes = tested.predicted_classes if tested else None
        p.final_companions = {
            name: {"val_metrics": p.final_val_metrics,
                   "test_metrics": _finite_or_none(evaluate(get_task(name), split).metrics),
                   "split_sizes": {**self.record["split_sizes"], "test": len(split.rows)}}
            for name, split in self.companion_splits.items()
        }
        if validation.predictions is not None:  # SQuAD: the official evaluate-v1.1.py's prediction file
            write_json(self.out / PREDICTIONS_FILE, validation.predictions, sort_keys=False)
        metadata = {"run_id": config.run_id, "task": self.task.name, "epoch": config.epochs, "best_epoch": p.best_epoch,
                    "config": config.to_dict(), "data_split": self.record["data_split"]}
        with phase_times.timed(self.phase_owners(), "saving"):
            save_task_checkpoint(checkpoint_model(), self.method_cfg, config.backbone, self.out / CHECKPOINT_DIR, metadata=metadata)

    def finish(self) -> None:
        """The trained run's result into its record (or "degenerate" where it predicts one class)."""
        p, record = self.progress, self.record
        record.update(
            best_epoch=p.best_epoch,
            val_metrics=p.final_val_metrics,
            test_metrics=p.final_test_metrics,
            companions=p.final_companions,
            train_examples_per_s=p.examples_trained / p.train_time_s if p.train_time_s > 0 else None,
            checkpoint_dir=str(self.out / CHECKPOINT_DIR),
            predicted_classes={split: n for split, n in (("validation", p.final_predicted_classes),
                                                         ("test", p.final_test_predicted_classes)) if n is not None},
        )
        if reason := degenerate_reason(record):
            record.update(status="degenerate", reason=reason)

    def finish_record(self, started: float, write_record: bool) -> dict[str, Any]:
        """Wall time and curve into the record, written unless the store publishes it; a finished run's state removed."""
        self.record["wall_time_s"] = self.progress.elapsed_s + (time.perf_counter() - started)
        self.record["time_s"] = phase_times.recorded(self.progress)
        self.record["curve"] = self.progress.curve
        self.curve_log.close()
        write_run_summary(self.out, self.record)
        if write_record:
            write_json(self.out / RECORD_FILE, self.record)
        if self.record["status"] != "failed":
            remove_state(self.out)
        return self.record


def _selection_value(result: EvalResult, metric: str) -> float:
    if metric not in result.metrics:
        raise KeyError(f"evaluation gave {sorted(result.metrics)} but the task selects by {metric!r}")
    value = float(result.metrics[metric])
    return value if math.isfinite(value) else -math.inf  # e.g. a correlation of constant predictions


def _finite_or_none(metrics: dict[str, Any]) -> dict[str, float | None]:
    """JSON has no NaN: undefined metrics (constant predictions) become null."""
    return {name: (float(v) if v is not None and math.isfinite(float(v)) else None) for name, v in metrics.items()}
