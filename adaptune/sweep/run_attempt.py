"""One run, at most once, in the run store: reuse its record, else take its lease, train it (retrying
transient failures with backoff, counted in the store), and publish its record once.

`train_runs` takes a list of runs in turn as one attempt; a run another attempt holds is left to the
end, then waited for (its record reused) or taken over once its lease expires.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from typing import Any

from adaptune.sweep.lease import Holder, Lease, lease_seconds, new_owner, try_acquire
from adaptune.sweep.machine import load_trainer
from adaptune.sweep.store import CHECKPOINT_DIR, RECORD_FILE, RUNS_DIR, RunStore, UnreadableFileError
from adaptune.sweep.transient import backoff_s, is_transient
from adaptune.train.config import TrainConfig
from adaptune.train.record import failed_run_record, is_stale, one_line_reason, save_traceback, with_provenance


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


class _Unreadable(str):
    """A record file that cannot be read (its one-line reason): the run is "unreadable" until retrained
    with retry_failed, which sets the file aside (RunStore.set_aside) and trains the run again."""


def _stored_record(store: RunStore, run_id: str) -> dict[str, Any] | _Unreadable | None:
    try:
        return store.record(run_id)
    except UnreadableFileError as error:
        return _Unreadable(str(error))


def _reuse(record: dict[str, Any] | _Unreadable | None, retry_failed: bool, retrain_stale: bool) -> str | None:
    """'reused', 'stale' or 'unreadable' where the store's record stands, None where the run must train."""
    if record is None:
        return None
    if isinstance(record, _Unreadable):
        return None if retry_failed else "unreadable"
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
    found = _stored_record(store, config.run_id)
    reused = _reuse(found, retry_failed, retrain_stale)
    if reused:
        if reused == "unreadable":
            print(f"{config.run_id}: {found}; retrain it with --retry-failed (RETRY_FAILED=1), which keeps the file aside", flush=True)
        return reused
    lease = _take_lease(config.run_id, store, owner, wait, sleep)
    if not isinstance(lease, Lease):
        return lease
    try:
        with lease.kept_alive():
            existing = _stored_record(store, config.run_id)  # read again under the lease: another attempt may have finished
            reused = _reuse(existing, retry_failed, retrain_stale)
            if reused:
                return reused
            if isinstance(existing, _Unreadable):
                kept = store.set_aside(RUNS_DIR, config.run_id, RECORD_FILE)
                print(f"{config.run_id}: {existing}; set aside as {kept}, training the run again", flush=True)
            elif existing is not None:
                store.forget(config.run_id)
                if is_stale(existing):
                    store.remove_state(config.run_id)  # a state saved under the old scheme trained on other rows
            record = _train_with_retries(config, store, data_dir, max_transient_failures, progress, sleep)
            with_provenance(record, data_dir)  # a trainer named by $ADAPTUNE_TRAINER may leave it to us
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
        if (found := _stored_record(store, run_id)) is not None:
            return "unreadable" if isinstance(found, _Unreadable) else "reused"
        assert isinstance(taken, Holder)
        print(f"{run_id}: {taken.describe()}; waiting", flush=True)
        sleep(min(max(taken.expires_at - time.time(), 1.0), lease_seconds() / 10, 60.0))
        if (found := _stored_record(store, run_id)) is not None:
            return "unreadable" if isinstance(found, _Unreadable) else "reused"


def _train_with_retries(config: TrainConfig, store: RunStore, data_dir: Any, max_transient_failures: int, progress: bool,
                        sleep: Callable[[float], None]) -> dict[str, Any]:
    trainer = load_trainer()
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
                        delay = backoff_s(failures)
                        print(f"{config.run_id}: transient failure {failures} of at most {max_transient_failures} "
                              f"retried in {delay:.0f} s: {reason}", flush=True)
                        sleep(delay)
                        continue
                    reason = f"transient failure persisted over {failures} attempts: {reason}"
                record = failed_run_record(config, reason, data_dir)
            if (work.path / CHECKPOINT_DIR).is_dir():
                record["checkpoint_dir"] = store.url(RUNS_DIR, config.run_id, CHECKPOINT_DIR)
            work.sync()
            return record
