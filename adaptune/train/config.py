"""One run's configuration: the unit the pipeline fans out and every result row carries.

Defaults follow the paper and its official code (AdamW, weight decay 0.01, 10% linear warmup then
linear decay, clipping at 1.0, batch 32, max length 128). Experiments are `dataclasses.replace`
of these defaults, never new defaults.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from typing import Any

from adaptune.core.backbones import DEFAULT_BACKBONE

# Fields that name or schedule a run without changing its result: left out of the run id.
NOT_IN_RUN_ID = frozenset({"experiment", "checkpoint_every_steps"})


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    task: str
    method: dict[str, Any]  # a method config as a dict, e.g. {"name": "adapters", "size": 64, "init_std": 0.01}
    lr: float = 3e-4
    epochs: int = 3
    seed: int = 0
    backbone: str = DEFAULT_BACKBONE
    batch_size: int = 32
    max_length: int = 128  # SQuAD uses 384 with doc stride 128
    doc_stride: int = 128
    warmup_fraction: float = 0.1
    weight_decay: float = 0.01
    max_grad_norm: float = 1.0
    # Subsampling for CPU-sized runs; None means the whole split.
    max_train_examples: int | None = None
    max_eval_examples: int | None = None
    checkpoint_every_steps: int | None = None  # preemption safety between epoch ends
    experiment: str = "adhoc"

    def __post_init__(self) -> None:
        # Normalise so that equal configurations give equal run ids, however they were built.
        object.__setattr__(self, "method", {k: _int_if_whole(v) for k, v in sorted(self.method.items())})
        method_label(self.method)  # a malformed method fails here, with a message, not later as a KeyError
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.type in ("int", "int | None") and value is not None:
                object.__setattr__(self, field.name, _int_if_whole(value))

    def to_dict(self) -> dict[str, Any]:
        data = {field.name: getattr(self, field.name) for field in _FIELDS}
        data["method"] = dict(self.method)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "TrainConfig":
        """Build from a dict, tolerating KFP's habit of turning ints inside dicts into floats."""
        fields = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - set(fields))
        if unknown:
            raise ValueError(f"unknown TrainConfig field(s) {unknown}; known: {sorted(fields)}")
        return cls(**data)

    @functools.cached_property
    def run_id(self) -> str:
        """Deterministic id from what determines the result: the same run planned by two experiments
        (glue_full and paper_full) is one run in the run store, trained once."""
        determining = {k: v for k, v in self.to_dict().items() if k not in NOT_IN_RUN_ID}
        canonical = json.dumps(determining, sort_keys=True, default=str)
        return f"{self.task}-{method_label(self.method)}-s{self.seed}-" + hashlib.sha1(canonical.encode()).hexdigest()[:10]


_FIELDS = dataclasses.fields(TrainConfig)

# The field a method's label needs (methods registered later label by name alone);
# adaptune.model.methods.method_from_dict validates the rest.
_LABEL_FIELDS = {"adapters": "size", "top_k": "k", "pfeiffer": "size", "lora": "r"}


def method_label(method: dict[str, Any]) -> str:
    """Short human label of a method dict: full, adapters64, top_k3, layernorm, pfeiffer64, lora8, ia3."""
    name = method.get("name")
    if not isinstance(name, str) or _LABEL_FIELDS.get(name, "name") not in method:
        raise ValueError(
            f"malformed method {method!r}: expected a 'name' and its parameters, e.g. {{'name': 'full'}}, "
            "{'name': 'adapters', 'size': 64} or {'name': 'top_k', 'k': 3}"
        )
    if name in _LABEL_FIELDS:
        return f"{name}{int(method[_LABEL_FIELDS[name]])}"
    return name


def method_text(method: dict[str, Any]) -> str:
    """The short form methods.parse_method reads back: "full", "adapters:size=64,init_std=0.01"."""
    arguments = ",".join(f"{key}={value}" for key, value in sorted(method.items()) if key != "name")
    return f"{method['name']}:{arguments}" if arguments else str(method["name"])


def _int_if_whole(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value
