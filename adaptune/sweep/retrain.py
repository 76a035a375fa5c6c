"""Which runs that the run store already holds are trained again: one policy object, built where a command or a
pipeline component starts and passed down whole (as Ray Tune's FailureConfig).

A record in the store is reused, unless the policy says otherwise for its kind:
- `failed`: a record whose status is failed is trained again (--retry-failed, RETRY_FAILED=1);
- `stale`: a record made under another data scheme (tasks.DATA_SCHEMES) is trained again (--retrain-stale,
  RETRAIN_STALE=1); without it such a run is "stale", neither reused nor retrained;
- `unreadable`: a record file that cannot be read is set aside and its run trained again (--retry-unreadable,
  RETRY_UNREADABLE=1); without it the run is "unreadable".

The three flags travel as loose booleans only where a spec or a command line needs primitives: the pipeline's
parameters and the train_shard component's inputs (`FLAGS`, `from_flags`, `as_flags`), and the CLIs' options.
"""

from __future__ import annotations

import dataclasses

# The flags' names as pipeline parameters and command-line options (--retry-failed, ...), in this order.
FLAGS = ("retry_failed", "retrain_stale", "retry_unreadable")


@dataclasses.dataclass(frozen=True)
class RetrainPolicy:
    """What to train again among the runs the store holds a record of; the default retrains none."""

    failed: bool = False
    stale: bool = False
    unreadable: bool = False

    @classmethod
    def from_flags(cls, retry_failed: bool = False, retrain_stale: bool = False, retry_unreadable: bool = False) -> RetrainPolicy:
        """The policy from its primitive form (a component's inputs, a command's options)."""
        return cls(failed=bool(retry_failed), stale=bool(retrain_stale), unreadable=bool(retry_unreadable))

    def as_flags(self) -> dict[str, bool]:
        """Its primitive form, the pipeline's parameters: {"retry_failed": ..., "retrain_stale": ..., "retry_unreadable": ...}."""
        return dict(zip(FLAGS, (self.failed, self.stale, self.unreadable), strict=True))
