"""k runs of one method in one model: the frozen backbone shared, each run's trained tensors its own.

A step's rows are the k runs' batches one after another, in k equal blocks (block i is run i's). The
frozen backbone processes all k x b rows at once, one kernel per operator for k runs, and every
module that holds trained tensors applies run i's to block i:
  Linear (adapter projections, LoRA's A and B, the task head)  one batched matmul (baddbmm)
  LayerNorm                                                    shared normalisation, each run's scale and shift broadcast
                                                               (or both in one kernel: adaptune.fused.kernels.layer_norm)
  (IA)3 scaling vectors                                        each run's vector broadcast over its block
top_k's whole top layers are these same Linear and LayerNorm modules, stacked per run as HFTA (Wang et
al., MLSys 2021) fuses whole models; the layers below them stay frozen and shared.
Rows never mix (BERT has no batch-wise operator), so a run's outputs and gradients are its own.

Each trained tensor is held once for all runs: one Parameter stacked on a leading run axis, under its
solo name (`classifier.weight`, runs x 2 x hidden), so the forward pass uses it as it is and the
backward pass accumulates one gradient for all runs. Run i sees its slice as a Parameter of its own that
shares the stack's storage (`run_parameters`): each run keeps the solo trainer's own AdamW, schedule,
state and checkpoint, and an update of its slice is an update of the stack. When the stack's gradient is
ready, a hook hands each run its slice (a view) and clears the stack's. Stacking per forward pass
instead (one leaf per run) cost k autograd nodes per tensor, their selects and copies, which left the device
idle most of a step (figures: bench/LOG.md, "Figures moved out of the code's comments"). The embedding tables
that full fine-tuning and top_k over every layer train
(`GroupedEmbedding`) are looked up per run, each run's block of ids in its own table; BERT's positions, looked
up once and added to every row alike, are then given one row per input row, so that each row reads its own
run's table. Any other module a method trains is refused with `GroupingError`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

import torch
from torch import nn
from torch.nn import functional as F

from adaptune.fused.kernels import layer_norm as layer_norm_kernel
from adaptune.fused.kernels.triton_device import runs_triton
from adaptune.fused.settings import StepSettings
from adaptune.model.adapters import Adapter


class GroupingError(ValueError):
    """The model trains a module that cannot be split by run; train its runs alone."""


def _stack(tensors: list[torch.Tensor]) -> nn.Parameter:
    """Runs' values of one trained tensor as one Parameter, run axis first; run i's own Parameter, a
    view of its slice, comes with run_parameters, and the stack's gradient is handed out slice by slice."""
    stack = nn.Parameter(torch.stack([tensor.detach() for tensor in tensors]).clone())
    stack.register_post_accumulate_grad_hook(_hand_out_gradient)
    setattr(stack, "run_stack", True)  # trained, unlike the frozen layers a grouped module wraps (read with getattr)
    return stack


def _hand_out_gradient(stack: torch.Tensor) -> None:
    views = getattr(stack, "run_views", None)
    if views is None:  # no run has asked for its Parameter: the stack keeps its gradient
        return
    assert stack.grad is not None  # the hook runs once the gradient is accumulated
    for view, gradient in zip(views, stack.grad.unbind(0), strict=True):
        view.grad = gradient if view.grad is None else view.grad + gradient
    stack.grad = None


def holds_one_run(stack: torch.Tensor) -> bool:
    """Whether a stacked tensor (runs first) is a group of one's: its layers then compute with the solo layers' own
    operators (F.linear, F.layer_norm), so that the run trains with alone's rounding."""
    return stack.shape[0] == 1


