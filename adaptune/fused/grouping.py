"""Which runs can train as one fused group (adaptune.train.group_loop), without importing torch, so
that planning and pricing can ask too: the runs of one task and method whose steps have the same
shapes and count, differing only in learning rate, seed and init std."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Protocol, TypeVar

from adaptune.core.backbones import BackboneError
from adaptune.model.layouts import backbone_layers


class RunConfig(Protocol):
    """What grouping reads of a run's config (adaptune.train.config.TrainConfig, a layer above this one): read-only
    members, which a frozen dataclass's fields match."""

    @property
    def method(self) -> dict[str, Any]: ...
    @property
    def backbone(self) -> str: ...
    @property
    def batch_size(self) -> int: ...
    @property
    def max_length(self) -> int: ...

    def to_dict(self) -> dict[str, Any]: ...


Config = TypeVar("Config", bound=RunConfig)

# Methods whose trained tensors adaptune.fused.run_groups splits by run: small tensors beside a frozen
# backbone, or (top_k) whole top layers, stacked per run as HFTA does, under a frozen bottom. Not the head alone:
# it trains as a probe on features computed once (adaptune.train.probe), leaving a group nothing to share.
GROUPABLE_METHODS = frozenset({"adapters", "pfeiffer", "layernorm", "lora", "ia3", "top_k"})
# The method that trains as a probe on features computed once, on every task but a span task, whose head reads every
# token (adaptune.train.probe).
PROBE_METHOD = "head"
# What may differ between the runs of a group: nothing else changes a step's shapes or count.
_FREE_FIELDS = frozenset({"lr", "seed", "experiment", "checkpoint_every_steps"})
_FREE_METHOD_FIELDS = frozenset({"init_std"})
# An accelerator's runs_per_group is chosen from memory measured at batch 32 of up to 128 tokens.
REFERENCE_STEP_TOKENS = 32 * 128
# A step of this many tokens keeps a GPU busy alone, so its runs train alone: BERT-large adapters at SQuAD's 384
# tokens ran slower per run in a group of 2 than alone (bench/LOG.md, "Figures moved out of the code's comments").
LONG_STEP_TOKENS = 3 * REFERENCE_STEP_TOKENS
# Runs that train the whole model (nothing frozen to share) train one a group: stacking whole models, as HFTA does,
# did not pay on an H100 (bench/LOG.md, "the options that left"); a group of one is replayed
# as step graphs where the step-graph step runs.
WHOLE_MODEL_RUNS_PER_GROUP = 1


def trains_as_probe(method: dict[str, Any], task_kind: str) -> bool:
    """Whether a run of this method on a task of this kind trains as a probe (adaptune.train.probe): its head alone, on
    the frozen backbone's features computed once (a classification or regression head on the pooled output)."""
    return method.get("name") == PROBE_METHOD and task_kind != "span"


def group_key(config: RunConfig) -> tuple | None:
    """Runs with equal keys can train as one group; None for a run whose method no group splits by run. Runs
    that train the whole model (full fine-tuning, top_k over every layer: nothing is frozen to share) have keys,
    as HFTA stacks whole models, but a group takes at most WHOLE_MODEL_RUNS_PER_GROUP of them."""
    if config.method.get("name") not in GROUPABLE_METHODS and not trains_whole_model(config):
        return None
    fields = tuple(sorted((name, str(value)) for name, value in config.to_dict().items() if name not in _FREE_FIELDS and name != "method"))
    method = tuple(sorted((name, str(value)) for name, value in config.method.items() if name not in _FREE_METHOD_FIELDS))
    return fields + method


def group_capacity(config: RunConfig, runs_per_group: int) -> int:
    """How many runs like this one a group takes: `runs_per_group` at the reference step's tokens, fewer
    where a step holds more (a group's memory grows with its rows x tokens), one from LONG_STEP_TOKENS
    (SQuAD's 384 tokens at batch 32); at most WHOLE_MODEL_RUNS_PER_GROUP for a run that trains the whole model."""
    if trains_alone_for_its_length(config):
        return 1
    if trains_whole_model(config):
        runs_per_group = min(runs_per_group, WHOLE_MODEL_RUNS_PER_GROUP)
    return max(1, min(runs_per_group, runs_per_group * REFERENCE_STEP_TOKENS // (config.batch_size * config.max_length)))


def fused_groups(configs: Sequence[Config], runs_per_group: int) -> list[list[Config]]:
    """The groups these runs train in: the runs of each group key (in order of first appearance) in as few
    groups as group_capacity allows, of sizes that differ by at most one (9 runs at 8 a group: 5 and 4, not 8
    and one alone, which pays a whole launch-bound step for itself); every other run alone. Groups come in the
    order of their first runs. The plan packs shards from these groups and the shard runner forms them again from a
    shard's runs, so both find the same ones."""
    if runs_per_group <= 1:
        return [[config] for config in configs]
    by_key: dict[tuple, list[int]] = {}
    alone: list[int] = []
    for index, config in enumerate(configs):
        key = group_key(config)
        (alone if key is None else by_key.setdefault(key, [])).append(index)
    groups = [[index] for index in alone]
    for indexes in by_key.values():
        capacity = group_capacity(configs[indexes[0]], runs_per_group)
        count = math.ceil(len(indexes) / capacity)
        size, larger = divmod(len(indexes), count)
        start = 0
        for position in range(count):
            end = start + size + (position < larger)
            groups.append(indexes[start:end])
            start = end
    groups.sort(key=lambda group: group[0])
    return [[configs[index] for index in group] for group in groups]


def trains_alone_for_its_length(config: RunConfig) -> bool:
    """Whether a run's step holds LONG_STEP_TOKENS or more: it keeps a GPU busy alone, in the trainer's own step."""
    return config.batch_size * config.max_length >= LONG_STEP_TOKENS


def trains_whole_model(config: RunConfig) -> bool:
    """Full fine-tuning, or top_k over every layer: runs that share no frozen part, and train one a group unless
    WHOLE_MODEL_RUNS_PER_GROUP says otherwise: a group of one where the step-graph step replays it (adaptune.sweep.run_attempt),
    else alone."""
    name = config.method.get("name")
    return name == "full" or (name == "top_k" and not _frozen_below(config))


def _frozen_below(config: RunConfig) -> bool:
    """Whether a top_k run leaves layers frozen below its trained ones (k < the backbone's depth)."""
    try:
        return int(config.method["k"]) < backbone_layers(config.backbone)
    except BackboneError:  # planning refuses such a backbone first; a run that gets here trains alone
        return False
