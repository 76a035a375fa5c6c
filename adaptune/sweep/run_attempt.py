"""One run, at most once, in the run store: reuse its record, else take its lease, train it (retrying
transient failures with backoff, counted in the store), and publish its record once.

`train_runs` takes a list of runs in turn as one attempt; a run another attempt holds is left to the
end, then waited for (its record reused) or taken over once its lease expires.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from collections.abc import Callable, Iterable
from typing import Any

from adaptune.core import environment
from adaptune.fused.grouping import fused_groups, group_key, trains_alone_for_its_length
from adaptune.fused.settings import StepSettings
from adaptune.sweep.lease import Holder, Lease, LeaseWatch, current_lease, lease_owner, lease_seconds, new_owner, try_acquire
from adaptune.sweep.machine import load_trainer
from adaptune.sweep.retrain import RetrainPolicy
from adaptune.sweep.retry import RetryPolicy
from adaptune.sweep.store import CHECKPOINT_DIR, RECORD_FILE, RUNS_DIR, RunDir, RunStore
from adaptune.sweep.store_files import UnreadableFileError
from adaptune.sweep.transient import is_transient
from adaptune.train.config import TrainConfig
from adaptune.train.event_log import write_run_summary
from adaptune.train.record import failed_run_record, is_stale, one_line_reason, save_traceback, with_provenance


@dataclasses.dataclass(frozen=True)
class AttemptOptions:
    """How one attempt trains the runs it takes, passed down whole from the shard runner to each run."""

    data_dir: str | os.PathLike[str] | None = None  # the data mirror (None: found automatically, or the hub)
    policy: RetrainPolicy = dataclasses.field(default_factory=RetrainPolicy)  # which stored records to train again
    retry: RetryPolicy = dataclasses.field(default_factory=RetryPolicy)  # transient failures: how often, how long a wait
    progress: bool = False  # a progress bar per epoch
    settings: StepSettings = dataclasses.field(default_factory=StepSettings)  # how every step computes


def train_runs(configs: Iterable[TrainConfig], shard_id: str, store: RunStore, options: AttemptOptions,
               runs_per_group: int = 1) -> dict[str, str]:
    """Each run in turn, as one attempt (one owner), runs that can share a forward pass `runs_per_group`
    at a time (adaptune.train.group_loop); a run another attempt holds is left to the end, then waited
    for. Returns each run's outcome."""
    return train_groups(form_groups(list(configs), runs_per_group), shard_id, store, options)


def form_groups(configs: list[TrainConfig], runs_per_group: int) -> list[list[TrainConfig]]:
    """The shard's groups (adaptune.fused.grouping.fused_groups: runs with equal group keys, at most
    `runs_per_group` a group, fewer for longer steps); every other run alone. A stand-in trainer
    ($ADAPTUNE_TRAINER) trains runs alone."""
    if environment.settings().trainer:
        return [[config] for config in configs]
    return fused_groups(configs, runs_per_group)


def train_groups(groups: Iterable[list[TrainConfig]], shard_id: str, store: RunStore, options: AttemptOptions) -> dict[str, str]:
    """train_runs over groups already formed."""
    owner, watch = new_owner(), LeaseWatch()
    by_run: dict[str, str] = {}
    deferred = []
    for group in groups:
        if len(group) == 1 and not _graphed_alone(group[0], options.settings):
            outcomes = {group[0].run_id: run_in_store(group[0], store, options, wait=False, owner=owner, watch=watch)}
        else:
            outcomes = group_in_store(group, store, owner, options, watch=watch)
        for config in group:
            outcome = outcomes[config.run_id]
            if outcome == "leased":  # another attempt trains it now: train the rest first
                print(f"{shard_id}: {config.run_id} is being trained by another attempt; back to it at the end", flush=True)
                deferred.append(config)
                continue
            by_run[config.run_id] = outcome
            print(f"{shard_id}: {config.run_id} {outcome}" + (f" (in a group of {len(group)})" if len(group) > 1 else ""), flush=True)
    for config in deferred:
        by_run[config.run_id] = run_in_store(config, store, options, wait=True, owner=owner, watch=watch)
        print(f"{shard_id}: {config.run_id} {by_run[config.run_id]}", flush=True)
    return by_run


def _graphed_alone(config: TrainConfig, settings: StepSettings) -> bool:
    """Under step graphs (adaptune.fused.step_graphs) a groupable run without companions trains as a group of one, its
    step replayed as a CUDA graph, which outran the solo trainer's step on an H100 (bench/LOG.md, "Fused run groups");
    so does a run that trains the whole model, which no group shares. Not a run whose step keeps the GPU busy alone
    (grouping.LONG_STEP_TOKENS): the trainer's own step was the faster there."""
    if environment.settings().trainer or trains_alone_for_its_length(config):
        return False
    if group_key(config) is None:  # whole-model runs have keys too
        return False
    return settings.step_graphs


class _Unreadable(str):
    """A record file that cannot be read (its one-line reason): the run is "unreadable" until retrained
    under a policy retrying unreadable records, which sets the file aside (StoreFiles.set_aside) and trains the run again."""