class GroupedLinear(nn.Module):
    def __init__(self, weights: list[torch.Tensor], biases: list[torch.Tensor] | None) -> None:
        super().__init__()
        self.weight = _stack(weights)  # runs, out, in
        self.bias = _stack(biases) if biases is not None else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = self.weight
        if holds_one_run(weight):
            return F.linear(x, weight[0], None if self.bias is None else self.bias[0])
        blocks = x.reshape(weight.shape[0], -1, weight.shape[2])
        if self.bias is None:
            out = torch.bmm(blocks, weight.transpose(1, 2))
        else:
            out = torch.baddbmm(self.bias.unsqueeze(1), blocks, weight.transpose(1, 2))
        return out.reshape(*x.shape[:-1], weight.shape[1])


class GroupedAdapter(nn.Module):
    """An adapter (adaptune.model.adapters.Adapter) with each run's projections."""

    def __init__(self, adapter: Adapter, trained: Sequence[Mapping[str, torch.Tensor]], prefix: str) -> None:
        super().__init__()
        self.down, self.up = (GroupedLinear([run[f"{prefix}{name}.weight"] for run in trained], [run[f"{prefix}{name}.bias"] for run in trained])
                              for name in ("down", "up"))
        self.activation = adapter.activation
        self.enabled = adapter.enabled  # the ablation's switch (adapters.set_adapters_enabled), as on the adapter

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        if not self.enabled:
            return hidden_states
        return hidden_states + self.up(self.activation(self.down(hidden_states)))


class GroupedLayerNorm(nn.Module):
    def __init__(self, template: nn.LayerNorm, weights: list[torch.Tensor], biases: list[torch.Tensor], kernel: bool = False) -> None:
        super().__init__()
        self.normalized_shape, self.eps = template.normalized_shape, template.eps
        self.weight = _stack(weights)
        self.bias = _stack(biases)
        self.kernel = kernel  # StepSettings.layer_norm == "kernel": one Triton kernel where the device runs Triton

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight, bias = self.weight, self.bias
        if holds_one_run(weight):
            return F.layer_norm(x, self.normalized_shape, weight[0], bias[0], self.eps)
        if self.kernel and layer_norm_kernel.kernel_applies(x, weight):
            return layer_norm_kernel.grouped_layer_norm(x, weight, bias, self.eps)
        normalized = F.layer_norm(x, self.normalized_shape, None, None, self.eps)
        blocks = normalized.reshape(weight.shape[0], -1, *self.normalized_shape)
        # Not addcmul: its backward writes a copy of `blocks` times its scalar (make bench-attention: 2 more operators a layer).
        return (blocks * weight.unsqueeze(1) + bias.unsqueeze(1)).reshape(x.shape)


class GroupedEmbedding(nn.Module):
    """A trained embedding table per run: run i's block of ids looked up in run i's table, each with the solo
    table's lookup and settings (padding row, norms), one lookup per run (a table is read by token, so the runs'
    lookups cannot be one batched operator; k small gathers beside a step's hundreds of kernels)."""

    def __init__(self, template: nn.Embedding, weights: list[torch.Tensor]) -> None:
        super().__init__()
        self.padding_idx, self.max_norm, self.norm_type = template.padding_idx, template.max_norm, template.norm_type
        self.scale_grad_by_freq, self.sparse = template.scale_grad_by_freq, template.sparse
        self.weight = _stack(weights)  # runs, rows of the table, features

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        weight = self.weight
        if holds_one_run(weight):
            return self._lookup(ids, weight[0])
        blocks = ids.reshape(weight.shape[0], -1, *ids.shape[1:])
        return torch.cat([self._lookup(block, table) for block, table in zip(blocks, weight, strict=True)])

    def _lookup(self, ids: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, table, self.padding_idx, self.max_norm, self.norm_type, self.scale_grad_by_freq, self.sparse)


