"""Compact task checkpoints: only what a method trained, plus what is needed to rebuild the rest.

A checkpoint directory holds
  task.safetensors  every parameter with requires_grad (the adapters, LayerNorms and head for the
                    adapters method; the whole model for full fine-tuning)
  task.json         the method dict, the backbone name, the model class, task kind, num_labels and
                    free-form metadata
Loading builds a fresh copy of the backbone, applies the method and loads these tensors on top; the
frozen parameters come from the backbone itself.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from safetensors.torch import load_file, save_file
from torch import nn
from transformers import PreTrainedModel

from adaptune.core.backbones import DEFAULT_BACKBONE
from adaptune.core.errors import UserError
from adaptune.core.files import atomic_write
from adaptune.model.backbone import embedded_backbone_path, load_model, task_kind_of
from adaptune.model.methods import apply_method, method_from_dict

WEIGHTS_FILE = "task.safetensors"
INFO_FILE = "task.json"
FORMAT_VERSION = 1


class CheckpointError(UserError, ValueError):
    """A task checkpoint is missing, incomplete or does not fit the model rebuilt from it."""


def save_task_checkpoint(
    model: nn.Module,
    method_cfg: Any,
    backbone: str,
    out_dir: str | os.PathLike[str],
    metadata: dict[str, Any] | None = None,
) -> Path:
    """Write the trained parameters and task.json into out_dir (created if needed); returns out_dir."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    trained = {name: parameter.detach().cpu().contiguous() for name, parameter in model.named_parameters() if parameter.requires_grad}
    if not trained:
        raise CheckpointError(f"{type(model).__name__} has no parameter with requires_grad; apply a method before saving")
    if not isinstance(model, PreTrainedModel):  # peft's methods are injected in place: the model keeps its class
        raise CheckpointError(f"{type(model).__name__} is not a transformers model: a task checkpoint rebuilds one (load_model)")
    num_labels = model.config.num_labels
    assert num_labels is not None  # None only where config.id2label is unset; load_model's models all label their outputs
    info = {
        "format_version": FORMAT_VERSION,
        "method": method_cfg.to_dict(),
        "backbone": _portable_backbone_name(backbone),
        "model_class": type(model).__name__,
        "task_kind": task_kind_of(model),
        "num_labels": int(num_labels),
        "trained_params": sum(tensor.numel() for tensor in trained.values()),
        "metadata": metadata or {},
    }
    try:
        info_text = json.dumps(info, indent=2, sort_keys=True)
    except TypeError as error:
        raise CheckpointError(f"checkpoint metadata must be JSON-serialisable: {error}") from None
    # Write beside the target then rename, so a preempted save never leaves a half-written file.
    atomic_write(out / WEIGHTS_FILE, lambda path: save_file(trained, str(path), metadata={"format": "pt"}))
    atomic_write(out / INFO_FILE, lambda path: path.write_text(info_text + "\n"))
    return out


def load_task_checkpoint(checkpoint_dir: str | os.PathLike[str], backbone: str | None = None) -> tuple[nn.Module, Any, dict[str, Any]]:
    """Rebuild (model in eval mode, method config, task.json dict); `backbone` overrides the saved name."""
    directory = Path(checkpoint_dir)
    info_path, weights_path = directory / INFO_FILE, directory / WEIGHTS_FILE
    for path in (info_path, weights_path):
        if not path.is_file():
            raise CheckpointError(f"{path} not found: {directory} is not a task checkpoint (expected {INFO_FILE} and {WEIGHTS_FILE})")
    info = json.loads(info_path.read_text())
    method_cfg = method_from_dict(info["method"])
    model = load_model(backbone or info["backbone"], info["task_kind"], num_labels=info["num_labels"])
    apply_method(model, method_cfg)

    tensors = load_file(str(weights_path))
    expected = {name for name, parameter in model.named_parameters() if parameter.requires_grad}
    missing, unexpected = sorted(expected - set(tensors)), sorted(set(tensors) - expected)
    if missing or unexpected:
        raise CheckpointError(
            f"{weights_path} does not fit {type(model).__name__} with method {info['method']}: "
            f"missing {len(missing)} trained tensor(s) {missing[:5]}, unexpected {len(unexpected)} {unexpected[:5]}; "
            "was it saved from a different backbone or method?"
        )
    model.load_state_dict(tensors, strict=False)  # strict=False only because frozen weights come from the backbone
    model.eval()
    return model, method_cfg, info


def _portable_backbone_name(backbone: str) -> str:
    """Store the embedded backbone by name, not by this machine's site-packages path. Where its package is
    not installed (a GPU image that trains BERT from a staged copy), no path can be it."""
    return DEFAULT_BACKBONE if backbone == embedded_backbone_path() else backbone
