"""One run: train a method on a task, evaluate every epoch, keep the final epoch's result, write record + checkpoint.

The procedure follows the paper's official code: AdamW with weight decay 0.01 (not on biases and
LayerNorm weights, as BERT does), linear warmup over the first 10% of steps then linear decay to
zero, gradient clipping at 1.0, batch 32, max length 128, the head on the first token (or mean
pooling where the backbone's pooler was never trained: backbone.py's head rule). Batches are
dynamically padded and length-grouped. The full training state is saved at epoch ends (as often as
adaptune.train.state_saves allows, never after the last) and every `checkpoint_every_steps`, so a
preempted run restarted with the same out dir resumes and ends with the same result. A diverging run
comes back as a record with status "failed"; out of memory is raised for the caller
(adaptune.sweep.shard_runner) to retry, as it is transient on a shared device.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn
from tqdm.auto import tqdm
from transformers import get_linear_schedule_with_warmup, set_seed
from transformers.trainer_pt_utils import get_parameter_names

from adaptune.core.devices import Device, is_out_of_memory, pick_device, release_memory
from adaptune.core.files import write_json
from adaptune.core.run_files import CHECKPOINT_DIR, PREDICTIONS_FILE, RECORD_FILE
from adaptune.data.batching import epoch_batches, iterate_batches, make_collator
from adaptune.data.tasks import Task, get_task, scored_companions
from adaptune.fused.frozen_projections import stack_frozen_projections
from adaptune.fused.run_dropout import dropout_stream, use_run_dropout
from adaptune.fused.run_groups import recorded_layer_norm
from adaptune.fused.settings import StepSettings
from adaptune.model.backbone import load_model, load_tokenizer
from adaptune.model.checkpoint import save_task_checkpoint
from adaptune.model.methods import apply_method, method_from_dict
from adaptune.model.params import count_parameters
from adaptune.train import phase_times
from adaptune.train.config import TrainConfig
from adaptune.train.epoch_log import report_epoch
from adaptune.train.evaluate import EvalResult, EvalSplit, evaluate_split
from adaptune.train.event_log import CurveLog, write_run_summary
from adaptune.train.record import record_in_run_dir, run_record, with_provenance
from adaptune.train.run_data import RunData, prepare_run_data
from adaptune.train.state import Progress, load_state, remove_state, resume_point, save_state, trained_parameters
from adaptune.train.state_saves import StateSaves

StepCallback = Callable[[int], None]
Evaluator = Callable[[Task, EvalSplit], EvalResult]  # one run's scores on a split
# On a GPU or TPU, read the steps' losses back this often: a read waits for every queued kernel.
SYNC_EVERY_STEPS = 50


class RunFailed(Exception):
    """The run cannot go on (non-finite loss or gradients); becomes a "failed" record, not a crash."""


def train_and_evaluate(
    config: TrainConfig,
    data_dir: str | os.PathLike[str] | None = None,
    out_dir: str | os.PathLike[str] | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    progress: bool = True,
    step_callback: StepCallback | None = None,
    on_state_saved: Callable[[], None] | None = None,
    write_record: bool = True,
    settings: StepSettings | None = None,
) -> dict[str, Any]:
    """Train and evaluate one run, its steps computed as `settings` say (None: this process's environment's, read
    once here, as at any entry point); returns its record (also written to out_dir/record.json unless
    `write_record` is False: the run store publishes the record itself, once, with its provenance).

    out_dir defaults to runs/<run_id>. A finished record already there for the same run id is
    returned as is; a saved training state there is resumed. `step_callback(global_step)` runs after
    every optimizer step (and after any state save of that step): a hook for progress reporting, and
    for tests that interrupt a run by raising from it. `on_state_saved()` runs after every saved
    training state (the run store uploads it there, so a preempted run resumes on another machine).

    Out of memory is raised, not recorded: on a shared device it is transient, and the run store's
    shard runner (adaptune.sweep.shard_runner) decides whether to retry or record it.
    """
    settings = settings or StepSettings.from_environment()  # an entry point's: read once, passed down
    started = time.perf_counter()
    out = Path(out_dir) if out_dir is not None else Path("runs") / config.run_id
    out.mkdir(parents=True, exist_ok=True)
    finished = record_in_run_dir(out, config.run_id)
    if finished is not None and finished.get("status") != "failed":
        return finished

    task = get_task(config.task)
    method_cfg = method_from_dict(config.method)
    _check_config(config)
    device = pick_device()
    record = with_provenance(run_record(config, task.primary_metric, device.name), data_dir)  # filled in as the run goes
    run = _Run(config, task, method_cfg, device, out, record, on_state_saved, settings)
    try:
        run.execute(data_dir, cache_dir, progress, step_callback)
    except RunFailed as failure:
        record.update(status="failed", reason=str(failure))
    except Exception as error:
        if is_out_of_memory(error):
            release_memory(device)  # the caller may go on with another run on this device
        raise
    return run.finish_record(started, write_record)


class _Run:
    """The state of one run while it trains: kept on an object so a failure can still report it."""

    def __init__(self, config: TrainConfig, task: Task, method_cfg: Any, device: Device, out: Path, record: dict[str, Any],
                 on_state_saved: Callable[[], None] | None = None, settings: StepSettings = StepSettings()) -> None:
        self.config, self.task, self.method_cfg, self.device, self.out, self.record = config, task, method_cfg, device, out, record
        self.settings = settings  # as given; a resumed run's masks' scheme is its own (execute)
        self.on_state_saved = on_state_saved
        self.progress = Progress()
        self.curve_log = CurveLog(out)  # TensorBoard's view of the curve, beside the record's
        self.sharing: list[Progress] | None = None  # a fused group's runs' progress: its phases are theirs too

    def _phase_owners(self) -> list[Progress]:
        return self.sharing if self.sharing is not None else [self.progress]

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

    def execute(self, data_dir: Any, cache_dir: Any, show_progress: bool, step_callback: StepCallback | None) -> None:
        config, task, device = self.config, self.task, self.device
        setup_started = time.perf_counter()
        saves = StateSaves()  # a malformed $ADAPTUNE_STATE_EVERY_S fails here, before anything loads
        _seed_everything(config.seed, device)
        tokenizer = load_tokenizer(config.backbone)
        data, self.companion_splits = prepare_data(config, task, tokenizer, data_dir, cache_dir)
        self.record.update(data_split=data.data_split, split_note=data.split_note, split_sizes=data.split_sizes)
        model = load_model(config.backbone, task.kind, task.num_labels)
        apply_method(model, self.method_cfg)
        self.settings = settings = resume_point(self.out, self.settings)[1]  # a resumed run keeps its own masks' scheme
        self.record.update(recorded_step_settings(settings, compile="eager"))  # step graphs are a fused group's
        self.dropout = dropout_stream(config.seed, device.torch_device, settings.dropout_masks)
        use_run_dropout(model, [self.dropout], settings)
        model.to(device.torch_device)
        self.record.update(frozen_backbone_for_autocast(model, device.autocast_dtype))
        self.record["layer_norm"] = recorded_layer_norm(model)  # "torch": a run alone has torch's LayerNorms
        counts = count_parameters(model)
        self.record.update(trained_params=counts.trained, total_params=counts.total)

        steps_per_epoch = math.ceil(len(data.train_rows) / config.batch_size)
        total_steps = steps_per_epoch * config.epochs
        optimizer = _adamw(model, config.lr, config.weight_decay)
        scheduler = get_linear_schedule_with_warmup(optimizer, int(config.warmup_fraction * total_steps), total_steps)
        resumed = load_state(self.out, config.run_id, trained_parameters(model), optimizer, scheduler, self.dropout)
        if resumed is not None:
            self.progress = resumed
        self.scheduler = scheduler
        self.curve_log.start(self.progress.global_step)
        collator = make_collator(tokenizer, pad_to_multiple_of=device.pad_multiple)
        lengths = [len(row["input_ids"]) for row in data.train_rows]
        segment_started = time.perf_counter()
        trainable = [p for p in model.parameters() if p.requires_grad]
        guard = FiniteGuard(device)
        phase_times.add([self.progress], "setup", time.perf_counter() - setup_started)

        bar = tqdm(total=total_steps, initial=self.progress.global_step, desc=config.run_id, disable=not show_progress, leave=False)
        try:
            while self.progress.epoch < config.epochs:
                p = self.progress
                batches = epoch_batches(lengths, config.batch_size, config.seed, p.epoch)
                model.train()
                for batch_rows, batch in zip(
                    batches[p.step_in_epoch :], iterate_batches(data.train_rows, batches[p.step_in_epoch :], collator, device.torch_device)
                ):
                    step_started = time.perf_counter()
                    guard.add(self._step(model, batch, optimizer, scheduler, trainable))
                    p.examples_trained += len(batch_rows)
                    p.global_step += 1
                    p.step_in_epoch += 1
                    every = config.checkpoint_every_steps
                    saving = bool(every and p.global_step % every == 0 and p.step_in_epoch < len(batches))
                    if saving or p.step_in_epoch == len(batches) or guard.due():
                        self._check(guard, p)  # waits for the device: inside the timed step, so train time stays honest
                        bar.set_postfix(epoch=p.epoch + 1, loss=f"{guard.last_loss:.4f}", **_last_validation(p.curve, self.task.primary_metric))
                    p.train_time_s += time.perf_counter() - step_started
                    bar.update(1)
                    if saving:
                        with saves.saving():
                            self._save(model, optimizer, scheduler, segment_started)
                    if step_callback is not None:
                        step_callback(p.global_step)
                self._end_epoch(model, data, self._evaluator(model, collator))
                if saves.due_at_epoch_end(last_epoch=p.epoch == config.epochs):
                    with saves.saving():
                        self._save(model, optimizer, scheduler, segment_started)
        finally:
            bar.close()
        self._finish()

    def _step(self, forward: Callable[..., Any], batch: dict[str, torch.Tensor], optimizer: Any, scheduler: Any,
              trainable: list[nn.Parameter]) -> StepResult:
        return training_step(forward, batch, optimizer, scheduler, trainable, self.device, self.config.max_grad_norm)

    def _check(self, guard: FiniteGuard, p: Progress) -> None:
        """Fold the steps since the last check into the epoch's loss; a non-finite one fails the run."""
        try:
            total, steps = guard.collect(first_step=p.global_step - guard.pending + 1)
        except RunFailed as failure:
            raise RunFailed(f"{failure} (epoch {p.epoch + 1}, lr {self.config.lr:g}): the learning rate is likely too high") from None
        p.epoch_loss_sum += total
        p.epoch_loss_steps += steps
        if steps:
            self.curve_log.train_step(p.global_step, total / steps, float(self.scheduler.get_last_lr()[0]))  # a tensor under step graphs

    def _evaluator(self, model: nn.Module, collator: Any) -> Evaluator:
        def evaluate(task: Task, split: EvalSplit) -> EvalResult:
            with phase_times.timed(self._phase_owners(), "evaluation"):
                return evaluate_split(model, task, split, self.device, collator)

        return evaluate

    def _end_epoch(self, model: nn.Module, data: RunData, evaluate: Evaluator) -> None:
        """Record the epoch's validation (and at the last epoch: test, companions, checkpoint); `evaluate`
        scores this run's model on a split, `model` holds this run's trained tensors under solo names."""
        p, config = self.progress, self.config
        validation = evaluate(self.task, data.eval_splits["validation"])
        p.curve.append(
            {
                "epoch": p.epoch + 1,
                "step": p.global_step,
                "train_loss": p.epoch_loss_sum / max(p.epoch_loss_steps, 1),
                "val_metrics": _finite_or_none(validation.metrics),
            }
        )
        self.curve_log.epoch(p.global_step, p.epoch + 1, p.curve[-1]["train_loss"], p.curve[-1]["val_metrics"])
        value = _selection_value(validation, self.task.primary_metric)
        if p.best_value is None or value > p.best_value:  # kept for the record; the result is the final epoch's
            p.best_epoch, p.best_value = p.epoch + 1, value
        if p.epoch + 1 == config.epochs:  # as the official code: train N epochs, evaluate the final model
            p.final_val_metrics = _finite_or_none(validation.metrics)
            p.final_predicted_classes = validation.predicted_classes
            test = data.eval_splits.get("test")
            p.final_test_metrics = _finite_or_none(evaluate(self.task, test).metrics) if test else {}
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
            with phase_times.timed(self._phase_owners(), "saving"):
                save_task_checkpoint(self._checkpoint_model(model), self.method_cfg, config.backbone, self.out / CHECKPOINT_DIR, metadata=metadata)
        report_epoch(config.run_id, config.epochs, self.task.primary_metric, p.curve[-1], p.best_epoch)
        p.epoch += 1
        p.step_in_epoch = 0
        p.epoch_loss_sum, p.epoch_loss_steps = 0.0, 0

    def _trained(self, model: nn.Module) -> dict[str, nn.Parameter]:
        return trained_parameters(model)

    def _checkpoint_model(self, model: nn.Module) -> nn.Module:
        return model

    def _save(self, model: nn.Module, optimizer: Any, scheduler: Any, segment_started: float) -> None:
        # Saved wall time = earlier attempts + this one so far; resumed, the record adds the rest.
        elapsed_before = self.progress.elapsed_s
        self.progress.elapsed_s = elapsed_before + (time.perf_counter() - segment_started)
        with phase_times.timed(self._phase_owners(), "saving"):
            save_state(self.out, self.config.run_id, self._trained(model), optimizer, scheduler, self.progress, self.dropout)
            self.curve_log.flush()
        self.progress.elapsed_s = elapsed_before
        if self.on_state_saved is not None:
            self.on_state_saved()

    def _finish(self) -> None:
        p, record = self.progress, self.record
        record.update(
            best_epoch=p.best_epoch,
            val_metrics=p.final_val_metrics,
            test_metrics=p.final_test_metrics,
            companions=p.final_companions,
            train_examples_per_s=p.examples_trained / p.train_time_s if p.train_time_s > 0 else None,
            checkpoint_dir=str(self.out / CHECKPOINT_DIR),
        )
        if p.final_predicted_classes == 1 and self.task.num_labels > 1:
            final = p.final_val_metrics.get(self.task.primary_metric)
            record.update(
                status="degenerate",
                reason=f"validation predictions at the final epoch ({self.config.epochs}) are all one class "
                f"({self.task.primary_metric} {final if final is None else f'{final:g}'}); compare other seeds and learning rates",
            )


