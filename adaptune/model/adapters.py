"""The bottleneck adapter (Houlsby et al. 2019, section 2.1), its two insertion points per layer, and
the ablation switch. The Pfeiffer placement (Pfeiffer et al. 2021) uses the feed-forward point only.

Insertion: in BERT-family layers, `layer.attention.output` and `layer.output` both compute
`LayerNorm(dropout(dense(h)) + residual)`. Their `dropout` is replaced by `DropoutThenAdapter`, which
runs the original dropout and then the adapter, so the adapter sits after dropout and before the
residual add and LayerNorm, exactly where the paper (and its official code) puts it. State-dict keys
read e.g. `bert.encoder.layer.0.attention.output.dropout.adapter.down.weight`.

Layers are indexed from 0 (the lowest Transformer layer) to L-1.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator

import torch
from torch import nn
from transformers.activations import ACT2FN

from adaptune.core.errors import UserError

SUPPORTED_LAYOUT = (
    "a BERT-family encoder (BERT, RoBERTa, ELECTRA, MiniLM): base_model.encoder.layer[i] with "
    "`attention.output` and `output` each holding `dense`, `dropout` and `LayerNorm`"
)


class UnsupportedModelError(UserError, TypeError):
    """The model does not have the BERT-family layer layout adapters are inserted into."""


class Adapter(nn.Module):
    """d -> m down-projection, nonlinearity, m -> d up-projection, plus an internal skip connection.

    Parameters: 2md + d + m. With init_std=0 the projections are exactly zero, so the adapter is
    exactly the identity; a small std makes it near-identity. `enabled = False` makes it the
    identity regardless of its weights (the ablation switch).
    """

    def __init__(self, hidden_size: int, size: int, nonlinearity: str = "gelu", init_std: float = 1e-2) -> None:
        super().__init__()
        if size < 1:
            raise ValueError(f"adapter size must be >= 1, got {size}")
        if init_std < 0:
            raise ValueError(f"adapter init_std must be >= 0, got {init_std}")
        if nonlinearity not in ACT2FN:
            raise ValueError(f"unknown adapter nonlinearity {nonlinearity!r}; known: {sorted(ACT2FN)}")
        self.down = nn.Linear(hidden_size, size)
        self.activation = ACT2FN[nonlinearity]
        self.up = nn.Linear(size, hidden_size)
        self.enabled = True
        self.reset_parameters(init_std)

    def reset_parameters(self, init_std: float) -> None:
        """Weights from a normal truncated at two standard deviations, biases zero."""
        for projection in (self.down, self.up):
            if init_std == 0:
                nn.init.zeros_(projection.weight)
            else:
                nn.init.trunc_normal_(projection.weight, std=init_std, a=-2 * init_std, b=2 * init_std)
            nn.init.zeros_(projection.bias)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        if not self.enabled:
            return hidden_states
        return hidden_states + self.up(self.activation(self.down(hidden_states)))


class DropoutThenAdapter(nn.Module):
    """Stands in for a sublayer's `dropout`: the original dropout, then the adapter."""

    def __init__(self, dropout: nn.Module, adapter: Adapter) -> None:
        super().__init__()
        self.dropout = dropout
        self.adapter = adapter

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.adapter(self.dropout(hidden_states))


def encoder_layers(model: nn.Module) -> nn.ModuleList:
    """The Transformer layers of a BERT-family model, lowest first (the model's own ModuleList);
    UnsupportedModelError otherwise."""
    base = getattr(model, "base_model", model)
    layers = getattr(getattr(base, "encoder", None), "layer", None)
    if not isinstance(layers, nn.ModuleList) or len(layers) == 0:
        raise UnsupportedModelError(
            f"{type(model).__name__} is not supported: expected {SUPPORTED_LAYOUT}, but found no base_model.encoder.layer list"
        )
    for index, layer in enumerate(layers):
        for point in _sublayer_outputs_or_none(layer):
            if point is None or not all(hasattr(point, attr) for attr in ("dense", "dropout", "LayerNorm")):
                raise UnsupportedModelError(
                    f"{type(model).__name__} is not supported: layer {index} ({type(layer).__name__}) does not match "
                    f"{SUPPORTED_LAYOUT}"
                )
    return layers