def _stored_record(store: RunStore, run_id: str) -> dict[str, Any] | _Unreadable | None:
    try:
        return store.record(run_id)
    except UnreadableFileError as error:
        return _Unreadable(str(error))


def _reuse(record: dict[str, Any] | _Unreadable | None, policy: RetrainPolicy) -> str | None:
    """'reused', 'stale' or 'unreadable' where the store's record stands, None where the run must train: what
    the user asked to retrain, and nothing else (failed runs, unreadable records and stale ones each by their own flag)."""
    if record is None:
        return None
    if isinstance(record, _Unreadable):
        return None if policy.unreadable else "unreadable"
    if is_stale(record):
        return None if policy.stale else "stale"
    if record.get("status") == "failed" and policy.failed:
        return None
    return "reused"


def run_in_store(
    config: TrainConfig,
    store: RunStore,
    options: AttemptOptions = AttemptOptions(),
    wait: bool = True,
    owner: str | None = None,
    sleep: Callable[[float], None] = time.sleep,
    watch: LeaseWatch | None = None,
) -> str:
    """One run, at most once: 'reused' / 'stale' where the store's record stands, 'leased' (wait=False)
    where another attempt holds it, 'superseded' where ours expired and was taken over, else its status."""
    found = _stored_record(store, config.run_id)
    reused = _reuse(found, options.policy)
    if reused:
        if reused == "unreadable":
            print(f"{config.run_id}: {found}; retrain it with --retry-unreadable (RETRY_UNREADABLE=1), which keeps the file aside", flush=True)
        return reused
    lease = _take_lease(config.run_id, store, owner, wait, sleep, watch or LeaseWatch())
    if not isinstance(lease, Lease):
        return lease
    try:
        with lease.kept_alive():
            reused = _clear_for_training(config, store, options.policy)
            if reused:
                return reused
            record = _train_with_retries(config, store, options, sleep)
            return _publish(config, record, lease, store, options.data_dir)
    finally:
        lease.release()


def group_in_store(
    configs: list[TrainConfig],
    store: RunStore,
    owner: str,
    options: AttemptOptions = AttemptOptions(),
    sleep: Callable[[float], None] = time.sleep,
    watch: LeaseWatch | None = None,
) -> dict[str, str]:
    """run_in_store for a group (wait=False): each run's record reused or its lease taken, as alone;
    the runs leased train together (adaptune.train.group_loop.train_group), each published as alone."""
    outcomes: dict[str, str] = {}
    with contextlib.ExitStack() as leases:
        training = []
        for config in configs:
            found = _stored_record(store, config.run_id)
            reused = _reuse(found, options.policy)
            if reused:
                outcomes[config.run_id] = reused
                continue
            lease = _take_lease(config.run_id, store, owner, False, sleep, watch or LeaseWatch())
            if not isinstance(lease, Lease):
                outcomes[config.run_id] = lease
                continue
            leases.callback(lease.release)
            leases.enter_context(lease.kept_alive())
            reused = _clear_for_training(config, store, options.policy)
            if reused:
                outcomes[config.run_id] = reused
                continue
            training.append((config, lease))
        if training:
            records = _train_group_with_retries([config for config, _ in training], store, options, sleep)
            for (config, lease), record in zip(training, records, strict=True):
                outcomes[config.run_id] = _publish(config, record, lease, store, options.data_dir)
    return outcomes


def _clear_for_training(config: TrainConfig, store: RunStore, policy: RetrainPolicy) -> str | None:
    """Under the run's lease: its outcome where a record now stands (another attempt may have finished),
    else clear what would stop it training (an unreadable record set aside, a failed or stale one forgotten)."""
    existing = _stored_record(store, config.run_id)
    reused = _reuse(existing, policy)
    if reused:
        return reused
    if isinstance(existing, _Unreadable):
        kept = store.files.set_aside(RUNS_DIR, config.run_id, RECORD_FILE)
        print(f"{config.run_id}: {existing}; set aside as {kept}, training the run again", flush=True)
    elif existing is not None:
        store.forget(config.run_id)
        if is_stale(existing):
            store.remove_state(config.run_id)  # a state saved under the old scheme trained on other rows
    return None


def _publish(config: TrainConfig, record: dict[str, Any], lease: Lease, store: RunStore, data_dir: Any) -> str:
    """Publish the run's record once, if our lease still holds; returns the run's outcome."""
    with_provenance(record, data_dir)  # a trainer named by $ADAPTUNE_TRAINER may leave it to us
    if not lease.still_held() and not lease.reclaim():
        taken = current_lease(store, config.run_id)
        print(f"{config.run_id}: another attempt ({lease_owner(taken[1] if taken else None)}) took the run over while this one trained, "
              "its holder silent for a lease length or its folder deleted: that attempt's result stands, this one's is not published",
              flush=True)
        return "superseded"
    if record.get("checkpoint_dir") and not store.files.names(RUNS_DIR, config.run_id, CHECKPOINT_DIR):
        print(f"{config.run_id}: its folder in the run store was deleted while it trained and its checkpoint went with it: "
              "nothing published; the next submission trains it again", flush=True)
        return "lost"
    if not store.publish_record(record):
        return "reused"  # a record appeared that no lease guarded (a store written by an older adaptune)
    if record["status"] != "failed":
        store.remove_state(config.run_id)
    return record["status"]