def prepare_data(config: TrainConfig, task: Task, tokenizer: Any, data_dir: Any, cache_dir: Any) -> tuple[RunData, dict[str, EvalSplit]]:
    """A run's data, and the test splits of the tasks it also scores (MNLI-mm for an MNLI run: the
    mismatched dev set; their validation slice is this run's, the same train file held out alike).
    All of it is read and checked before training starts."""
    data = prepare_run_data(
        task, tokenizer, config.max_length, config.doc_stride, config.max_train_examples, config.max_eval_examples, data_dir, cache_dir
    )
    if not data.train_rows:
        raise ValueError(f"task {task.name!r} has no training rows; check the data dir")
    companions = {
        name: prepare_run_data(get_task(name), tokenizer, config.max_length, config.doc_stride, None, config.max_eval_examples,
                               data_dir, cache_dir, with_train=False, eval_only=("test",)).eval_splits["test"]
        for name in scored_companions(task.name)
    }
    return data, companions


StepResult = tuple[torch.Tensor, torch.Tensor]  # (loss, gradient norm), still on the device


def training_step(
    model: Callable[..., Any], batch: dict[str, torch.Tensor], optimizer: Any, scheduler: Any, trainable: list[nn.Parameter],
    device: Device, max_grad_norm: float,
) -> StepResult:
    """One optimizer step (forward, backward, clip, AdamW, schedule) of `model`; returns (loss, gradient norm) as
    device tensors, so that a GPU step never waits for the host. `FiniteGuard` checks them: on the CPU
    at once, before the weights change; on a GPU or TPU within SYNC_EVERY_STEPS steps, and always
    before a state is saved or the model evaluated, so a diverged run is recorded as failed either way.
    The benchmark times this same function.
    """
    with device.autocast():
        loss = model(**batch).loss
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(trainable, max_grad_norm)
    if device.kind == "cpu" and not (math.isfinite(float(loss.detach())) and math.isfinite(float(grad_norm))):
        optimizer.zero_grad(set_to_none=True)  # the CPU has no queue to keep full: stop before the update
        return loss.detach(), grad_norm
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    device.mark_step()
    return loss.detach(), grad_norm


