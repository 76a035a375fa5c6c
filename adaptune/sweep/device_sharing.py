"""How a shard shares its device: runs fused into one forward pass (`runs_per_group`), the accelerator preset's
setting unless its environment variable overrides it. Torch-free, so that planning can price what the runner will do.
(Runs side by side in separate processes left on 2026-11-28: on an H100 four were no faster than one at a time,
bench/README.md.)"""

from __future__ import annotations

from typing import Any

from adaptune.core import environment
from adaptune.fused.settings import run_count

RUNS_PER_GROUP_ENV = "ADAPTUNE_RUNS_PER_GROUP"


def runs_per_group(accelerator: Any) -> int:
    """Runs fused into one forward pass (adaptune.train.group_loop): the accelerator's setting, or the env's."""
    return _count(RUNS_PER_GROUP_ENV, "runs_per_group", accelerator)


def _count(env: str, field: str, accelerator: Any) -> int:
    """The environment's count where it sets one (a bad one is the registry's line), else the accelerator's."""
    return environment.read(env) or run_count(f"{env} / {field}", getattr(accelerator, field, 1))
