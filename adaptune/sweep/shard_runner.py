"""Train one shard of a plan: its runs one after another (or several side by side on one GPU), each in
the run store, each at most once.

Before any run, the shard checks what every run needs from the machine: the accelerator it was
compiled for ($ADAPTUNE_DEVICE, set on GPU/TPU tasks: no silent fallback to the CPU) and a loadable
backbone (the copy staged in the store, `make stage-models`; else the hub). A missing one fails the
task with one line saying what to do, instead of recording every run as failed.

For every run of the shard (adaptune.sweep.plan.Plan.shards):
- a record in the store is reused (a failed one too, unless the retrain policy's `failed`; one that cannot be
  read is left alone, unless its `unreadable`, which sets the file aside); a record made under
  another data scheme (tasks.DATA_SCHEMES) is "stale": neither reused nor retrained, unless its
  `stale` (adaptune.sweep.retrain.RetrainPolicy);
- otherwise the run's lease is taken (adaptune.sweep.lease): a run another attempt is training is left for
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

import os
from collections import Counter

from adaptune.data.tasks import scored_companions
from adaptune.fused.settings import StepSettings
from adaptune.sweep.data_prep import readable_data_dir
from adaptune.sweep.device_sharing import RUNS_PER_GROUP_ENV, runs_per_group  # noqa: F401
from adaptune.sweep.machine import TRAINER_ENV, ShardEnvironmentError, prepare_machine, start_deadline  # noqa: F401 (the shard's names)
from adaptune.sweep.plan import plan
from adaptune.sweep.retrain import RetrainPolicy
from adaptune.sweep.retry import BACKOFF_ENV, RetryPolicy  # noqa: F401 (the retry policy's variable)
from adaptune.sweep.run_attempt import AttemptOptions, run_in_store, train_runs  # noqa: F401 (one run in the store)
from adaptune.sweep.spec import ExperimentSpec
from adaptune.sweep.store import RunStore
from adaptune.sweep.transient import is_transient  # noqa: F401 (the retry rule's name)


def run_shard(
    spec: ExperimentSpec,
    shard_id: str,
    store: RunStore,
    data_dir: str | os.PathLike[str] | None = None,
    policy: RetrainPolicy = RetrainPolicy(),
    progress: bool = False,
    enforce_deadline: bool = False,
    group_size: int | None = None,
) -> Counter[str]:
    """Train every run of the shard that the store has no record of; returns counts by outcome
    (reused, stale, unreadable, ok, degenerate, failed, superseded, lost). With `enforce_deadline` (pipeline tasks) the
    process exits with status 124 past the shard's deadline (Plan.deadline_hours)."""
    store.require_writable()
    planned = plan(spec)
    shard = planned.shard(shard_id)
    if enforce_deadline:
        start_deadline(planned.deadline_hours(shard) * 3600, shard_id)
    backbones = {run.backbone for run in shard.runs}
    device = prepare_machine(store, backbones)
    # The data the preparation step wrote for this shard's tasks (MNLI-mm's with MNLI), on this machine's disk.
    data_dir = readable_data_dir(store, data_dir, {name for run in shard.runs for name in (run.task, *scored_companions(run.task))})
    # How every step of the shard computes: the accelerator preset's, under the task's or user's own variables.
    settings = StepSettings.from_environment(preset=spec.accelerator.step_settings)
    options = AttemptOptions(data_dir=data_dir, policy=policy, retry=RetryPolicy.for_spec(spec), progress=progress, settings=settings)
    fused = group_size or runs_per_group(spec.accelerator, device)
    by_run = train_runs(list(shard.runs), shard_id, store, options, fused)
    outcomes = Counter(by_run.values())
    if outcomes["stale"]:
        print(f"{shard_id}: {outcomes['stale']} run(s) hold records from another data scheme; "
              "retrain them with --retrain-stale (make ... RETRAIN_STALE=1)", flush=True)
    return outcomes
