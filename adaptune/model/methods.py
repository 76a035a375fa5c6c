"""The tuning methods as declared, registered configurations: the paper's four, the floor beneath them (the
task head alone), and beside them the Pfeiffer adapter placement and two of today's PEFT methods (LoRA and
(IA)3, through Hugging Face peft).

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
  head       the task head alone, the whole backbone frozen (a linear probe): what the backbone gives
             without any tuning, the floor every other method's score stands on. Variable fine-tuning
             at k = 0, but for the pooler, which stays frozen as adapters keep it
  pfeiffer   as adapters, with one adapter per layer (after the feed-forward block) instead of two
  lora       peft's LoRA matrices (A, B) on the target Linear layers (query, value) and the task head
  ia3        peft's (IA)3 scaling vectors on the target Linear layers (key, value, output.dense) and the
             task head
LoRA and (IA)3 train no LayerNorm (as in their papers) and, like adapters, keep the pooler frozen.

The frozen pooler is a pre-trained one (BERT's). A backbone whose pooler was never trained
(all-MiniLM-L6-v2) comes from backbone.load_model with mean pooling in its place, which has no
parameters: see the head rule in adaptune/model/backbone.py.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:  # torch is imported where a method is applied: a plan reads the configs without it
    from torch import nn


@dataclasses.dataclass(frozen=True)
class MethodConfigBase:
    """What every method's config shares: a frozen dataclass whose `name` tag (a class constant) and fields
    round-trip through a plain dict (method_from_dict rebuilds it)."""

    name: ClassVar[str]

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, **dataclasses.asdict(self)}


@dataclasses.dataclass(frozen=True)
class FullConfig(MethodConfigBase):
    name: ClassVar[str] = "full"


@dataclasses.dataclass(frozen=True)
class AdaptersConfig(MethodConfigBase):
    size: int
    init_std: float = 1e-2
    nonlinearity: str = "gelu"
    name: ClassVar[str] = "adapters"

    def __post_init__(self) -> None:
        if self.size < 1:
            raise ValueError(f"{self.name} size must be >= 1, got {self.size}")
        if self.init_std < 0:
            raise ValueError(f"{self.name} init_std must be >= 0, got {self.init_std}")
        if self.nonlinearity == "gelu":  # the default is one of transformers' ACT2FN: no import (seconds) to say so
            return
        from transformers.activations import ACT2FN

        if self.nonlinearity not in ACT2FN:
            raise ValueError(f"unknown {self.name} nonlinearity {self.nonlinearity!r}; known: {sorted(ACT2FN)}")


@dataclasses.dataclass(frozen=True)
class TopKConfig(MethodConfigBase):
    k: int
    name: ClassVar[str] = "top_k"

    def __post_init__(self) -> None:
        if self.k < 1:
            raise ValueError(f"top_k needs k >= 1 layers, got {self.k}")


@dataclasses.dataclass(frozen=True)
class LayerNormConfig(MethodConfigBase):
    name: ClassVar[str] = "layernorm"


@dataclasses.dataclass(frozen=True)
class HeadOnlyConfig(MethodConfigBase):
    name: ClassVar[str] = "head"


@dataclasses.dataclass(frozen=True)
class PfeifferConfig(AdaptersConfig):
    """Adapters at the Pfeiffer et al. (2021, AdapterFusion) placement: one per layer, after the
    feed-forward block only. A method of its own name (not a field of AdaptersConfig), so the
    paper's adapters runs keep their run ids and the report's adapters rows never mix in this variant."""

    name: ClassVar[str] = "pfeiffer"


# Module lists travel as one "+"-joined string ("key+output.dense+value"): a plain scalar for KFP
# parameters and Parquet columns, and no clash with the "," between a method string's fields.
MODULE_SEPARATOR = "+"


def module_list(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(MODULE_SEPARATOR) if part.strip())


def _canonical_modules(cls_name: str, field: str, text: str) -> str:
    modules = module_list(text)
    if not modules:
        raise ValueError(f"{cls_name} {field} is empty; name module suffixes joined by '+', e.g. 'query+value'")
    bad = [module for module in modules if not all(part.isidentifier() or part.isdigit() for part in module.split("."))]
    if bad:
        raise ValueError(f"{cls_name} {field}: {bad} are not module names (dotted suffixes such as 'output.dense')")
    return MODULE_SEPARATOR.join(sorted(set(modules)))  # order-free: equal methods get equal run ids


@dataclasses.dataclass(frozen=True)
class LoraMethodConfig(MethodConfigBase):
    """LoRA (Hu et al. 2022) through peft. Defaults: the LoRA paper's GLUE setting for RoBERTa/BERT-base
    (r = 8, alpha = 8, on the attention query and value projections, its Table 9)."""

    r: int = 8
    alpha: int = 8
    dropout: float = 0.0
    target_modules: str = "query+value"
    name: ClassVar[str] = "lora"

    def __post_init__(self) -> None:
        if self.r < 1:
            raise ValueError(f"lora r must be >= 1, got {self.r}")
        if self.alpha <= 0:
            raise ValueError(f"lora alpha must be > 0, got {self.alpha}")
        if not 0 <= self.dropout < 1:
            raise ValueError(f"lora dropout must be in [0, 1), got {self.dropout}")
        object.__setattr__(self, "target_modules", _canonical_modules("lora", "target_modules", self.target_modules))


@dataclasses.dataclass(frozen=True)
class IA3MethodConfig(MethodConfigBase):
    """(IA)3 (Liu et al. 2022) through peft, with peft's BERT defaults: scaling vectors on key, value
    and output.dense; on output.dense (a feed-forward module) the vector scales the layer's input."""

    target_modules: str = "key+output.dense+value"
    feedforward_modules: str = "output.dense"
    name: ClassVar[str] = "ia3"

    def __post_init__(self) -> None:
        object.__setattr__(self, "target_modules", _canonical_modules("ia3", "target_modules", self.target_modules))
        object.__setattr__(self, "feedforward_modules", _canonical_modules("ia3", "feedforward_modules", self.feedforward_modules))
        outside = sorted(set(module_list(self.feedforward_modules)) - set(module_list(self.target_modules)))
        if outside:
            raise ValueError(f"ia3 feedforward_modules {outside} must also be target_modules ({self.target_modules})")