class FiniteGuard:
    """Loss and gradient-norm checks without a host sync per step: results stay on the device and are
    read every `every` steps (every step on the CPU, where reading costs nothing)."""

    def __init__(self, device: Device, every: int | None = None) -> None:
        self.every = every or (1 if device.kind == "cpu" else SYNC_EVERY_STEPS)
        self.results: list[StepResult] = []
        self.last_loss = math.nan

    @property
    def pending(self) -> int:
        return len(self.results)

    def add(self, result: StepResult) -> None:
        self.results.append(result)

    def due(self) -> bool:
        return len(self.results) >= self.every

    def collect(self, first_step: int) -> tuple[float, int]:
        """(sum of the losses, number of steps) since the last call; RunFailed names the first bad step."""
        if not self.results:
            return 0.0, 0
        values = torch.stack([torch.stack([loss.float(), norm.float()]) for loss, norm in self.results]).cpu()
        self.results = []
        for offset, (loss, norm) in enumerate(values.tolist()):
            if not math.isfinite(loss):
                raise RunFailed(f"non-finite training loss ({loss}) at step {first_step + offset}")
            if not math.isfinite(norm):
                raise RunFailed(f"non-finite gradient norm ({norm}) at step {first_step + offset}")
        self.last_loss = float(values[-1, 0])
        return float(values[:, 0].sum()), len(values)


