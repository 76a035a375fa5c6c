"""Several runs of a shard side by side on one device, one spawned process each, from one queue: a small
model leaves a GPU idle between its kernel launches, which another run's launches fill. The runs'
leases share them out, so each is trained once, exactly as it would be alone."""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import os
from collections.abc import Iterator
from queue import Empty
from typing import Any

from adaptune.sweep.machine import use_staged_backbones
from adaptune.sweep.run_attempt import form_groups, train_groups
from adaptune.sweep.store import RunStore
from adaptune.train.config import TrainConfig

RUNS_PER_DEVICE_ENV = "ADAPTUNE_RUNS_PER_DEVICE"
RUNS_PER_GROUP_ENV = "ADAPTUNE_RUNS_PER_GROUP"


def runs_per_device(accelerator: Any) -> int:
    return _count(RUNS_PER_DEVICE_ENV, "runs_per_device", accelerator)


def runs_per_group(accelerator: Any) -> int:
    """Runs fused into one forward pass (adaptune.train.group_loop): the accelerator's setting, or the env's."""
    return _count(RUNS_PER_GROUP_ENV, "runs_per_group", accelerator)


def _count(env: str, field: str, accelerator: Any) -> int:
    value = os.environ.get(env) or getattr(accelerator, field, 1)
    try:
        count = int(value)
    except ValueError:
        count = 0
    if count < 1:
        raise ValueError(f"{env} / {field} must be a whole number >= 1, got {value!r}")
    return count


def train_side_by_side(configs: list[TrainConfig], shard_id: str, store: RunStore, backbones: set[str],
                        options: dict[str, Any], workers: int, group_size: int = 1) -> dict[str, str]:
    """`workers` processes taking the shard's runs (or groups of `group_size`) from one queue, so a
    worker that finishes early takes the next (runs differ in length)."""
    context = multiprocessing.get_context("spawn")  # CUDA cannot be forked once initialised
    with context.Manager() as manager, concurrent.futures.ProcessPoolExecutor(workers, mp_context=context) as pool:
        queue = manager.Queue()
        for group in form_groups(configs, group_size):
            queue.put(group)
        futures = [pool.submit(_worker, queue, shard_id, store.root, sorted(backbones), options) for _ in range(workers)]
        merged: dict[str, str] = {}
        for future in futures:
            merged.update(future.result())
    return merged


def _worker(queue: Any, shard_id: str, root: str, backbones: list[str], options: dict[str, Any]) -> dict[str, str]:
    store = RunStore(root)
    use_staged_backbones(store, backbones)  # a fresh process: the parent's staged paths are not inherited
    return train_groups(_drain(queue), shard_id, store, options)


def _drain(queue: Any) -> Iterator[list[TrainConfig]]:
    while True:
        try:
            yield queue.get_nowait()
        except Empty:
            return
