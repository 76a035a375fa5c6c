"""Checks of one run's configuration that need no data and no weights: run before anything is
created, so that a bad configuration leaves nothing on disk (`python -m adaptune train`, and any
caller that wants the same refusal before a run directory exists).

Cheap checks come first (task, numbers), then the method (imports torch), then the backbone (reads
its config only; see adaptune.model.backbone.check_backbone).
"""

from __future__ import annotations

import math
from typing import Any

from adaptune.core.errors import UserError
from adaptune.data.tasks import get_task
from adaptune.train.config import TrainConfig

MAX_SEED = 2**32 - 1  # numpy's seed range, which transformers.set_seed also seeds


class ConfigError(UserError, ValueError):
    """A run configuration that cannot run; the message (one line) names the field and what to do."""


def number_problems(
    *,
    lr: Any = 3e-4,
    epochs: Any = 1,
    batch_size: Any = 1,
    max_length: Any = 128,
    seed: Any = 0,
    max_train_examples: Any = None,
    max_eval_examples: Any = None,
    checkpoint_every_steps: Any = None,
    warmup_fraction: Any = 0.1,
    weight_decay: Any = 0.0,
    max_grad_norm: Any = 1.0,
) -> list[str]:
    """What is wrong with a run's numbers, one clause each (empty when nothing is)."""
    problems = []
    if not _is_number(lr) or not math.isfinite(lr) or lr <= 0:
        problems.append(f"lr must be a finite number > 0, got {lr!r} (the paper's grid: 1e-4 .. 3e-3 for adapters)")
    for name, value, least in (("epochs", epochs, 1), ("batch_size", batch_size, 1), ("max_length", max_length, 1)):
        if not _is_whole(value) or value < least:
            problems.append(f"{name} must be a whole number >= {least}, got {value!r}")
    if not _is_whole(seed) or not 0 <= seed <= MAX_SEED:
        problems.append(f"seed must be a whole number in 0..{MAX_SEED}, got {seed!r}")
    for name, value in (("max_train_examples", max_train_examples), ("max_eval_examples", max_eval_examples),
                        ("checkpoint_every_steps", checkpoint_every_steps)):
        if value is not None and (not _is_whole(value) or value < 1):
            problems.append(f"{name} must be a whole number >= 1 (or unset), got {value!r}")
    if not _is_number(warmup_fraction) or not 0 <= warmup_fraction < 1:
        problems.append(f"warmup_fraction must be in [0, 1), got {warmup_fraction!r}")
    if not _is_number(weight_decay) or not math.isfinite(weight_decay) or weight_decay < 0:
        problems.append(f"weight_decay must be a finite number >= 0, got {weight_decay!r}")
    if not _is_number(max_grad_norm) or not math.isfinite(max_grad_norm) or max_grad_norm <= 0:
        problems.append(f"max_grad_norm must be a finite number > 0, got {max_grad_norm!r}")
    return problems


def check_train_config(config: TrainConfig, backbone: bool = True) -> Any:
    """Refuse a configuration that cannot run, before any run directory, data or weights.

    Raises UnknownTaskError (unknown task), ConfigError (numbers, method, top_k deeper than the
    backbone) or adaptune.model.backbone.BackboneError (missing path, unreachable hub, unsupported model).
    With `backbone=False` the backbone is not looked at. Returns the backbone's BackboneInfo (or None).
    """
    task = get_task(config.task)
    problems = number_problems(
        lr=config.lr, epochs=config.epochs, batch_size=config.batch_size, max_length=config.max_length, seed=config.seed,
        max_train_examples=config.max_train_examples, max_eval_examples=config.max_eval_examples,
        checkpoint_every_steps=config.checkpoint_every_steps, warmup_fraction=config.warmup_fraction,
        weight_decay=config.weight_decay, max_grad_norm=config.max_grad_norm,
    )
    if problems:
        raise ConfigError(f"{task.name} run: " + "; ".join(problems))
    method = check_method(config.method)
    if not backbone:
        return None
    from adaptune.model.backbone import check_backbone

    info = check_backbone(config.backbone)
    k = getattr(method, "k", None)
    if method.name == "top_k" and k is not None and k > info.num_layers:
        raise ConfigError(
            f"top_k k={k} exceeds the {info.num_layers} Transformer layers of backbone {info.name!r}: choose k in 1..{info.num_layers}"
        )
    from adaptune.model.methods import BackboneLayout, backbone_problem

    problem = backbone_problem(method, BackboneLayout(name=info.name, num_layers=info.num_layers, module_types=info.module_types))
    if problem:
        raise ConfigError(problem)
    return info


def check_method(method: dict[str, Any]) -> Any:
    """The method config a method dict describes; ConfigError (one line) when it names no known method or a bad field."""
    from adaptune.model.methods import method_from_dict

    try:
        return method_from_dict(dict(method))
    except (ValueError, TypeError) as error:
        raise ConfigError(f"method {method!r}: {error}") from None


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_whole(value: Any) -> bool:
    return _is_number(value) and math.isfinite(value) and float(value).is_integer()