def _last_validation(curve: list[dict[str, Any]], metric: str) -> dict[str, str]:
    """The progress bar's note of the last finished epoch's validation score (none before the first)."""
    value = (curve[-1].get("val_metrics") or {}).get(metric) if curve else None
    return {f"val_{metric}": f"{value:.4f}"} if value is not None else {}


def _check_config(config: TrainConfig) -> None:
    problems = []
    if config.epochs < 1:
        problems.append(f"epochs must be >= 1, got {config.epochs}")
    if config.batch_size < 1:
        problems.append(f"batch_size must be >= 1, got {config.batch_size}")
    if not math.isfinite(config.lr) or config.lr <= 0:
        problems.append(f"lr must be a finite number > 0, got {config.lr}")
    if not 0 <= config.warmup_fraction < 1:
        problems.append(f"warmup_fraction must be in [0, 1), got {config.warmup_fraction}")
    if config.checkpoint_every_steps is not None and config.checkpoint_every_steps < 1:
        problems.append(f"checkpoint_every_steps must be >= 1 or None, got {config.checkpoint_every_steps}")
    if problems:
        raise ValueError(f"invalid TrainConfig for {config.run_id}: " + "; ".join(problems))


def _seed_everything(seed: int, device: Device) -> None:
    if device.kind == "cuda":
        # cuBLAS needs this before its first call to be deterministic; then only deterministic kernels.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=True)
    set_seed(seed)


