"""The machine a shard runs on, checked before any run: the accelerator it was compiled for, loadable
backbones (staged in the store, else the hub), the trainer it runs, and a deadline it ends itself at."""

from __future__ import annotations

import importlib
import os
import sys
import threading
from collections.abc import Callable, Iterable
from typing import Any

from adaptune.core import environment
from adaptune.core.errors import UserError
from adaptune.sweep.store import RunStore

TRAINER_ENV = "ADAPTUNE_TRAINER"  # "module:function" with train_and_evaluate's signature (dry runs of a DAG's shape)


class ShardEnvironmentError(UserError, RuntimeError):
    """The machine cannot train this shard (no accelerator, no backbone): the task fails, no run is recorded."""


def prepare_machine(store: RunStore, backbones: Iterable[str]) -> str:
    """Check the accelerator the task asked for and make every backbone loadable, before any run; returns the device's
    name as records give it ("cpu", "cpu:bf16", "cuda:...")."""
    from adaptune.core.devices import CpuBf16Unsupported, pick_device
    from adaptune.model.backbone import BackboneError, check_backbone

    try:
        device = pick_device()  # $ADAPTUNE_DEVICE=cuda|xla on accelerator tasks: raises instead of using the CPU
    except (ValueError, CpuBf16Unsupported) as error:  # a setting's value, not the node's driver
        raise ShardEnvironmentError(str(error)) from None
    except RuntimeError as error:
        raise ShardEnvironmentError(f"{error}. This task was compiled for that accelerator: check the node's driver "
                                    "(nvidia-smi; README, 'Before your first submission')") from None
    print(f"device: {device.name}", flush=True)
    for name in sorted(set(backbones)):
        staged = use_staged_backbones(store, [name])
        if environment.settings().trainer:
            continue  # a stand-in trainer (a dry run of the DAG's shape) loads no weights
        try:
            check_backbone(name)
        except BackboneError as error:
            hint = "" if staged else f"; stage its weights once with `make stage-models RUNS_ROOT={store.root}` so pods load them from the store"
            raise ShardEnvironmentError(f"{error}{hint}") from None
    return device.name


def use_staged_backbones(store: RunStore, backbones: Iterable[str]) -> list[str]:
    """Load each backbone staged in the store (models/<name>) from there; returns the names staged."""
    from adaptune.model.backbone import use_staged_backbone

    staged = []
    for name in backbones:
        path = store.staged_backbone(name)
        if path is not None:
            use_staged_backbone(name, path)
            print(f"backbone {name}: the copy staged in {store.files.url('models', name)}", flush=True)
            staged.append(name)
    return staged


def start_deadline(seconds: float, shard_id: str) -> threading.Timer:
    """End this process (exit 124, as `timeout` does) after `seconds`, whatever it is doing: a hung
    collective or data loader never returns to Python. Saved states and leases let a retry resume."""
    def expire() -> None:
        print(f"{shard_id}: past its deadline of {seconds / 3600:.1f} h (DEADLINE_FACTOR x the estimate + slack): "
              "ending the task; a retry or resubmission resumes from the run store", file=sys.stderr, flush=True)
        os._exit(124)

    timer = threading.Timer(seconds, expire)
    timer.daemon = True
    timer.start()
    return timer


def load_trainer() -> Callable[..., dict[str, Any]]:
    """adaptune.train.loop.train_and_evaluate, or the function $ADAPTUNE_TRAINER names."""
    target = environment.settings().trainer
    if not target:
        from adaptune.train.loop import train_and_evaluate

        return train_and_evaluate
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)
