"""k runs of one method in one model: the frozen backbone shared, each run's trained tensors its own.

A step's rows are the k runs' batches one after another, in k equal blocks (block i is run i's). The
frozen backbone processes all k x b rows at once, one kernel per operator for k runs, and every
module that holds trained tensors applies run i's to block i:
  Linear (adapter projections, LoRA's A and B, the task head)  one batched matmul (baddbmm)
  LayerNorm                                                    shared normalisation, each run's scale and shift broadcast
  (IA)3 scaling vectors                                        each run's vector broadcast over its block
top_k's whole top layers are these same Linear and LayerNorm modules, stacked per run as HFTA (Wang et
al., MLSys 2021) fuses whole models; the layers below them stay frozen and shared.
Rows never mix (BERT has no batch-wise operator), so a run's outputs and gradients are its own.

Each run's tensors stay separate leaf parameters, stacked in the forward pass. A grouped parameter is
named as in the solo model plus ".<run index>" (`classifier.weight.3`), so run i's tensors map to the
solo names one for one (`run_parameters`): each run gets the solo trainer's own AdamW and schedule, and
writes the solo run's state and checkpoint. Any other module a method trains (the embeddings of full
fine-tuning and of top_k over every layer) is refused with `GroupingError`; those runs train alone.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn
from torch.nn import functional as F

class GroupingError(ValueError):
    """The model trains a module that cannot be split by run; train its runs alone."""


def _stacked(parameters: nn.ParameterList) -> torch.Tensor:
    return torch.stack(list(parameters))


def _runs(parameters: list[torch.Tensor]) -> nn.ParameterList:
    return nn.ParameterList([nn.Parameter(tensor.detach().clone()) for tensor in parameters])


class _Grouped(nn.Module):
    def keep(self, indices: list[int]) -> None:
        """Keep only these runs in this module's own lists (nested grouped modules keep theirs); the
        kept Parameters are the same objects, so their optimizers go on unchanged."""
        for owner in (self, *(child for child in self.children() if isinstance(child, nn.ModuleDict))):
            for name, child in list(owner.named_children()):
                if isinstance(child, nn.ParameterList):
                    setattr(owner, name, nn.ParameterList([child[i] for i in indices]))


class GroupedLinear(_Grouped):
    def __init__(self, weights: list[torch.Tensor], biases: list[torch.Tensor] | None) -> None:
        super().__init__()
        self.weight = _runs(weights)
        self.bias = _runs(biases) if biases is not None else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = _stacked(self.weight)  # runs, out, in
        blocks = x.reshape(weight.shape[0], -1, weight.shape[2])
        if self.bias is None:
            out = torch.bmm(blocks, weight.transpose(1, 2))
        else:
            out = torch.baddbmm(_stacked(self.bias).unsqueeze(1), blocks, weight.transpose(1, 2))
        return out.reshape(*x.shape[:-1], weight.shape[1])


class GroupedLayerNorm(_Grouped):
    def __init__(self, template: nn.LayerNorm, weights: list[torch.Tensor], biases: list[torch.Tensor]) -> None:
        super().__init__()
        self.normalized_shape, self.eps = template.normalized_shape, template.eps
        self.weight = _runs(weights)
        self.bias = _runs(biases)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight, bias = _stacked(self.weight), _stacked(self.bias)
        normalized = F.layer_norm(x, self.normalized_shape, None, None, self.eps)
        blocks = normalized.reshape(weight.shape[0], -1, *self.normalized_shape)
        return (blocks * weight.unsqueeze(1) + bias.unsqueeze(1)).reshape(x.shape)


class GroupedLoRA(_Grouped):
    """peft's LoRA Linear: base(x) + B(A(dropout(x))) * scaling, with each run's A and B."""

    def __init__(self, layer: nn.Module, trained: list[Mapping[str, torch.Tensor]], prefix: str) -> None:
        super().__init__()
        self.base_layer = layer.base_layer
        self.lora_dropout = layer.lora_dropout
        self.scaling = dict(layer.scaling)
        self.lora_A = nn.ModuleDict({name: GroupedLinear([run[f"{prefix}lora_A.{name}.weight"] for run in trained], None)
                                     for name in layer.lora_A})
        self.lora_B = nn.ModuleDict({name: GroupedLinear([run[f"{prefix}lora_B.{name}.weight"] for run in trained], None)
                                     for name in layer.lora_B})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        result = self.base_layer(x)
        for name in self.lora_A:
            result = result + self.lora_B[name](self.lora_A[name](self.lora_dropout[name](x))) * self.scaling[name]
        return result


class GroupedIA3(_Grouped):
    """peft's (IA)3 Linear: the output scaled by each run's vector, or (feed-forward) the input."""

    def __init__(self, layer: nn.Module, trained: list[Mapping[str, torch.Tensor]], prefix: str) -> None:
        super().__init__()
        self.base_layer = layer.base_layer
        self.is_feedforward = layer.is_feedforward
        self.ia3_l = nn.ModuleDict({name: _runs([run[f"{prefix}ia3_l.{name}"] for run in trained]) for name in layer.ia3_l})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scaling = None
        for runs in self.ia3_l.values():
            vectors = _stacked(runs).flatten(1).unsqueeze(1)  # runs, 1, features
            scaling = vectors if scaling is None else scaling * vectors
        if scaling is None:
            return self.base_layer(x)
        if self.is_feedforward:
            return self.base_layer((x.reshape(scaling.shape[0], -1, x.shape[-1]) * scaling).reshape(x.shape))
        result = self.base_layer(x)
        return (result.reshape(scaling.shape[0], -1, result.shape[-1]) * scaling).reshape(result.shape)


def trained_tensors(model: nn.Module) -> dict[str, torch.Tensor]:
    """A solo model's trained parameters by name (detached): what one run contributes to a group."""
    return {name: parameter.detach() for name, parameter in model.named_parameters() if parameter.requires_grad}


