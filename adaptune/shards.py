"""Train one shard of a plan: its runs one after another, each in the run store, each at most once.

For every run of the shard (adaptune.plan.Plan.shards):
- a record in the store is reused (a failed one too, unless `retry_failed`);
- otherwise the run trains in its store directory, resuming from a saved state if a previous
  attempt left one;
- a deterministic failure (non-finite loss, bad data, unsupported model, a bug) becomes a failed
  record, with the full traceback beside it, and the shard goes on;
- a transient failure (out of memory on a shared device, network or storage errors) is counted in
  the store and raised as TransientRunError, so the task fails and the orchestrator's retry
  resumes the shard; once a run has failed transiently more than `spec.retries` times it is
  recorded as failed instead, so one hopeless run cannot stop a sweep.
A preempted pod never reaches Python: its retry simply finds the saved state.
"""

from __future__ import annotations

import importlib
import os
from collections import Counter
from collections.abc import Callable
from typing import Any

from adaptune.config import TrainConfig
from adaptune.experiments import ExperimentSpec
from adaptune.files import write_json
from adaptune.plan import failed_run_record, plan
from adaptune.records import one_line_reason, save_traceback
from adaptune.store import CHECKPOINT_DIR, RECORD_FILE, RUNS_DIR, RunStore

TRAINER_ENV = "ADAPTUNE_TRAINER"  # "module:function" with train_and_evaluate's signature (dry runs of a DAG's shape)
# Exception class names (anywhere in the MRO or the cause chain) that mean "try again later".
TRANSIENT_NAMES = frozenset({
    "ConnectionError", "TimeoutError", "Timeout", "ReadTimeout", "ConnectTimeout", "ChunkedEncodingError",
    "RemoteDisconnected", "IncompleteRead", "ProtocolError", "ServerDisconnectedError", "ClientConnectionError",
    "ServiceUnavailable", "TooManyRequests", "InternalServerError", "GatewayTimeout", "BadGateway", "DeadlineExceeded",
    "OutOfMemoryError",
})


class TransientRunError(RuntimeError):
    """A run failed for a reason that may pass (see TRANSIENT_NAMES); retrying the shard resumes it."""


def is_transient(error: BaseException) -> bool:
    """Out of memory, network and storage-service errors, here or in the exception's causes."""
    from adaptune.devices import is_out_of_memory

    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if is_out_of_memory(current) or any(cls.__name__ in TRANSIENT_NAMES for cls in type(current).__mro__):
            return True
        current = current.__cause__ or current.__context__
    return False


def run_shard(
    spec: ExperimentSpec,
    shard_id: str,
    store: RunStore,
    data_dir: str | os.PathLike[str] | None = None,
    retry_failed: bool = False,
    progress: bool = False,
) -> Counter[str]:
    """Train every run of the shard that the store has no record of; returns counts by outcome
    (reused, ok, degenerate, failed). Raises TransientRunError after recording which run failed."""
    shard = plan(spec).shard(shard_id)
    outcomes: Counter[str] = Counter()
    for config in shard.runs:
        outcome = run_in_store(config, store, data_dir=data_dir, retry_failed=retry_failed,
                               max_transient_failures=spec.retries, progress=progress)
        outcomes[outcome] += 1
        print(f"{shard_id}: {config.run_id} {outcome}", flush=True)
    return outcomes


def run_in_store(
    config: TrainConfig,
    store: RunStore,
    data_dir: str | os.PathLike[str] | None = None,
    retry_failed: bool = False,
    max_transient_failures: int = 0,
    progress: bool = False,
) -> str:
    """One run, at most once: 'reused' when the store already holds its record, else its status."""
    existing = store.record(config.run_id)
    if existing is not None and (existing.get("status") != "failed" or not retry_failed):
        return "reused"
    if existing is not None:
        store.forget(config.run_id)
    trainer = load_trainer()
    cache_dir = store.cache_dir()
    with store.run_dir(config.run_id) as work:
        try:
            record = trainer(config, data_dir=data_dir, out_dir=work.path, cache_dir=cache_dir, progress=progress,
                             on_state_saved=work.sync)
        except Exception as error:  # noqa: BLE001 -- every failure is either retried or recorded, never lost
            reason = one_line_reason(error)
            save_traceback(work.path, error)
            if is_transient(error):
                failures = store.note_transient_failure(config.run_id, reason)
                if failures <= max_transient_failures:
                    work.sync()
                    raise TransientRunError(f"{config.run_id}: transient failure {failures} of at most "
                                            f"{max_transient_failures} retried: {reason}") from error
                reason = f"transient failure persisted over {failures} attempts: {reason}"
            record = failed_run_record(config, reason)
        if (work.path / CHECKPOINT_DIR).is_dir():
            record["checkpoint_dir"] = store.url(RUNS_DIR, config.run_id, CHECKPOINT_DIR)
        write_json(work.path / RECORD_FILE, record)
        work.sync()
    return record["status"]


def load_trainer() -> Callable[..., dict[str, Any]]:
    """adaptune.train.train_and_evaluate, or the function $ADAPTUNE_TRAINER names."""
    target = os.environ.get(TRAINER_ENV)
    if not target:
        from adaptune.train import train_and_evaluate

        return train_and_evaluate
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)

