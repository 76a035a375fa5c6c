"""KFP lightweight components wrapping adaptune: prepare_data, plan_shards, train_shard, ablate_runs, aggregate, report.

`make_components(family)` builds them with the project's images (`components.images.image_for`):
train_shard and ablate_runs run on the experiment's accelerator image, the light steps on the CPU one.
The images already hold adaptune and kfp (requirements.lock), so nothing is pip-installed at run time.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from kfp import dsl

from components import steps
from components.images import image_for


@dataclasses.dataclass(frozen=True)
class Components:
    prepare_data: Any
    plan_shards: Any
    train_shard: Any
    ablate_runs: Any
    aggregate: Any
    report: Any


def _component(func: Callable[..., Any], family: str) -> Any:
    return dsl.component(func, base_image=image_for(family), install_kfp_package=False)


def make_components(accelerator_family: str = "cpu") -> Components:
    """The six components; the heavy two use `accelerator_family`'s image ("cpu", "gpu" or "tpu")."""
    return Components(
        prepare_data=_component(steps.prepare_data, "cpu"),
        plan_shards=_component(steps.plan_shards, "cpu"),
        train_shard=_component(steps.train_shard, accelerator_family),
        ablate_runs=_component(steps.ablate_runs, accelerator_family),
        aggregate=_component(steps.aggregate, "cpu"),
        report=_component(steps.report, "cpu"),
    )
