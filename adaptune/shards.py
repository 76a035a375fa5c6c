"""Train one shard of a plan: its runs one after another (or several side by side on one GPU), each in
the run store, each at most once.

Before any run, the shard checks what every run needs from the machine: the accelerator it was
compiled for ($ADAPTUNE_DEVICE, set on GPU/TPU tasks: no silent fallback to the CPU) and a loadable
backbone (the copy staged in the store, `make stage-models`; else the hub). A missing one fails the
task with one line saying what to do, instead of recording every run as failed.

For every run of the shard (adaptune.plan.Plan.shards):
- a record in the store is reused (a failed one too, unless `retry_failed`); a record made under
  another data scheme (tasks.DATA_SCHEMES) is "stale": neither reused nor retrained, unless
  `retrain_stale`;
- otherwise the run's lease is taken (adaptune.lease): a run another attempt is training is left for
  the end of the shard, then waited for (its record is reused) or taken over once its lease expires;
- the run trains in its store directory, resuming from a saved state if a previous attempt left one;
- a transient failure (out of memory on a shared device, network, storage) is retried here, with
  exponential backoff, resuming from the saved state, up to `spec.retries` times per run over all
  attempts (counted in the store): on KFP the Argo compiler drops retries of ParallelFor tasks
  (kubeflow/pipelines#12389), so the orchestrator's retry is left for preemption;
- a deterministic failure (non-finite loss, bad data, unsupported model, a bug) becomes a failed
  record, with the full traceback beside it, and the shard goes on;
- the record, with its provenance, is published last and only once (RunStore.publish_record).
A preempted pod never reaches Python: its retry finds the saved state and, once the lease expires,
the run.
"""

from __future__ import annotations

import concurrent.futures
import errno
import importlib
import multiprocessing
import os
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from queue import Empty
from typing import Any

from adaptune.config import TrainConfig
from adaptune.experiments import ExperimentSpec
from adaptune.lease import Holder, Lease, lease_seconds, new_owner, try_acquire
from adaptune.plan import failed_run_record, plan
from adaptune.provenance import provenance
from adaptune.records import is_stale, one_line_reason, save_traceback
from adaptune.store import CHECKPOINT_DIR, RUNS_DIR, RunStore

TRAINER_ENV = "ADAPTUNE_TRAINER"  # "module:function" with train_and_evaluate's signature (dry runs of a DAG's shape)
BACKOFF_ENV = "ADAPTUNE_RETRY_BACKOFF_S"
RUNS_PER_DEVICE_ENV = "ADAPTUNE_RUNS_PER_DEVICE"
DEFAULT_BACKOFF_S = 30.0  # first wait after a transient failure; doubled each time, at most MAX_BACKOFF_S
MAX_BACKOFF_S = 600.0
# Exception class names (anywhere in the MRO or the cause chain) that mean "try again later": the
# requests/urllib3/http.client family, aiohttp (gcsfs), httpx (huggingface_hub), google-api-core.
TRANSIENT_NAMES = frozenset({
    "ConnectionError", "TimeoutError", "Timeout", "ReadTimeout", "ConnectTimeout", "ChunkedEncodingError",
    "RemoteDisconnected", "IncompleteRead", "ProtocolError", "ServerDisconnectedError", "ClientConnectionError",
    "ClientPayloadError", "ServerTimeoutError", "TransportError", "NetworkError", "RemoteProtocolError",
    "ReadError", "WriteError", "PoolTimeout", "ServiceUnavailable", "TooManyRequests", "InternalServerError",
    "GatewayTimeout", "BadGateway", "DeadlineExceeded", "RetryError", "OutOfMemoryError",
})
# OS errors of a storage mount (Cloud Storage FUSE answers EIO for a failed GCS call, ESTALE when a
# concurrent writer replaced the object) and of the network.
TRANSIENT_ERRNOS = frozenset({errno.EIO, errno.ESTALE, errno.ETIMEDOUT, errno.ECONNRESET, errno.ECONNABORTED,
                              errno.ECONNREFUSED, errno.ENETUNREACH, errno.EHOSTUNREACH, errno.EAGAIN})
TRANSIENT_HTTP_CODES = frozenset({408, 429, 500, 502, 503, 504})  # gcsfs HttpError.code, hub responses


class ShardEnvironmentError(RuntimeError):
    """The machine cannot train this shard (no accelerator, no backbone): the task fails, no run is recorded."""


def is_transient(error: BaseException) -> bool:
    """Out of memory, network and storage errors, here or in the exception's causes."""
    from adaptune.devices import is_out_of_memory

    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if is_out_of_memory(current) or any(cls.__name__ in TRANSIENT_NAMES for cls in type(current).__mro__):
            return True
        if isinstance(current, OSError) and current.errno in TRANSIENT_ERRNOS:
            return True
        if _http_status(current) in TRANSIENT_HTTP_CODES:
            return True
        current = current.__cause__ or current.__context__
    return False


