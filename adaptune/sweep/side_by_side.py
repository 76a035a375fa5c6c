"""Several runs of a shard side by side on one device, one spawned process each, from one queue: a small
model leaves a GPU idle between its kernel launches, which another run's launches fill. The runs'
leases share them out, so each is trained once, exactly as it would be alone."""

from __future__ import annotations

import concurrent.futures
import multiprocessing
from collections.abc import Iterator
from queue import Empty
from typing import Any

from adaptune.sweep.machine import use_staged_backbones
from adaptune.sweep.run_attempt import form_groups, train_groups
from adaptune.sweep.store import RunStore
from adaptune.train.config import TrainConfig

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