MethodConfig = FullConfig | AdaptersConfig | TopKConfig | LayerNormConfig | HeadOnlyConfig | PfeifferConfig | LoraMethodConfig | IA3MethodConfig
ApplyFn = Callable[["nn.Module", Any], None]


@dataclasses.dataclass(frozen=True)
class BackboneLayout:
    """What a method may check of a backbone before anything runs (built on the meta device: no weights)."""

    name: str
    num_layers: int
    module_types: Mapping[str, str]  # dotted module name in the encoder -> class name, e.g. "...self.query" -> "Linear"


# A method's plan-time check: why it cannot run on this backbone (one line), or None.
BackboneCheck = Callable[[Any, BackboneLayout], str | None]


@dataclasses.dataclass(frozen=True)
class RegisteredMethod:
    config_cls: type
    apply_fn: ApplyFn
    backbone_check: BackboneCheck | None = None


METHODS: dict[str, RegisteredMethod] = {}


def register_method(name: str, config_cls: type, apply_fn: ApplyFn, backbone_check: BackboneCheck | None = None) -> None:
    """Declare a method once: its dict tag, its config dataclass, the function that applies it, and
    optionally what it needs of a backbone (checked at plan time, before any run)."""
    if name in METHODS:
        raise ValueError(f"method {name!r} is already registered")
    if getattr(config_cls, "name", None) != name:
        raise ValueError(f"{config_cls.__name__}.name must be {name!r} to register it under that name")
    METHODS[name] = RegisteredMethod(config_cls, apply_fn, backbone_check)


def checks_backbone(cfg: Any) -> bool:
    """Whether this method checks a backbone's layout at plan time (building the layout imports transformers)."""
    return _registered(getattr(cfg, "name", None)).backbone_check is not None


def backbone_problem(cfg: Any, layout: BackboneLayout) -> str | None:
    """Why this method cannot run on this backbone, or None (methods without a check run on any)."""
    check = _registered(getattr(cfg, "name", None)).backbone_check
    return check(cfg, layout) if check else None


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
            if isinstance(value, list | tuple) and value and all(isinstance(item, str) for item in value):
                return MODULE_SEPARATOR.join(value)  # a YAML/JSON list of module names
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
    from torch import nn

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
    from adaptune.model.adapters import add_adapters, all_adapters

    add_adapters(model, cfg.size, nonlinearity=cfg.nonlinearity, init_std=cfg.init_std)
    train_only(model, [*all_adapters(model), *layer_norms(model), *head_modules(model)])


def _apply_top_k(model: nn.Module, cfg: TopKConfig) -> None:
    from adaptune.model.adapters import encoder_layers

    layers = encoder_layers(model)
    if cfg.k > len(layers):
        raise ValueError(f"top_k k={cfg.k} exceeds the model's {len(layers)} Transformer layers; choose 1..{len(layers)}")
    if cfg.k == len(layers):
        model.requires_grad_(True)  # every layer: full fine-tuning, embeddings included (the paper's k = L)
        return
    train_only(model, [*layers[-cfg.k :], pooler_module(model), *head_modules(model)])


