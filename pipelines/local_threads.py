"""How a local run shares this machine's cores among the components kfp.local starts.

kfp.local runs each component as a process of its own and at most two ParallelFor iterations at once. A shard gets
the cores over the shards that actually run at once (a one-shard sweep gets them all); the steps that run alone
(prepare_data, plan_shards, ablate_runs, aggregate, report) get every core. The user's own OMP_NUM_THREADS, where
set, is kept for every component. Measured: bench/peer.json (a one-shard sweep on 2 threads against 1).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping

from adaptune.core.errors import UserError
from adaptune.sweep.plan import Plan

# kfp 2.17's local ParallelExecutor caps a ParallelFor at two iterations at once (conservative_max), whatever the
# pipeline's parallelism says.
KFP_LOCAL_ITERATIONS_AT_ONCE = 2
THREADS_ENV = "OMP_NUM_THREADS"  # read once by torch (and oneDNN) at import, in each component's process
# Hugging Face's fast tokenizers batch on threads of their own unless this says no; pipelines.local says no for every
# component (a process that forks after tokenizing would warn or hang), and a step that runs alone with more than one
# core says yes: the preparation step tokenizes every task before any run, and forks nothing.
TOKENIZER_THREADS_ENV = "TOKENIZERS_PARALLELISM"


class ThreadCountError(UserError, ValueError):
    """A thread count this machine cannot hold."""


def machine_cores() -> int:
    """The cores this process may run on (its CPU affinity: a container's or taskset's limit, not the host's)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


@dataclasses.dataclass(frozen=True)
class CoreShare:
    """Threads per component of one local run: `shard_threads` for each train_shard, `step_threads` for the rest."""

    cores: int
    shards_at_once: int
    shard_threads: int
    step_threads: int
    user_set: bool = False  # the user's OMP_NUM_THREADS, kept for every component
    tokenizer_threads_set: bool = False  # the user's TOKENIZERS_PARALLELISM, kept for every component

    @classmethod
    def for_plan(cls, planned: Plan, environ: Mapping[str, str] = os.environ, cores: int | None = None) -> CoreShare:
        cores = cores or machine_cores()
        at_once = max(1, min(planned.spec.parallelism, len(planned.shards), KFP_LOCAL_ITERATIONS_AT_ONCE))
        asked, tokenizer_set = environ.get(THREADS_ENV, "").strip(), bool(environ.get(TOKENIZER_THREADS_ENV))
        if asked:
            threads = _checked_threads(asked, cores)
            return cls(cores, at_once, threads, threads, user_set=True, tokenizer_threads_set=tokenizer_set)
        return cls(cores, at_once, max(1, cores // at_once), cores, tokenizer_threads_set=tokenizer_set)

    def environment(self, shard: bool) -> dict[str, str]:
        """The thread variables of one component: a shard's or a step's that runs alone."""
        threads = self.shard_threads if shard else self.step_threads
        tokenizer = {} if self.tokenizer_threads_set or shard or threads < 2 else {TOKENIZER_THREADS_ENV: "true"}
        return {THREADS_ENV: str(threads), **tokenizer}

    def line(self) -> str:
        """What the user is told before the DAG starts."""
        if self.user_set:
            return (f"threads: {self.shard_threads} per component ({THREADS_ENV} as set), {self.shards_at_once} shard(s) "
                    f"at once on {self.cores} cores")
        return (f"threads: {self.shard_threads} per shard, {self.shards_at_once} shard(s) at once on {self.cores} cores; "
                f"{self.step_threads} for the other steps (set {THREADS_ENV} to choose)")


def _checked_threads(asked: str, cores: int) -> int:
    try:
        threads = int(asked)
    except ValueError:
        threads = 0
    if not 1 <= threads <= cores:
        raise ThreadCountError(f"{THREADS_ENV}={asked!r}: this machine runs at most {cores} threads at once; set a whole "
                               f"number from 1 to {cores}, or unset it (each shard then gets the cores over the shards "
                               "that run at once)")
    return threads
