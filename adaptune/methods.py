"""The four tuning methods as declared, registered configurations.

A method is a frozen dataclass with a `name` tag that round-trips through a plain dict (a KFP
parameter, a Parquet column) and an apply function that mutates a model in place: it inserts
adapters where needed and sets `requires_grad` so that exactly the method's groups train.

Trained groups (chosen by module structure, never by parameter-name patterns):
  full       every parameter
  adapters   the adapters, every nn.LayerNorm (the embedding one included) and the task head;
             the pooler stays frozen, as in the official code
  top_k      the top k Transformer layers, the pooler and the task head ("variable fine-tuning");
             with k = every layer, exactly full fine-tuning (embeddings included), as the paper says
  layernorm  every nn.LayerNorm and the task head

The frozen pooler is a pre-trained one (BERT's). A backbone whose pooler was never trained
(all-MiniLM-L6-v2) comes from backbone.load_model with mean pooling in its place, which has no
parameters: see the head rule in adaptune/backbone.py.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable, Iterable
from typing import Any, ClassVar

from torch import nn

from adaptune.adapters import add_adapters, all_adapters, encoder_layers


@dataclasses.dataclass(frozen=True)
class FullConfig:
    name: ClassVar[str] = "full"

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, **dataclasses.asdict(self)}


@dataclasses.dataclass(frozen=True)
class AdaptersConfig:
    size: int
    init_std: float = 1e-2
    nonlinearity: str = "gelu"
    name: ClassVar[str] = "adapters"

    def __post_init__(self) -> None:
        if self.size < 1:
            raise ValueError(f"adapters size must be >= 1, got {self.size}")
        if self.init_std < 0:
            raise ValueError(f"adapters init_std must be >= 0, got {self.init_std}")
        from transformers.activations import ACT2FN

        if self.nonlinearity not in ACT2FN:
            raise ValueError(f"unknown adapters nonlinearity {self.nonlinearity!r}; known: {sorted(ACT2FN)}")

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, **dataclasses.asdict(self)}


@dataclasses.dataclass(frozen=True)
class TopKConfig:
    k: int
    name: ClassVar[str] = "top_k"

    def __post_init__(self) -> None:
        if self.k < 1:
            raise ValueError(f"top_k needs k >= 1 layers, got {self.k}")

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, **dataclasses.asdict(self)}


@dataclasses.dataclass(frozen=True)
class LayerNormConfig:
    name: ClassVar[str] = "layernorm"

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, **dataclasses.asdict(self)}


MethodConfig = FullConfig | AdaptersConfig | TopKConfig | LayerNormConfig
ApplyFn = Callable[[nn.Module, Any], None]


@dataclasses.dataclass(frozen=True)
class RegisteredMethod:
    config_cls: type
    apply_fn: ApplyFn


METHODS: dict[str, RegisteredMethod] = {}


def register_method(name: str, config_cls: type, apply_fn: ApplyFn) -> None:
    """Declare a method once: its dict tag, its config dataclass, and the function that applies it."""
    if name in METHODS:
        raise ValueError(f"method {name!r} is already registered")
    if getattr(config_cls, "name", None) != name:
        raise ValueError(f"{config_cls.__name__}.name must be {name!r} to register it under that name")
    METHODS[name] = RegisteredMethod(config_cls, apply_fn)


def apply_method(model: nn.Module, cfg: Any) -> nn.Module:
    """Apply a method to a model in place (adapters inserted, requires_grad set); returns the model."""
    registered = _registered(getattr(cfg, "name", None))
    if not isinstance(cfg, registered.config_cls):
        raise TypeError(f"expected a {registered.config_cls.__name__} for method {cfg.name!r}, got {type(cfg).__name__}")
    registered.apply_fn(model, cfg)
    return model


def method_from_dict(data: dict[str, Any]) -> Any:
    """Rebuild a config from `cfg.to_dict()` output; whole floats for int fields are accepted (KFP)."""
    if "name" not in data:
        raise ValueError(f"method dict {data!r} has no 'name'; known methods: {sorted(METHODS)}")
    registered = _registered(data["name"])
    field_types = _field_types(registered.config_cls)
    values = {key: value for key, value in data.items() if key != "name"}
    unknown = sorted(set(values) - set(field_types))
    if unknown:
        raise ValueError(f"unknown field(s) {unknown} for method {data['name']!r}; known fields: {sorted(field_types)}")
    return registered.config_cls(**{key: _coerce(key, value, field_types[key]) for key, value in values.items()})


def parse_method(text: str) -> Any:
    """Parse the CLI form: "full", "layernorm", "top_k:3", "adapters:64", "adapters:64,init_std=1e-3".

    After the colon, a bare value fills the method's first field; `field=value` items fill any field.
    """
    name, _, arguments = text.strip().partition(":")
    registered = _registered(name)
    field_names = list(_field_types(registered.config_cls))
    data: dict[str, Any] = {"name": name}
    for position, item in enumerate(part.strip() for part in arguments.split(",") if part.strip()):
        key, has_key, value = item.partition("=")
        if not has_key:
            if position != 0 or not field_names:
                raise ValueError(f"cannot parse {text!r}: only the first argument may omit its field name; fields of {name!r}: {field_names}")
            key, value = field_names[0], item
        data[key.strip()] = value.strip()
    return method_from_dict(data)


def _registered(name: Any) -> RegisteredMethod:
    if name not in METHODS:
        raise ValueError(f"unknown method {name!r}; known methods: {sorted(METHODS)}")
    return METHODS[name]


def _field_types(config_cls: type) -> dict[str, type]:
    hints = typing.get_type_hints(config_cls)
    return {field.name: hints[field.name] for field in dataclasses.fields(config_cls)}


def _coerce(key: str, value: Any, field_type: type) -> Any:
    """Turn CLI strings and KFP's whole floats into the field's type; anything else is an error."""
    try:
        if field_type is int:
            number = float(value) if isinstance(value, str) else value
            if isinstance(number, bool) or not isinstance(number, int | float) or not float(number).is_integer():
                raise ValueError
            return int(number)
        if field_type is float:
            if isinstance(value, bool):
                raise ValueError
            return float(value)
        if field_type is str:
            if not isinstance(value, str):
                raise ValueError
            return value
    except (TypeError, ValueError):
        expected = {int: "an integer", float: "a number", str: "a string"}[field_type]
        raise ValueError(f"method field {key!r} needs {expected}, got {value!r}") from None
    return value


# Structural groups of a transformers model.


def head_modules(model: nn.Module) -> list[nn.Module]:
    """The task head: the model's own submodules besides its base model (e.g. `classifier`, `qa_outputs`)."""
    base = getattr(model, "base_model", model)
    if base is model:
        return []
    return [child for child in model.children() if child is not base]


