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
from adaptune.sweep.run_attempt import train_runs
from adaptune.sweep.store import RunStore
from adaptune.train.config import TrainConfig

RUNS_PER_DEVICE_ENV = "ADAPTUNE_RUNS_PER_DEVICE"


def runs_per_device(accelerator: Any) -> int:
    value = os.environ.get(RUNS_PER_DEVICE_ENV) or getattr(accelerator, "runs_per_device", 1)
    try:
        count = int(value)
    except ValueError:
        count = 0
    if count < 1:
        raise ValueError(f"{RUNS_PER_DEVICE_ENV} / runs_per_device must be a whole number >= 1, got {value!r}")
    return count


def train_side_by_side(configs: list[TrainConfig], shard_id: str, store: RunStore, backbones: set[str],
                        options: dict[str, Any], workers: int) -> dict[str, str]:
    """`workers` processes taking the shard's runs from one queue, so a worker that finishes early
    takes the next run (runs differ in length)."""
    context = multiprocessing.get_context("spawn")  # CUDA cannot be forked once initialised
    with context.Manager() as manager, concurrent.futures.ProcessPoolExecutor(workers, mp_context=context) as pool:
        queue = manager.Queue()
        for config in configs:
            queue.put(config)
        futures = [pool.submit(_worker, queue, shard_id, store.root, sorted(backbones), options) for _ in range(workers)]
        merged: dict[str, str] = {}
        for future in futures:
            merged.update(future.result())
    return merged


def _worker(queue: Any, shard_id: str, root: str, backbones: list[str], options: dict[str, Any]) -> dict[str, str]:
    store = RunStore(root)
    use_staged_backbones(store, backbones)  # a fresh process: the parent's staged paths are not inherited
    return train_runs(_drain(queue), shard_id, store, options)


def _drain(queue: Any) -> Iterator[TrainConfig]:
    while True:
        try:
            yield queue.get_nowait()
        except Empty:
            return