def _sublayer_outputs_or_none(layer: nn.Module) -> tuple[nn.Module | None, nn.Module | None]:
    attention = getattr(layer, "attention", None)
    return getattr(attention, "output", None), getattr(layer, "output", None)


PLACEMENTS = ("houlsby", "pfeiffer")  # both points per layer (the paper's) / after the feed-forward block only


def insertion_points(layer: nn.Module, placement: str = "houlsby") -> tuple[nn.Module, ...]:
    """Where a placement puts adapters in one layer: the attention output block and the feed-forward
    output block (houlsby), or the feed-forward output block alone (pfeiffer)."""
    if placement not in PLACEMENTS:
        raise ValueError(f"unknown adapter placement {placement!r}; known: {', '.join(PLACEMENTS)}")
    if placement == "houlsby":
        return layer.get_submodule("attention.output"), layer.get_submodule("output")
    return (layer.get_submodule("output"),)


def add_adapters(model: nn.Module, size: int, nonlinearity: str = "gelu", init_std: float = 1e-2, placement: str = "houlsby") -> nn.Module:
    """Insert adapters into every Transformer layer at the placement's points, in place; returns the model."""
    layers = encoder_layers(model)
    if layer_adapters(layers[0]):
        raise ValueError(f"{type(model).__name__} already has adapters; load a fresh backbone to add new ones")
    for layer in layers:
        for point in insertion_points(layer, placement):
            weight = point.get_parameter("dense.weight")  # nn.Linear's: (out_features = hidden size, in_features)
            adapter = Adapter(weight.shape[0], size, nonlinearity=nonlinearity, init_std=init_std)
            adapter.to(device=weight.device, dtype=weight.dtype)
            point.dropout = DropoutThenAdapter(point.get_submodule("dropout"), adapter)
    return model


def layer_adapters(layer: nn.Module) -> list[Adapter]:
    """The adapters of one layer (attention one first); empty when none were inserted."""
    return [point.dropout.adapter for point in insertion_points(layer) if isinstance(point.dropout, DropoutThenAdapter)]


def all_adapters(model: nn.Module) -> list[Adapter]:
    return [adapter for layer in encoder_layers(model) for adapter in layer_adapters(layer)]


def set_adapters_enabled(model: nn.Module, layers: Iterable[int], enabled: bool) -> None:
    """Switch both adapters of each listed layer (0-based) on or off."""
    all_layers = encoder_layers(model)
    for index in layers:
        if not 0 <= index < len(all_layers):
            raise IndexError(f"layer {index} out of range: the model has layers 0..{len(all_layers) - 1}")
        adapters = layer_adapters(all_layers[index])
        if not adapters:
            raise ValueError(f"layer {index} has no adapters; apply the adapters method first")
        for adapter in adapters:
            adapter.enabled = enabled


@contextlib.contextmanager
def adapters_disabled(model: nn.Module, first: int, last: int) -> Iterator[nn.Module]:
    """Turn off the adapters of layers first..last (inclusive, 0-based) inside the block.

    Each switched-off adapter is exactly the identity; the previous on/off states come back on exit.
    """
    layer_count = len(encoder_layers(model))
    if not 0 <= first <= last < layer_count:
        raise ValueError(f"need 0 <= first <= last < {layer_count} (the model's layer count), got first={first}, last={last}")
    span = range(first, last + 1)
    previous = {adapter: adapter.enabled for adapter in all_adapters(model)}
    set_adapters_enabled(model, span, False)
    try:
        yield model
    finally:
        for adapter, was_enabled in previous.items():
            adapter.enabled = was_enabled