def _position_ids_per_row(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """BERT's embeddings look positions up once, (1, length), and add them to every row alike; with a table per run,
    each row looks its positions up in its run's table, so the positions come one row per input row."""
    if kwargs.get("position_ids") is None:
        ids = kwargs.get("input_ids", args[0] if args else None)
        rows, length = ids.shape if ids is not None else kwargs["inputs_embeds"].shape[:2]
        start = kwargs.get("past_key_values_length", 0)
        position_ids = module.position_ids
        assert isinstance(position_ids, torch.Tensor)  # group_model hooks only embeddings that hold them
        kwargs["position_ids"] = position_ids[:, start:start + length].expand(rows, length)
    return args, kwargs


def recorded_layer_norm(model: nn.Module) -> str:
    """What a run's record says its trained LayerNorms were: "kernel" where a group's take the kernel (its settings
    ask for it and their device runs Triton), else "torch" (torch's operators; a run alone or in a group of one, or a
    method that trains no LayerNorm)."""
    grouped = [module for module in model.modules() if isinstance(module, GroupedLayerNorm) and not holds_one_run(module.weight)]
    return "kernel" if grouped and grouped[0].kernel and runs_triton(grouped[0].weight) else "torch"


_Part = TypeVar("_Part", bound=nn.Module)


def _peft_part(layer: nn.Module, name: str, kind: type[_Part]) -> _Part:
    """A peft layer's submodule `name`, which peft makes a `kind` (a dict of it by adapter name)."""
    part = layer.get_submodule(name)
    assert isinstance(part, kind), f"{type(layer).__name__}.{name} is a {type(part).__name__}, not peft's {kind.__name__}"
    return part


class GroupedLoRA(nn.Module):
    """peft's LoRA Linear: base(x) + B(A(dropout(x))) * scaling, with each run's A and B."""

    def __init__(self, layer: nn.Module, trained: Sequence[Mapping[str, torch.Tensor]], prefix: str) -> None:
        super().__init__()
        self.base_layer = layer.get_submodule("base_layer")
        self.lora_dropout = _peft_part(layer, "lora_dropout", nn.ModuleDict)
        self.scaling: dict[str, Any] = dict(getattr(layer, "scaling"))  # peft's plain dict: a float by adapter name
        self.lora_A = nn.ModuleDict({name: GroupedLinear([run[f"{prefix}lora_A.{name}.weight"] for run in trained], None)
                                     for name in _peft_part(layer, "lora_A", nn.ModuleDict)})
        self.lora_B = nn.ModuleDict({name: GroupedLinear([run[f"{prefix}lora_B.{name}.weight"] for run in trained], None)
                                     for name in _peft_part(layer, "lora_B", nn.ModuleDict)})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        result = self.base_layer(x)
        for name in self.lora_A:
            result = result + self.lora_B[name](self.lora_A[name](self.lora_dropout[name](x))) * self.scaling[name]
        return result


class GroupedIA3(nn.Module):
    """peft's (IA)3 Linear: the output scaled by each run's vector, or (feed-forward) the input."""

    def __init__(self, layer: nn.Module, trained: Sequence[Mapping[str, torch.Tensor]], prefix: str) -> None:
        super().__init__()
        self.base_layer = layer.get_submodule("base_layer")
        self.is_feedforward: bool = getattr(layer, "is_feedforward")  # peft's plain attribute
        self.ia3_l = nn.ParameterDict({name: _stack([run[f"{prefix}ia3_l.{name}"] for run in trained])
                                       for name in _peft_part(layer, "ia3_l", nn.ParameterDict)})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scaling = None
        for stack in self.ia3_l.values():
            vectors = stack.flatten(1).unsqueeze(1)  # runs, 1, features
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


def group_model(model: nn.Module, trained: Sequence[Mapping[str, torch.Tensor]], settings: StepSettings = StepSettings()) -> nn.Module:
    """Turn a solo model (any one run's: its frozen weights are every run's) into a k-run group, in place:
    each module holding trained tensors is replaced by its grouped form with every run's values (its LayerNorms
    in the form `settings` asks for)."""
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
        elif isinstance(module, Adapter):
            replacements[module_name] = GroupedAdapter(module, trained, prefix)
        elif not any(p.requires_grad for p in module.parameters(recurse=False)):
            continue
        elif isinstance(module, nn.Linear):
            biases = [run[f"{prefix}bias"] for run in trained] if module.bias is not None else None
            replacements[module_name] = GroupedLinear([run[f"{prefix}weight"] for run in trained], biases)
        elif isinstance(module, nn.LayerNorm):
            replacements[module_name] = GroupedLayerNorm(module, [run[f"{prefix}weight"] for run in trained],
                                                         [run[f"{prefix}bias"] for run in trained], settings.layer_norm == "kernel")
        elif isinstance(module, nn.Embedding):
            replacements[module_name] = GroupedEmbedding(module, [run[f"{prefix}weight"] for run in trained])
        else:
            raise GroupingError(f"{kind} {module_name!r} trains parameters that cannot be split by run; train these runs alone")
    model.requires_grad_(False)
    for module_name, replacement in replacements.items():
        parent, _, attribute = module_name.rpartition(".")
        holder = model.get_submodule(parent) if parent else model
        setattr(holder, attribute, replacement)
        for parameter in replacement.parameters():
            parameter.requires_grad_(getattr(parameter, "run_stack", False))
        if attribute == "position_embeddings" and isinstance(replacement, GroupedEmbedding) and len(trained) > 1:
            if not isinstance(getattr(holder, "position_ids", None), torch.Tensor):
                raise GroupingError(f"{type(holder).__name__} {parent!r} trains its position table but has no position_ids "
                                    "to look them up by row; train these runs alone")
            holder.register_forward_pre_hook(_position_ids_per_row, with_kwargs=True)
    grouped = {name for run in run_parameters(model) for name in run}
    if grouped != names:
        raise GroupingError(f"grouping lost trained tensors: {sorted(names ^ grouped)[:5]}")
    return model


def _stacks(model: nn.Module) -> dict[str, nn.Parameter]:
    return {name: parameter for name, parameter in model.named_parameters() if parameter.requires_grad}


def run_parameters(model: nn.Module) -> list[dict[str, nn.Parameter]]:
    """Each run's trained Parameters under their solo names: run i's slice of every stack, a Parameter
    sharing the stack's storage (the same objects on every call, pointed at the stacks' current storage:
    call again after the model moves to another device)."""
    runs: list[dict[str, nn.Parameter]] = []
    for name, stack in _stacks(model).items():
        views = getattr(stack, "run_views", None)
        if views is None:
            views = [nn.Parameter(stack.data[index]) for index in range(stack.shape[0])]
            setattr(stack, "run_views", views)  # a Python attribute of the stack, read back with getattr
        if not runs:
            runs = [{} for _ in views]
        for index, (run, view) in enumerate(zip(runs, views, strict=True)):
            view.data = stack.data[index]
            run[name] = view
    return runs


def move_group_model(model: nn.Module, device: torch.device) -> None:
    """Move a group model to `device`, its stacks still handing each run its gradient. Where a device's tensors cannot
    live in a CPU tensor's Parameter (XLA: nn.Module.to makes new Parameter objects), the new stacks lose the hook and
    marks _stack gave; they get them back here, and run_parameters then makes each run's views on the device."""
    before = _stacks(model)
    model.to(device)
    for name, stack in _stacks(model).items():
        if stack is not before[name]:
            stack.register_post_accumulate_grad_hook(_hand_out_gradient)
            setattr(stack, "run_stack", True)


def keep_runs(model: nn.Module, indices: list[int]) -> None:
    """Keep only these runs in every stack (a diverged run leaves the group); the kept runs' Parameters
    are the same objects, now slices of the smaller stacks, so their optimizers go on unchanged."""
    for stack in _stacks(model).values():
        stack.data = stack.data[indices].clone()
        views = getattr(stack, "run_views", None)
        if views is not None:
            setattr(stack, "run_views", [views[index] for index in indices])
    run_parameters(model)