def _adamw(model: nn.Module, lr: float, weight_decay: float) -> torch.optim.AdamW:
    return adamw(trained_parameters(model), decayed_names(model), lr, weight_decay)


def decayed_names(model: nn.Module) -> set[str]:
    """The parameters weight decay applies to: BERT's exclusions, no biases and no LayerNorm weights."""
    return {name for name in get_parameter_names(model, [nn.LayerNorm]) if not name.endswith("bias")}


def adamw(trained: Mapping[str, nn.Parameter], decayed: set[str], lr: float, weight_decay: float) -> torch.optim.AdamW:
    """AdamW over one run's trained tensors (by solo name, in the model's order), decay where `decayed` says."""
    groups: list[dict[str, Any]] = [{"params": [], "weight_decay": weight_decay}, {"params": [], "weight_decay": 0.0}]
    for name, parameter in trained.items():
        groups[0 if name in decayed else 1]["params"].append(parameter)
    fused = all(p.is_cuda for g in groups for p in g["params"])  # one kernel for every parameter's update
    return torch.optim.AdamW([g for g in groups if g["params"]], lr=lr, weight_decay=weight_decay, fused=fused or None)


def frozen_backbone_for_autocast(model: nn.Module, dtype: torch.dtype | None) -> dict[str, str]:
    """The frozen backbone as training runs it under autocast in `dtype` (None: no autocast, left as it is):
    its Linear layers stored in `dtype`, and each frozen query, key and value as one matmul (it saves the input's
    casts; in float32 it saved nothing, bench/projections.json). Returns what records say: "projections" ("stacked"
    or "separate") and "residual" (always "float32": the stream's bf16 option went untimed, bench/LOG.md)."""
    if dtype is None:
        return {"projections": "separate", "residual": "float32"}
    keep_frozen_matmuls_in(model, dtype)
    return {"projections": "stacked" if stack_frozen_projections(model) else "separate", "residual": "float32"}


def recorded_step_settings(settings: StepSettings, **actual: str) -> dict[str, str]:
    """What a run's record says of the settings its steps ran under (`actual` overrides what a run could not use:
    a lone run's compile); its adapters' and LoRA's sums are always their own operators ("separate")."""
    return {**settings.recorded(), **actual, "branch_sums": "separate"}


def keep_frozen_matmuls_in(model: nn.Module, dtype: torch.dtype) -> None:
    """Store frozen Linear layers in the autocast dtype: autocast caches the casts of trainable weights
    only, so a frozen float32 weight would be cast again on every forward. Half the memory too."""
    for module in model.modules():
        if isinstance(module, nn.Linear) and not any(p.requires_grad for p in module.parameters(recurse=False)):
            module.to(dtype)


def _selection_value(result: EvalResult, metric: str) -> float:
    if metric not in result.metrics:
        raise KeyError(f"evaluation gave {sorted(result.metrics)} but the task selects by {metric!r}")
    value = float(result.metrics[metric])
    return value if math.isfinite(value) else -math.inf  # e.g. a correlation of constant predictions


def _finite_or_none(metrics: dict[str, Any]) -> dict[str, float | None]:
    """JSON has no NaN: undefined metrics (constant predictions) become null."""
    return {name: (float(v) if v is not None and math.isfinite(float(v)) else None) for name, v in metrics.items()}
