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

The epochs are adaptune.train.epochs' (the loop a fused group trains with too) and the run's books
adaptune.train.run_book's; what is a run alone's own is here: its setup and its step (SoloSteps,
training_step), and the setup helpers a fused group (adaptune.train.group_loop) shares.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import set_seed

from adaptune.core.devices import Device, is_out_of_memory, pick_device, release_memory
from adaptune.data.batching import epoch_batches, make_collator, padded_batch
from adaptune.data.tasks import Task, get_task, scored_companions
from adaptune.fused.frozen_projections import stack_frozen_projections
from adaptune.fused.run_dropout import RunRandomness, dropout_stream, use_run_dropout
from adaptune.fused.run_groups import recorded_layer_norm
from adaptune.fused.settings import StepSettings
from adaptune.model.backbone import load_model, load_tokenizer
from adaptune.model.methods import apply_method, method_from_dict
from adaptune.model.params import count_parameters
from adaptune.train import phase_times
from adaptune.train.config import TrainConfig
from adaptune.train.epochs import EpochDriver, Plan, StepCallback, Stepper
from adaptune.train.evaluate import EvalResult, EvalSplit, evaluate_split
from adaptune.train.finite_guard import SYNC_EVERY_STEPS, FiniteGuard, RunFailed, StepResult  # noqa: F401 (SYNC_EVERY_STEPS: read here by tests)
from adaptune.train.optimizer_step import start_alone, training_step
from adaptune.train.probe import ProbeSteps, probe_head
from adaptune.train.record import record_in_run_dir, run_record, with_provenance
from adaptune.train.run_book import Evaluator, RunBook
from adaptune.train.run_data import RunData, prepare_run_data
from adaptune.train.state import resume_point
from adaptune.train.state_saves import StateSaves


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
    check_config(config)
    device = pick_device()
    record = with_provenance(run_record(config, task.primary_metric, device.name), data_dir)  # filled in as the run goes
    run = RunBook(config, task, method_cfg, device, out, record, on_state_saved, settings)
    try:
        setup_started = time.perf_counter()
        saves = StateSaves()  # a malformed $ADAPTUNE_STATE_EVERY_S fails here, before anything loads
        steps, total_steps = set_up_steps(run, data_dir, cache_dir)
        phase_times.add(run.phase_owners(), "setup", time.perf_counter() - setup_started)
        EpochDriver(steps, saves, total_steps, progress, step_callback).run()
    except RunFailed as failure:
        record.update(status="failed", reason=str(failure))
    except Exception as error:
        if is_out_of_memory(error):
            release_memory(device)  # the caller may go on with another run on this device
        raise
    return run.finish_record(started, write_record)


class SoloSteps:
    """A run alone's steps (an adaptune.train.epochs.Stepper): its own model, optimizer and batches. A diverged
    run ends here: train_and_evaluate records it as failed."""

    drops_diverged = False

    def __init__(self, run: RunBook, model: nn.Module, rows: list[dict[str, Any]], collator: Any) -> None:
        self.runs = [run]
        self.model, self.rows, self.collator = model, rows, collator
        self.lengths = [len(row["input_ids"]) for row in rows]
        self.trainable = [p for p in model.parameters() if p.requires_grad]

    @classmethod
    def start(cls, run: RunBook, model: nn.Module, data: RunData, collator: Any) -> tuple[SoloSteps, int]:
        """The run's training objects over its set-up model and data, resumed where it saved a state; returns its steps
        and how many steps it takes in all."""
        total_steps = start_alone(run, model, len(data.train_rows))
        return cls(run, model, data.train_rows, collator), total_steps

    def start_epoch(self, epoch: int) -> list[Plan]:
        config = self.runs[0].config
        batches = epoch_batches(self.lengths, config.batch_size, config.seed, epoch)
        self.model.train()
        return [batches]

    def prepare(self, batches: list[list[int]]) -> dict[str, torch.Tensor]:
        """The run's one batch, padded, on the device (collated outside the timed step, as it always was)."""
        return padded_batch(self.rows, batches[0], self.collator, self.runs[0].device.torch_device)

    def step(self, batch: dict[str, torch.Tensor]) -> list[StepResult]:
        run = self.runs[0]
        return [training_step(self.model, batch, run.optimizer, run.scheduler, self.trainable, run.device, run.config.max_grad_norm)]

    def drop(self, failed: list[tuple[int, RunFailed]]) -> None:
        raise failed[0][1]  # never asked (drops_diverged is False): a run alone cannot go on without itself

    def evaluators(self) -> list[Evaluator]:
        return [self._evaluate]

    def _evaluate(self, task: Task, split: EvalSplit) -> EvalResult:
        run = self.runs[0]
        with phase_times.timed(run.phase_owners(), "evaluation"):
            return evaluate_split(self.model, task, split, run.device, self.collator)

    def checkpoint_model(self, run: RunBook) -> nn.Module:
        return self.model


def set_up_steps(run: RunBook, data_dir: Any, cache_dir: Any) -> tuple[Stepper, int]:
    """The run's steps, seeded as always and resumed where it saved a state, and how many it takes in all: a probe's on
    the frozen backbone's features where the run trains the head alone on a pooled head (adaptune.train.probe), else
    its whole model's."""
    model, tokenizer, data, randomness = set_up_run(run, data_dir, cache_dir)
    collator = make_collator(tokenizer, pad_to_multiple_of=run.device.pad_multiple)
    head = probe_head(model, run.method_cfg, run.task, randomness)
    if head is not None:
        return ProbeSteps.start(run, model, head, data, collator)
    return SoloSteps.start(run, model, data, collator)


def set_up_run(run: RunBook, data_dir: Any, cache_dir: Any) -> tuple[nn.Module, Any, RunData, RunRandomness]:
    """What every run alone sets up before its training objects: seeded as always, its data read, its model loaded
    with the method applied, its dropout drawn from its own stream, on the device, and what its record says of them.
    Returns the model, the tokenizer, the data and the model's dropout randomness."""
    config, task, device, record = run.config, run.task, run.device, run.record
    seed_everything(config.seed, device)
    tokenizer = load_tokenizer(config.backbone)
    data, companions = prepare_data(config, task, tokenizer, data_dir, cache_dir)
    run.use_data(data, companions)
    model = load_model(config.backbone, task.kind, task.num_labels)
    apply_method(model, run.method_cfg)
    run.settings = settings = resume_point(run.out, run.settings)[1]  # a resumed run keeps its own masks' scheme
    record.update(recorded_step_settings(settings, compile="eager"))  # step graphs are a fused group's
    run.dropout = dropout_stream(config.seed, device.torch_device, settings.dropout_masks)
    randomness = use_run_dropout(model, [run.dropout], settings)
    model.to(device.torch_device)  # type: ignore[arg-type]  # transformers' to() wraps nn.Module.to with a wrong signature
    record.update(frozen_backbone_for_autocast(model, device.autocast_dtype))
    record["layer_norm"] = recorded_layer_norm(model)  # "torch": a run alone has torch's LayerNorms
    counts = count_parameters(model)
    record.update(trained_params=counts.trained, total_params=counts.total)
    return model, tokenizer, data, randomness


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


def check_config(config: TrainConfig) -> None:
    """A config's values that no run could train with, all named in one ValueError, before anything loads."""
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


def seed_everything(seed: int, device: Device) -> None:
    """Seed every generator a run draws from; on CUDA, deterministic kernels from the first call on."""
    if device.kind == "cuda":
        # cuBLAS needs this before its first call to be deterministic; then only deterministic kernels.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=True)
    set_seed(seed)


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
