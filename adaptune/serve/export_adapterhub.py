"""Houlsby and Pfeiffer adapter runs in the format of AdapterHub's `adapters` library (1.3): `model.load_adapter(folder)`
on an AutoAdapterModel of the same backbone loads the adapter and the task head.

    adapter_config.json      the bottleneck config (BnConfig, every field, as adapters 1.3's save_adapter writes it)
    pytorch_adapter.bin      the adapter weights under adapters' names (...attention.output.adapters.<task>.adapter_down.0.weight)
    head_config.json         the task head: one Dropout and one Linear (layers=1), as adaptune's classifier
    pytorch_model_head.bin   its weights (heads.<task>.1.weight)
    layer_norms.safetensors  the backbone's LayerNorms as the run trained them (see below)

How adaptune's adapter maps onto AdapterHub's (read from adapters 1.3, methods/modeling.py Adapter.pre_forward,
forward, post_forward): with original_ln_before false, residual_before_ln true and original_ln_after true, a sublayer
computes LayerNorm(h + up(act(down(h))) + residual) for h = dropout(dense(x)), exactly adaptune's DropoutThenAdapter
(adaptune/model/adapters.py); scaling 1.0, no adapter LayerNorms, no gating, no adapter dropout. Houlsby puts one after
the attention block and one after the feed-forward block (mh_adapter, output_adapter); adaptune's pfeiffer placement
keeps that position at the feed-forward block only: not AdapterHub's seq_bn config, which adds the residual and
applies the LayerNorm before its adapter (original_ln_before true).

The LayerNorms: adaptune trains every LayerNorm with the adapters (as the paper does). AdapterHub's adapter has no
place for them: original_ln_after applies the backbone's own LayerNorm module, and no config combination trains one
after the residual add (ln_after is a new LayerNorm inside the adapter, before that add). So they travel beside the
adapter, under the model's own parameter names, and the card loads them with load_state_dict. adapters' loader would
also take them from pytorch_adapter.bin (it loads every key the model has), but silently, into the backbone that
every other adapter on the model shares: a separate file keeps that step explicit.

The head: adaptune's classifier reads BERT's pooler where it was pre-trained (use_pooler, AdapterHub's standard
classification head), else the masked mean of the last hidden states (all-MiniLM-L6-v2: the head rule in
adaptune/model/backbone.py), which no standard AdapterHub head computes: the export names a custom head type,
registered from the folder's mean_pooling.py before load_adapter.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from torch import nn

from adaptune.model.adapters import Adapter, DropoutThenAdapter
from adaptune.serve.export_formats import (
    ExportedRun,
    ExportError,
    WrittenFormat,
    load_code,
)
from adaptune.serve.export_pooling import ADAPTERHUB_HEAD_TYPE

ADAPTERS_VERSION = "1.3.0"  # the adapters release whose format this writes (tests/adapterhub loads it with it)
ADAPTER_MODEL_CLASSES = {"bert": "BertAdapterModel"}  # model_type -> adapters' flex-head class (the head loader checks it)
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "pytorch_adapter.bin"  # what load_adapter(folder) reads by default (use_safetensors=False)
HEAD_CONFIG = "head_config.json"
HEAD_WEIGHTS = "pytorch_model_head.bin"
LAYER_NORMS = "layer_norms.safetensors"
PROJECTIONS = {"down": "adapter_down.0", "up": "adapter_up"}  # adaptune's Adapter -> adapters' Adapter (down is Sequential)


def write_adapterhub(run: ExportedRun, folder: Path) -> WrittenFormat:
    model_type = run.model.config.model_type
    if model_type not in ADAPTER_MODEL_CLASSES:
        raise ExportError(f"run {run.run['run_id']}: AdapterHub export supports backbones of model type "
                          f"{', '.join(ADAPTER_MODEL_CLASSES)}, whose classifier is one Linear; {run.run['backbone']!r} is {model_type!r}")
    adapter, head, layer_norms = _split_trained(run)
    meta = {"hidden_size": run.model.config.hidden_size, "model_class": ADAPTER_MODEL_CLASSES[model_type], "model_name": run.base_model,
            "model_type": model_type, "name": run.task.name, "version": f"adapters.{ADAPTERS_VERSION}"}
    (folder / ADAPTER_CONFIG).write_text(json.dumps({"config": bottleneck_config(run), **meta}, indent=2, sort_keys=True) + "\n")
    (folder / HEAD_CONFIG).write_text(json.dumps({"config": head_config(run), **meta}, indent=2, sort_keys=True) + "\n")
    torch.save(adapter, folder / ADAPTER_WEIGHTS)
    torch.save(head, folder / HEAD_WEIGHTS)
    save_file(layer_norms, str(folder / LAYER_NORMS), metadata={"format": "pt"})

    model_lines = [
        f'model = AutoAdapterModel.from_pretrained("{run.base_model}")',
        *(["from mean_pooling import register_adapterhub_head", "register_adapterhub_head(model)  # the head type head_config.json names"]
          if run.mean_pooling else []),
        "model.load_adapter(folder, set_active=True)  # the adapter and its task head",
        "# the backbone's LayerNorms as the run trained them: AdapterHub's adapter has no place for them",
        f'missing, unexpected = model.load_state_dict(load_file(f"{{folder}}/{LAYER_NORMS}"), strict=False)',
        "assert not unexpected, unexpected",
    ]
    code = load_code(run, model_lines, ["from adapters import AutoAdapterModel", "from safetensors.torch import load_file"])
    placement = ("after the attention block and after the feed-forward block (AdapterHub's double_seq_bn placement)"
                 if run.method.name == "adapters" else
                 "after the feed-forward block only, at Houlsby's position: not AdapterHub's seq_bn (Pfeiffer) config, which "
                 "adds the residual and applies the LayerNorm before its adapter")
    notes = [
        f"The adapter: a bottleneck of {run.method.size} ({run.method.nonlinearity}, reduction_factor "
        f"{bottleneck_config(run)['reduction_factor']} of {run.model.config.hidden_size}), inside each sublayer before its "
        f"residual add and LayerNorm (original_ln_before false, residual_before_ln true, original_ln_after true), {placement}.",
        f"The LayerNorms: adaptune trains the backbone's LayerNorms with the adapters, as the paper does. AdapterHub's adapter "
        f"has no place for them, so `{LAYER_NORMS}` holds them ({len(layer_norms)} tensors, under the model's own names): "
        "without it the logits are not the run's. It changes the backbone's LayerNorms, which every adapter on the model "
        "shares: give each adaptune adapter its own model.",
    ]
    if run.mean_pooling:
        notes.append(f"The head: AdapterHub's {_head_words(run)} (one Dropout, one Linear) reading the attention-masked mean of "
                     f"the last hidden states, as the run did, instead of the backbone's pooler, which {run.base_model} never "
                     f"trained: head type `{ADAPTERHUB_HEAD_TYPE}`, registered from this folder's `mean_pooling.py` before "
                     "load_adapter. AdapterHub's standard head reads the first token and would give other logits.")
    else:
        notes.append(f"The head: AdapterHub's {_head_words(run)} on the backbone's pre-trained pooler (use_pooler), as the run's.")
    return WrittenFormat(
        format="adapterhub", library_name="adapter-transformers",
        tags=("adapter-transformers", "adapters", "houlsby" if run.method.name == "adapters" else "pfeiffer"),
        files={ADAPTER_CONFIG: "the bottleneck adapter's config (adapters 1.3 BnConfig)",
               ADAPTER_WEIGHTS: f"the adapter weights ({len(adapter)} tensors)",
               HEAD_CONFIG: "the task head's config", HEAD_WEIGHTS: "the task head's weights",
               LAYER_NORMS: "the backbone's LayerNorms as the run trained them"},
        loading="\n\n".join([code, *notes]),
        details={"adapter_name": run.task.name, "layer_norms": LAYER_NORMS, "adapters_version": ADAPTERS_VERSION},
    )


def bottleneck_config(run: ExportedRun) -> dict[str, Any]:
    """adapters 1.3's BnConfig, every field as its save_adapter writes them, set to what adaptune computes."""
    hidden, size = int(run.model.config.hidden_size), int(run.method.size)
    reduction: float = hidden / size
    if reduction.is_integer():
        reduction = int(reduction)
    if int(hidden // reduction) != size:  # adapters sizes the bottleneck as int(hidden // reduction_factor)
        raise ExportError(f"run {run.run['run_id']}: an adapter of size {size} on hidden size {hidden} has no reduction_factor "
                          "that AdapterHub sizes back to it")
    return {
        "adapter_residual_before_ln": False, "cross_adapter": False, "dropout": 0.0, "factorized_phm_W": True,
        "factorized_phm_rule": False, "hypercomplex_nonlinearity": "glorot-uniform",
        # adaptune's init (truncated normal, std init_std) is adapters' "houlsby" at std 1e-2; it matters only for training on
        "init_weights": "houlsby" if run.method.init_std == 1e-2 else "bert", "init_weights_seed": None,
        "inv_adapter": None, "inv_adapter_reduction_factor": None, "is_parallel": False, "learn_phm": True, "leave_out": [],
        "ln_after": False, "ln_before": False, "mh_adapter": run.method.name == "adapters", "non_linearity": run.method.nonlinearity,
        "original_ln_after": True, "original_ln_before": False, "output_adapter": True, "phm_bias": True, "phm_c_init": "normal",
        "phm_dim": 4, "phm_init_range": 0.0001, "phm_layer": False, "phm_rank": 1, "reduction_factor": reduction,
        "residual_before_ln": True, "scaling": 1.0, "shared_W_phm": False, "shared_phm_rule": True, "stochastic_depth": 0.0,
        "use_gating": False,
    }


def head_config(run: ExportedRun) -> dict[str, Any]:
    """A ClassificationHead of one layer (Dropout, then Linear: adaptune's dropout and classifier), num_labels 1 for regression."""
    labels = {name: index for index, name in enumerate(run.labels)} if run.labels else None
    return {"activation_function": None, "bias": True, "dropout_prob": None,
            "head_type": ADAPTERHUB_HEAD_TYPE if run.mean_pooling else "classification",
            "label2id": labels, "layers": 1, "num_labels": run.num_labels, "use_pooler": not run.mean_pooling}


def _split_trained(run: ExportedRun) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """The run's trained tensors under adapters' names: (adapter, head, LayerNorms); anything else is an error."""
    modules = dict(run.model.named_modules())
    heads = {name for name, module in run.model.named_children() if module is not run.model.base_model}
    adapter, head, layer_norms = {}, {}, {}
    for name, parameter in run.model.named_parameters():
        if not parameter.requires_grad:
            continue
        tensor = parameter.detach().cpu().clone().contiguous()  # its own storage: torch.save writes whole storages
        owner, _, leaf = name.rpartition(".")
        parent, _, projection = owner.rpartition(".")
        if isinstance(modules.get(parent), Adapter) and projection in PROJECTIONS:
            point = parent.removesuffix(".dropout.adapter")
            if point == parent or not isinstance(modules.get(point + ".dropout"), DropoutThenAdapter):
                raise ExportError(f"run {run.run['run_id']}: adapter {parent} is not where adaptune inserts adapters")
            adapter[f"{point}.adapters.{run.task.name}.{PROJECTIONS[projection]}.{leaf}"] = tensor
        elif isinstance(modules.get(owner), nn.LayerNorm):
            layer_norms[name] = tensor
        elif owner in heads and isinstance(modules[owner], nn.Linear):
            head[f"heads.{run.task.name}.1.{leaf}"] = tensor
        else:
            raise ExportError(f"run {run.run['run_id']}: trained tensor {name} is neither an adapter's, a LayerNorm's nor the "
                              "head's: AdapterHub has no place for it")
    return adapter, head, layer_norms


def _head_words(run: ExportedRun) -> str:
    """AdapterHub's classification head type, which with one output is a regression head: named as what it is."""
    return "classification head with one output: a regression head" if run.task.kind == "regression" else "classification head"