def _take_lease(run_id: str, store: RunStore, owner: str | None, wait: bool, sleep: Callable[[float], None],
                watch: LeaseWatch) -> Lease | str:
    shown = None  # the holder the waiting line named: said again only when another holds the run
    while True:
        taken = try_acquire(store, run_id, owner, watch=watch)
        if isinstance(taken, Lease):
            return taken
        if not wait:
            return "leased"
        if (found := _stored_record(store, run_id)) is not None:
            return "unreadable" if isinstance(found, _Unreadable) else "reused"
        assert isinstance(taken, Holder)
        if taken.owner != shown:
            print(f"{run_id}: {taken.describe()}; waiting", flush=True)
            shown = taken.owner
        sleep(min(max(taken.expires_in, 1.0), lease_seconds() / 10, 60.0))
        if (found := _stored_record(store, run_id)) is not None:
            return "unreadable" if isinstance(found, _Unreadable) else "reused"


def _train_group_with_retries(configs: list[TrainConfig], store: RunStore, options: AttemptOptions,
                              sleep: Callable[[float], None]) -> list[dict[str, Any]]:
    """Runs that share their steps (adaptune.train.group_loop): a transient failure counts against every one.
    A group that runs out of memory trains as two halves, in turn, down to runs alone (each run resumes
    from what it saved): group sizes are chosen from memory measured on other steps, not this one's."""
    from adaptune.core.devices import is_out_of_memory
    from adaptune.train.group_loop import train_group

    def train(works: list[RunDir], part: list[TrainConfig] = configs) -> list[dict[str, Any]]:
        try:
            return train_group(part, [work.path for work in works], data_dir=options.data_dir, cache_dir=store.cache_dir(),
                               progress=options.progress, on_state_saved=[work.sync for work in works], write_record=False,
                               settings=options.settings)
        except Exception as error:
            if len(part) == 1 or not is_out_of_memory(error):
                raise
        half = len(part) // 2
        print(f"a group of {len(part)} ({part[0].run_id}, ...) ran out of memory: training it as groups of {half} and "
              f"{len(part) - half}", flush=True)
        return train(works[:half], part[:half]) + train(works[half:], part[half:])

    return _with_retries(configs, store, options.data_dir, options.retry, sleep, train)


def _train_with_retries(config: TrainConfig, store: RunStore, options: AttemptOptions, sleep: Callable[[float], None]) -> dict[str, Any]:
    trainer = load_trainer()

    def train(works: list[RunDir]) -> list[dict[str, Any]]:
        return [trainer(config, data_dir=options.data_dir, out_dir=works[0].path, cache_dir=store.cache_dir(), progress=options.progress,
                        on_state_saved=works[0].sync, write_record=False, settings=options.settings)]

    return _with_retries([config], store, options.data_dir, options.retry, sleep, train)[0]


def _with_retries(configs: list[TrainConfig], store: RunStore, data_dir: Any, retry: RetryPolicy,
                  sleep: Callable[[float], None], train: Callable[[list[RunDir]], list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """`train` in the runs' store directories until it returns their records; a transient failure is
    retried with the policy's backoff up to `retry.transient_failures` times (counted in the store, the highest count of the
    runs decides), any other failure, or one that persists, becomes each run's failed record."""
    who = configs[0].run_id if len(configs) == 1 else f"group of {len(configs)} ({configs[0].run_id}, ...)"
    while True:
        with contextlib.ExitStack() as dirs:
            works = [dirs.enter_context(store.run_dir(config.run_id)) for config in configs]
            try:
                records = train(works)
            except Exception as error:  # noqa: BLE001 -- every failure is either retried or recorded, never lost
                reason = one_line_reason(error)
                for work in works:
                    save_traceback(work.path, error)
                if is_transient(error):
                    failures = max(store.note_transient_failure(config.run_id, reason) for config in configs)
                    for work in works:
                        work.sync()
                    if failures <= retry.transient_failures:
                        delay = retry.backoff_s(failures)
                        print(f"{who}: transient failure {failures} of at most {retry.transient_failures} retried in {delay:.0f} s: {reason}",
                              flush=True)
                        sleep(delay)
                        continue
                    reason = f"transient failure persisted over {failures} attempts: {reason}"
                records = [failed_run_record(config, reason, data_dir) for config in configs]
                for work, record in zip(works, records, strict=True):
                    write_run_summary(work.path, record)  # the sweep's HParams view shows it failed
            for config, work, record in zip(configs, works, records, strict=True):
                if (work.path / CHECKPOINT_DIR).is_dir():
                    record["checkpoint_dir"] = store.files.url(RUNS_DIR, config.run_id, CHECKPOINT_DIR)
                work.sync()
            return records