def _http_status(error: BaseException) -> int | None:
    code = getattr(error, "code", None)
    if not isinstance(code, int):
        response = getattr(error, "response", None)
        code = getattr(response, "status_code", None)
    return code if isinstance(code, int) else None


def run_shard(
    spec: ExperimentSpec,
    shard_id: str,
    store: RunStore,
    data_dir: str | os.PathLike[str] | None = None,
    retry_failed: bool = False,
    progress: bool = False,
    retrain_stale: bool = False,
    enforce_deadline: bool = False,
    runs_at_once: int | None = None,
) -> Counter[str]:
    """Train every run of the shard that the store has no record of; returns counts by outcome
    (reused, stale, ok, degenerate, failed, superseded). With `enforce_deadline` (pipeline tasks) the
    process exits with status 124 past the shard's deadline (Plan.deadline_hours).

    `runs_at_once` (default: the accelerator's `runs_per_device`, or $ADAPTUNE_RUNS_PER_DEVICE) trains
    that many runs side by side on this machine's one device, one process each: a small model leaves a
    GPU idle between its kernel launches, which another run's launches fill. The runs' leases share them
    out, so each is trained once, exactly as it would be alone."""
    planned = plan(spec)
    shard = planned.shard(shard_id)
    if enforce_deadline:
        start_deadline(planned.deadline_hours(shard) * 3600, shard_id)
    backbones = {run.backbone for run in shard.runs}
    prepare_machine(store, backbones)
    options = dict(data_dir=data_dir, retry_failed=retry_failed, retrain_stale=retrain_stale,
                   max_transient_failures=spec.retries, progress=progress)
    workers = min(runs_at_once or runs_per_device(spec.accelerator), len(shard.runs))
    if workers > 1:
        print(f"{shard_id}: {workers} runs at a time on this device", flush=True)
        by_run = _train_side_by_side(list(shard.runs), shard_id, store, backbones, options, workers)
    else:
        by_run = train_runs(list(shard.runs), shard_id, store, options)
    outcomes = Counter(by_run.values())
    if outcomes["stale"]:
        print(f"{shard_id}: {outcomes['stale']} run(s) hold records from another data scheme; "
              "retrain them with --retrain-stale (make ... RETRAIN_STALE=1)", flush=True)
    return outcomes


def runs_per_device(accelerator: Any) -> int:
    value = os.environ.get(RUNS_PER_DEVICE_ENV) or getattr(accelerator, "runs_per_device", 1)
    try:
        count = int(value)
    except ValueError:
        count = 0
    if count < 1:
        raise ValueError(f"{RUNS_PER_DEVICE_ENV} / runs_per_device must be a whole number >= 1, got {value!r}")
    return count


def train_runs(configs: Iterable[TrainConfig], shard_id: str, store: RunStore, options: dict[str, Any]) -> dict[str, str]:
    """Each run in turn, as one attempt (one owner); a run another attempt holds is left to the end,
    then waited for. Returns each run's outcome."""
    owner = new_owner()
    by_run: dict[str, str] = {}
    deferred = []
    for config in configs:
        outcome = run_in_store(config, store, wait=False, owner=owner, **options)
        if outcome == "leased":  # another attempt trains it now: train the rest first
            print(f"{shard_id}: {config.run_id} is being trained by another attempt; back to it at the end", flush=True)
            deferred.append(config)
            continue
        by_run[config.run_id] = outcome
        print(f"{shard_id}: {config.run_id} {outcome}", flush=True)
    for config in deferred:
        by_run[config.run_id] = run_in_store(config, store, wait=True, owner=owner, **options)
        print(f"{shard_id}: {config.run_id} {by_run[config.run_id]}", flush=True)
    return by_run


