"""The one epoch loop, for a run alone (adaptune.train.loop) and for a fused group (adaptune.train.group_loop):
steps, checks, state saves, the step callback and the epoch's evaluation, in one order for both, so that a
run in a group keeps the books it would keep alone. What differs, how a step is computed for the runs it
trains, is a Stepper's."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any, Protocol

from torch import nn
from tqdm.auto import tqdm

from adaptune.core.devices import Device
from adaptune.train.finite_guard import RunFailed, StepResult
from adaptune.train.run_book import Evaluator, RunBook
from adaptune.train.state_saves import StateSaves

StepCallback = Callable[[int], None]
Plan = list[list[int]]  # one run's batches of an epoch (row indices), in its seeded order


class Stepper(Protocol):
    """How the steps of some runs are computed: a run alone's (loop.SoloSteps), a fused group's (group_loop)."""

    runs: list[RunBook]  # the runs still training, in order
    # False: a diverged run ends the training (RunFailed is raised, untimed, for its trainer to record);
    # True: it is recorded as failed and leaves (drop), the others go on.
    drops_diverged: bool

    def start_epoch(self, epoch: int) -> list[Plan]:
        """Each run's batches of this epoch; the model set to train."""
        ...

    def prepare(self, batches: list[list[int]]) -> Any:
        """A step's inputs from each run's batch, before the step's time starts."""
        ...

    def step(self, inputs: Any) -> list[StepResult]:
        """One optimizer step of every run; each run's (loss, gradient norm), still on the device."""
        ...

    def drop(self, failed: list[tuple[int, RunFailed]]) -> None:
        """Record these runs (by index into `runs`) as failed and go on without them."""
        ...

    def evaluators(self) -> list[Evaluator]:
        """Each run's scorer for this epoch's end."""
        ...

    def checkpoint_model(self, run: RunBook) -> nn.Module:
        """A model holding `run`'s trained tensors under solo names, for its checkpoint."""
        ...


class EpochDriver:
    """Trains a Stepper's runs to their last epoch. Every run of a stepper shares epochs and batch counts; one
    StateSaves decides for all of them, so they stay at one step (and resume as one group)."""

    def __init__(self, stepper: Stepper, saves: StateSaves, total_steps: int, show_progress: bool,
                 step_callback: StepCallback | None) -> None:
        self.stepper, self.saves, self.step_callback = stepper, saves, step_callback
        first = stepper.runs[0]
        self.epochs = first.config.epochs
        self.bar = tqdm(total=total_steps, initial=first.progress.global_step, desc=first.config.run_id,
                        disable=not show_progress, leave=False)

    def run(self) -> None:
        """Every epoch left; each run's result into its record at the end (RunBook.finish)."""
        stepper = self.stepper
        try:
            while stepper.runs and stepper.runs[0].progress.epoch < self.epochs:
                graphs = GraphCount(stepper.runs[0].device)
                plans = stepper.start_epoch(stepper.runs[0].progress.epoch)
                for step in range(stepper.runs[0].progress.step_in_epoch, len(plans[0])):
                    plans = self._step(plans, step)
                    if not stepper.runs:
                        return
                graphs.phase("steps")
                self._end_epoch()
                graphs.phase("epoch_end")
                graphs.into_curves(stepper.runs)
        finally:
            self.bar.close()
        for run in stepper.runs:
            run.finish()

    def _step(self, plans: list[Plan], step: int) -> list[Plan]:
        """One step of every run, its checks, any saves; returns the plans of the runs that go on."""
        batches = [plan[step] for plan in plans]
        inputs = self.stepper.prepare(batches)
        step_started = time.perf_counter()
        for run, result in zip(self.stepper.runs, self.stepper.step(inputs), strict=True):
            run.guard.add(result)
        failed = self._count_and_check(batches, len(plans[0]))  # waits for the device: inside the timed step, so train time stays honest
        elapsed = time.perf_counter() - step_started
        for run in self.stepper.runs:
            run.progress.train_time_s += elapsed
        self.bar.update(1)
        if failed:
            gone = {index for index, _ in failed}
            self.stepper.drop(failed)
            plans = [plan for index, plan in enumerate(plans) if index not in gone]
        self._save([run for run in self.stepper.runs if run.saving])
        if self.step_callback is not None and self.stepper.runs:
            self.step_callback(self.stepper.runs[0].progress.global_step)
        return plans

    def _count_and_check(self, batches: list[list[int]], in_epoch: int) -> list[tuple[int, RunFailed]]:
        """Each run's progress after a step; its losses checked when due, before a save and at the epoch's end."""
        failed = []
        for index, (run, batch) in enumerate(zip(self.stepper.runs, batches, strict=True)):
            p = run.progress
            p.examples_trained += len(batch)
            p.global_step += 1
            p.step_in_epoch += 1
            every = run.config.checkpoint_every_steps
            run.saving = bool(every and p.global_step % every == 0 and p.step_in_epoch < in_epoch)
            if run.saving or p.step_in_epoch == in_epoch or run.guard.due():
                try:
                    run.check()
                except RunFailed as failure:
                    if not self.stepper.drops_diverged:
                        raise
                    failed.append((index, failure))
                    continue
                if index == 0:
                    self.bar.set_postfix(epoch=p.epoch + 1, loss=f"{run.guard.last_loss:.4f}",
                                         **last_validation(p.curve, run.task.primary_metric))
        return failed

    def _end_epoch(self) -> None:
        runs = self.stepper.runs
        for run, evaluate in zip(runs, self.stepper.evaluators(), strict=True):
            run.end_epoch(evaluate, functools.partial(self.stepper.checkpoint_model, run))
        if self.saves.due_at_epoch_end(last_epoch=runs[0].progress.epoch == self.epochs):
            self._save(runs)

    def _save(self, runs: list[RunBook]) -> None:
        """These runs' states, timed as one save for the next decision (StateSaves)."""
        if runs:
            with self.saves.saving():
                for run in runs:
                    run.save()


class GraphCount:
    """The graphs XLA compiled in each phase of an epoch (Device.compiled_graphs), into each run's curve point as
    `xla_graphs` ({"steps": n, "epoch_end": m}: the steps, then the epoch's end, its evaluation, state save and at the
    last epoch its checkpoint; a fused group's runs share theirs). Nothing off XLA."""

    def __init__(self, device: Device) -> None:
        self.device, self.phases = device, dict[str, int]()
        self.last = device.compiled_graphs()

    def phase(self, name: str) -> None:
        now = self.device.compiled_graphs()
        if now is not None and self.last is not None:
            self.phases[name], self.last = now - self.last, now

    def into_curves(self, runs: list[RunBook]) -> None:
        if self.phases:
            for run in runs:
                run.progress.curve[-1]["xla_graphs"] = dict(self.phases)


def last_validation(curve: list[dict[str, Any]], metric: str) -> dict[str, str]:
    """The progress bar's note of the last finished epoch's validation score (none before the first)."""
    value = (curve[-1].get("val_metrics") or {}).get(metric) if curve else None
    return {f"val_{metric}": f"{value:.4f}"} if value is not None else {}
