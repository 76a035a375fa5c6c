"""Mean pooling for a model exported by adaptune: copied byte for byte, as `mean_pooling.py`, into every export
folder whose run pooled so (`python -m adaptune export`). adaptune imports it only for its file path and the head's
registered name (serve.export, serve.export_adapterhub): its functions run where the export is loaded, not here.

Why it is needed: all-MiniLM-L6-v2 was trained with mean pooling, and the first-token pooler it ships never took a
training step, so adaptune's runs read the attention-masked mean of the last hidden states in its place (the head
rule in adaptune/model/backbone.py). The exported task head expects that mean; the library's standard head reads
the pooler or the first token and would give other logits. This file gives the same mean, computed in the same
order as adaptune's MeanPooler, to a model loaded without adaptune. It needs only torch, and `adapters` for
register_adapterhub_head.

    from mean_pooling import use_mean_pooling            # transformers or peft: before PeftModel.from_pretrained
    use_mean_pooling(model)
    from mean_pooling import register_adapterhub_head    # AdapterHub: before model.load_adapter(folder)
    register_adapterhub_head(model)
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

# The head_type an AdapterHub export's head_config.json names where the run pooled by mean.
ADAPTERHUB_HEAD_TYPE = "adaptune_mean_pooling_classification"


def masked_mean(hidden_states: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
    """The mean of the hidden states over the tokens the attention mask keeps (every token without a mask)."""
    if attention_mask is None:
        return hidden_states.mean(dim=1)
    weights = attention_mask[:, : hidden_states.shape[1]].to(hidden_states.dtype).unsqueeze(-1)
    return (hidden_states * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1.0)


class MeanPooler(nn.Module):
    """Stands in for the base model's pooler (no parameters). The base model hands its pooler the hidden states
    only, so a pre-hook on the base model gives it each call's attention mask first."""

    def __init__(self) -> None:
        super().__init__()
        self.attention_mask: torch.Tensor | None = None

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        mask, self.attention_mask = self.attention_mask, None  # used once: no tensor kept between calls
        return masked_mean(hidden_states, mask)


def use_mean_pooling(model: nn.Module) -> nn.Module:
    """In place: a transformers *ForSequenceClassification model (BERT family) classifies the masked mean of its
    last hidden states instead of its pooler's output. Call it on the base model before wrapping it (peft)."""
    base = getattr(model, "base_model", model)
    base.pooler = MeanPooler()
    base.register_forward_pre_hook(_hand_mask_to_pooler, with_kwargs=True)
    return model


def _hand_mask_to_pooler(module: nn.Module, args: tuple, kwargs: dict) -> None:
    pooler = getattr(module, "pooler", None)
    if isinstance(pooler, MeanPooler):
        pooler.attention_mask = kwargs["attention_mask"] if "attention_mask" in kwargs else (args[1] if len(args) > 1 else None)


def register_adapterhub_head(model: Any) -> None:
    """Register, on an `adapters` AutoAdapterModel, the head type an AdapterHub export names: AdapterHub's own
    classification head (the same Dropout and Linear, the same parameter names) reading the masked mean."""
    from adapters.heads import ClassificationHead  # type: ignore[import-not-found]

    class MeanPoolingClassificationHead(ClassificationHead):
        def forward(self, outputs: Any, cls_output: Any = None, attention_mask: Any = None, return_dict: bool = False,
                    **kwargs: Any) -> Any:
            if cls_output is None:
                cls_output = masked_mean(outputs[0], attention_mask)
            return super().forward(outputs, cls_output, attention_mask, return_dict, **kwargs)

    model.register_custom_head(ADAPTERHUB_HEAD_TYPE, MeanPoolingClassificationHead)