def group_model(model: nn.Module, trained: list[Mapping[str, torch.Tensor]]) -> nn.Module:
    """Turn a solo model (any one run's: its frozen weights are every run's) into a k-run group, in place:
    each module holding trained tensors is replaced by its grouped form with every run's values."""
    names = set(trained[0])
    if any(set(run) != names for run in trained):
        raise GroupingError("the runs of a group must train the same tensors (same method and shapes)")
    replacements: dict[str, nn.Module] = {}
    for module_name, module in model.named_modules():
        prefix = f"{module_name}." if module_name else ""
        if any(module_name.startswith(done + ".") for done in replacements):
            continue
        kind = type(module).__name__
        if hasattr(module, "lora_A") and hasattr(module, "base_layer"):
            replacements[module_name] = GroupedLoRA(module, trained, prefix)
        elif hasattr(module, "ia3_l") and hasattr(module, "base_layer"):
            replacements[module_name] = GroupedIA3(module, trained, prefix)
        elif not any(p.requires_grad for p in module.parameters(recurse=False)):
            continue
        elif isinstance(module, nn.Linear):
            biases = [run[f"{prefix}bias"] for run in trained] if module.bias is not None else None
            replacements[module_name] = GroupedLinear([run[f"{prefix}weight"] for run in trained], biases)
        elif isinstance(module, nn.LayerNorm):
            replacements[module_name] = GroupedLayerNorm(module, [run[f"{prefix}weight"] for run in trained],
                                                         [run[f"{prefix}bias"] for run in trained])
        else:
            raise GroupingError(f"{kind} {module_name!r} trains parameters that cannot be split by run; train these runs alone")
    model.requires_grad_(False)
    for module_name, replacement in replacements.items():
        parent, _, attribute = module_name.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, attribute, replacement)
        for parameter_list in replacement.modules():
            if isinstance(parameter_list, nn.ParameterList):
                parameter_list.requires_grad_(True)
    grouped = {name for run in run_parameters(model) for name in run}
    if grouped != names:
        raise GroupingError(f"grouping lost trained tensors: {sorted(names ^ grouped)[:5]}")
    return model


def run_parameters(model: nn.Module) -> list[dict[str, nn.Parameter]]:
    """Each run's trained Parameters under their solo names (the ".<run index>" suffix removed)."""
    runs: dict[int, dict[str, nn.Parameter]] = {}
    for name, parameter in model.named_parameters():
        if parameter.requires_grad:
            solo_name, _, index = name.rpartition(".")
            runs.setdefault(int(index), {})[solo_name] = parameter
    return [runs[index] for index in sorted(runs)]


def keep_runs(model: nn.Module, indices: list[int]) -> None:
    """Keep only these runs in every grouped module (a diverged run leaves the group)."""
    for module in list(model.modules()):
        if isinstance(module, _Grouped):
            module.keep(indices)