def _apply_layernorm(model: nn.Module, cfg: LayerNormConfig) -> None:
    train_only(model, [*layer_norms(model), *head_modules(model)])


def _apply_head_only(model: nn.Module, cfg: HeadOnlyConfig) -> None:
    head = head_modules(model)
    if not any(parameter.numel() for module in head for parameter in module.parameters()):
        raise ValueError(f"head: {type(model).__name__} has no task head beside its base model to train")
    train_only(model, head)


def _apply_pfeiffer(model: nn.Module, cfg: PfeifferConfig) -> None:
    from adaptune.model.adapters import add_adapters, all_adapters

    add_adapters(model, cfg.size, nonlinearity=cfg.nonlinearity, init_std=cfg.init_std, placement="pfeiffer")
    train_only(model, [*all_adapters(model), *layer_norms(model), *head_modules(model)])


# peft's methods are injected in place (peft.inject_adapter_in_model), not wrapped in a PeftModel
# (get_peft_model): the model keeps its class, its forward and loss, its `base_model` and head, and
# the names of every parameter not adapted, so the trainer, the head rule (MeanPooler's hook) and
# the checkpoints work unchanged. An adapted Linear becomes peft's layer holding the original as
# `base_layer` (frozen), e.g. `...self.query.base_layer.weight` and `...self.query.lora_A.default.weight`.


def peft_trained_modules(model: nn.Module) -> list[nn.Module]:
    """The containers of peft's trained tensors (LoRA's lora_A/lora_B, (IA)3's ia3_l), found by peft's
    own declaration of each tuner layer's adapter parts (`adapter_layer_names`)."""
    from peft.tuners.tuners_utils import BaseTunerLayer
    from torch import nn

    return [getattr(layer, part) for layer in model.modules() if isinstance(layer, BaseTunerLayer)
            for part in layer.adapter_layer_names if isinstance(getattr(layer, part, None), nn.Module)]


def _apply_lora(model: nn.Module, cfg: LoraMethodConfig) -> None:
    from peft import LoraConfig, inject_adapter_in_model

    peft_config = LoraConfig(r=cfg.r, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout, target_modules=list(module_list(cfg.target_modules)))
    inject_adapter_in_model(peft_config, model)
    train_only(model, [*peft_trained_modules(model), *head_modules(model)])


def _apply_ia3(model: nn.Module, cfg: IA3MethodConfig) -> None:
    from peft import IA3Config, inject_adapter_in_model

    peft_config = IA3Config(target_modules=list(module_list(cfg.target_modules)), feedforward_modules=list(module_list(cfg.feedforward_modules)))
    inject_adapter_in_model(peft_config, model)
    train_only(model, [*peft_trained_modules(model), *head_modules(model)])


def _targets_problem(cfg: Any, layout: BackboneLayout) -> str | None:
    """Each target module must name (as peft matches: the whole name or a dotted suffix) at least one
    Linear layer of the backbone, and only Linear layers (what these methods' settings are for)."""
    linear_suffixes = sorted({name.rsplit(".", 1)[-1] for name, kind in layout.module_types.items() if kind == "Linear"})
    for target in module_list(cfg.target_modules):
        matched = {name: kind for name, kind in layout.module_types.items() if name == target or name.endswith("." + target)}
        if not matched:
            return (f"{cfg.name} target module {target!r} is not a module of backbone {layout.name!r}; "
                    f"its Linear layers are named {', '.join(linear_suffixes)}")
        other = sorted({kind for kind in matched.values() if kind != "Linear"})
        if other:
            return (f"{cfg.name} does not support backbone {layout.name!r} with target module {target!r}: it matches "
                    f"{', '.join(other)} modules, and {cfg.name} here adapts Linear layers only ({', '.join(linear_suffixes)})")
    return None


register_method("full", FullConfig, _apply_full)
register_method("adapters", AdaptersConfig, _apply_adapters)
register_method("top_k", TopKConfig, _apply_top_k)
register_method("layernorm", LayerNormConfig, _apply_layernorm)
register_method("head", HeadOnlyConfig, _apply_head_only)
register_method("pfeiffer", PfeifferConfig, _apply_pfeiffer)
register_method("lora", LoraMethodConfig, _apply_lora, _targets_problem)
register_method("ia3", IA3MethodConfig, _apply_ia3, _targets_problem)
