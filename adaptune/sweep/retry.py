"""How a sweep tries again after a failure it did not cause: one policy object, built once from the spec and the
environment where a shard starts (shard_runner) or a pipeline is compiled (pipelines.reproduction), and passed down
whole, beside the policy for records already stored (adaptune.sweep.retrain).

Two kinds of trying again, each its own field:
- a run's transient failure (out of memory on a shared device, network, storage: adaptune.sweep.transient) is
  retried inside its shard, after a wait doubling from `first_backoff_s`, up to `transient_failures` times over all
  attempts (counted in the store);
- a shard's pod that is lost (a spot node preempted, a node failing) is restarted by the pipeline (KFP's
  `set_retry`, `pod_restarts` times after `pod_backoff`), and resumes from the run store.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from adaptune.core import environment

BACKOFF_ENV = "ADAPTUNE_RETRY_BACKOFF_S"
DEFAULT_BACKOFF_S = environment.DEFAULTS.retry_backoff_s  # 30: the first wait; doubled each time, at most MAX_BACKOFF_S
MAX_BACKOFF_S = 600.0
POD_BACKOFF = "60s"  # KFP's wait before restarting a lost pod (Argo's retryStrategy backoff)


@dataclasses.dataclass(frozen=True)
class RetryPolicy:
    """How often and after how long a failure the sweep did not cause is tried again; the default tries nothing again."""

    transient_failures: int = 0
    pod_restarts: int = 0
    first_backoff_s: float = DEFAULT_BACKOFF_S
    max_backoff_s: float = MAX_BACKOFF_S
    pod_backoff: str = POD_BACKOFF

    @classmethod
    def for_spec(cls, spec: Any) -> RetryPolicy:
        """The spec's counts (`retries` inside a shard, `pod_retries` of its pod) and the environment's first wait."""
        return cls.with_counts(spec.retries, spec.pod_retries)

    @classmethod
    def with_counts(cls, transient_failures: int = 0, pod_restarts: int = 0) -> RetryPolicy:
        """These counts, and $ADAPTUNE_RETRY_BACKOFF_S's first wait (read here, once)."""
        return cls(transient_failures, pod_restarts, first_backoff_s=environment.settings().retry_backoff_s)

    def backoff_s(self, failures: int) -> float:
        """The wait before the next attempt after `failures` transient failures: doubling, at most max_backoff_s."""
        return min(self.first_backoff_s * 2 ** (failures - 1), self.max_backoff_s)