def _train_side_by_side(configs: list[TrainConfig], shard_id: str, store: RunStore, backbones: set[str],
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


def prepare_machine(store: RunStore, backbones: Iterable[str]) -> None:
    """Check the accelerator the task asked for and make every backbone loadable, before any run."""
    from adaptune.backbone import BackboneError, check_backbone
    from adaptune.devices import pick_device

    try:
        device = pick_device()  # $ADAPTUNE_DEVICE=cuda|xla on accelerator tasks: raises instead of using the CPU
    except RuntimeError as error:
        raise ShardEnvironmentError(f"{error}. This task was compiled for that accelerator: check the node's driver "
                                    "(nvidia-smi; README, 'Before your first submission')") from None
    print(f"device: {device.name}", flush=True)
    for name in sorted(set(backbones)):
        staged = use_staged_backbones(store, [name])
        if os.environ.get(TRAINER_ENV):
            continue  # a stand-in trainer (a dry run of the DAG's shape) loads no weights
        try:
            check_backbone(name)
        except BackboneError as error:
            hint = "" if staged else f"; stage its weights once with `make stage-models RUNS_ROOT={store.root}` so pods load them from the store"
            raise ShardEnvironmentError(f"{error}{hint}") from None


def use_staged_backbones(store: RunStore, backbones: Iterable[str]) -> list[str]:
    """Load each backbone staged in the store (models/<name>) from there; returns the names staged."""
    from adaptune.backbone import use_staged_backbone

    staged = []
    for name in backbones:
        path = store.staged_backbone(name)
        if path is not None:
            use_staged_backbone(name, path)
            print(f"backbone {name}: the copy staged in {store.url('models', name)}", flush=True)
            staged.append(name)
    return staged


def _reuse(record: dict[str, Any] | None, retry_failed: bool, retrain_stale: bool) -> str | None:
    """'reused' or 'stale' where the store's record stands, None where the run must train."""
    if record is None:
        return None
    if is_stale(record):
        return None if retrain_stale else "stale"
    if record.get("status") == "failed" and retry_failed:
        return None
    return "reused"


def run_in_store(
    config: TrainConfig,
    store: RunStore,
    data_dir: str | os.PathLike[str] | None = None,
    retry_failed: bool = False,
    max_transient_failures: int = 0,
    progress: bool = False,
    retrain_stale: bool = False,
    wait: bool = True,
    owner: str | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> str:
    """One run, at most once: 'reused' / 'stale' where the store's record stands, 'leased' (wait=False)
    where another attempt holds it, 'superseded' where ours expired and was taken over, else its status."""
    reused = _reuse(store.record(config.run_id), retry_failed, retrain_stale)
    if reused:
        return reused
    lease = _take_lease(config.run_id, store, owner, wait, sleep)
    if not isinstance(lease, Lease):
        return lease
    try:
        with lease.kept_alive():
            existing = store.record(config.run_id)  # read again under the lease: another attempt may have finished
            reused = _reuse(existing, retry_failed, retrain_stale)
            if reused:
                return reused
            if existing is not None:
                store.forget(config.run_id)
                if is_stale(existing):
                    store.remove_state(config.run_id)  # a state saved under the old scheme trained on other rows
            record = _train_with_retries(config, store, data_dir, max_transient_failures, progress, sleep)
            record["provenance"] = provenance(config.task, data_dir)
            if not lease.still_held():
                print(f"{config.run_id}: our lease expired and another attempt took the run over; its result stands", flush=True)
                return "superseded"
            if not store.publish_record(record):
                return "reused"  # a record appeared that no lease guarded (a store written by an older adaptune)
            if record["status"] != "failed":
                store.remove_state(config.run_id)
    finally:
        lease.release()
    return record["status"]


def _take_lease(run_id: str, store: RunStore, owner: str | None, wait: bool, sleep: Callable[[float], None]) -> Lease | str:
    while True:
        taken = try_acquire(store, run_id, owner)
        if isinstance(taken, Lease):
            return taken
        if not wait:
            return "leased"
        if store.record(run_id) is not None:
            return "reused"
        assert isinstance(taken, Holder)
        print(f"{run_id}: {taken.describe()}; waiting", flush=True)
        sleep(min(max(taken.expires_at - time.time(), 1.0), lease_seconds() / 10, 60.0))
        if store.record(run_id) is not None:
            return "reused"


def _train_with_retries(config: TrainConfig, store: RunStore, data_dir: Any, max_transient_failures: int, progress: bool,
                        sleep: Callable[[float], None]) -> dict[str, Any]:
    trainer = load_trainer()
    base = float(os.environ.get(BACKOFF_ENV) or DEFAULT_BACKOFF_S)
    while True:
        with store.run_dir(config.run_id) as work:
            try:
                record = trainer(config, data_dir=data_dir, out_dir=work.path, cache_dir=store.cache_dir(), progress=progress,
                                 on_state_saved=work.sync, write_record=False)
            except Exception as error:  # noqa: BLE001 -- every failure is either retried or recorded, never lost
                reason = one_line_reason(error)
                save_traceback(work.path, error)
                if is_transient(error):
                    failures = store.note_transient_failure(config.run_id, reason)
                    work.sync()
                    if failures <= max_transient_failures:
                        delay = min(base * 2 ** (failures - 1), MAX_BACKOFF_S)
                        print(f"{config.run_id}: transient failure {failures} of at most {max_transient_failures} "
                              f"retried in {delay:.0f} s: {reason}", flush=True)
                        sleep(delay)
                        continue
                    reason = f"transient failure persisted over {failures} attempts: {reason}"
                record = failed_run_record(config, reason)
            if (work.path / CHECKPOINT_DIR).is_dir():
                record["checkpoint_dir"] = store.url(RUNS_DIR, config.run_id, CHECKPOINT_DIR)
            work.sync()
            return record


def load_trainer() -> Callable[..., dict[str, Any]]:
    """adaptune.train.train_and_evaluate, or the function $ADAPTUNE_TRAINER names."""
    target = os.environ.get(TRAINER_ENV)
    if not target:
        from adaptune.train import train_and_evaluate

        return train_and_evaluate
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)