def pooler_module(model: nn.Module) -> nn.Module | None:
    return getattr(getattr(model, "base_model", model), "pooler", None)


def layer_norms(model: nn.Module) -> list[nn.Module]:
    return [module for module in model.modules() if isinstance(module, nn.LayerNorm)]


def train_only(model: nn.Module, modules: Iterable[nn.Module | None]) -> None:
    """Freeze every parameter, then unfreeze those of the given modules."""
    model.requires_grad_(False)
    for module in modules:
        if module is not None:
            module.requires_grad_(True)


def _apply_full(model: nn.Module, cfg: FullConfig) -> None:
    model.requires_grad_(True)


def _apply_adapters(model: nn.Module, cfg: AdaptersConfig) -> None:
    add_adapters(model, cfg.size, nonlinearity=cfg.nonlinearity, init_std=cfg.init_std)
    train_only(model, [*all_adapters(model), *layer_norms(model), *head_modules(model)])


def _apply_top_k(model: nn.Module, cfg: TopKConfig) -> None:
    layers = encoder_layers(model)
    if cfg.k > len(layers):
        raise ValueError(f"top_k k={cfg.k} exceeds the model's {len(layers)} Transformer layers; choose 1..{len(layers)}")
    if cfg.k == len(layers):
        model.requires_grad_(True)  # every layer: full fine-tuning, embeddings included (the paper's k = L)
        return
    train_only(model, [*layers[-cfg.k :], pooler_module(model), *head_modules(model)])


def _apply_layernorm(model: nn.Module, cfg: LayerNormConfig) -> None:
    train_only(model, [*layer_norms(model), *head_modules(model)])


register_method("full", FullConfig, _apply_full)
register_method("adapters", AdaptersConfig, _apply_adapters)
register_method("top_k", TopKConfig, _apply_top_k)
register_method("layernorm", LayerNormConfig, _apply_layernorm)
