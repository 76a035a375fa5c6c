"""Parameter accounting against the formula, DESIGN.md's measured fact and the paper's own figures."""

from __future__ import annotations

import pytest
import torch
from transformers import BertConfig, BertForSequenceClassification

from adaptune.model.backbone import load_model
from adaptune.model.methods import AdaptersConfig, LayerNormConfig, TopKConfig, apply_method
from adaptune.model.params import ParameterCount, count_parameters, total_size_multiple


def bert_base_on_meta() -> torch.nn.Module:
    """BERT-base's shapes without allocating its weights (only counts are needed)."""
    with torch.device("meta"):
        return BertForSequenceClassification(BertConfig())


def test_counts_on_the_embedded_backbone(backbone_path) -> None:
    model = load_model(backbone_path, "classification", num_labels=2)
    before = count_parameters(model)
    # 22,713,986 in the checkpoint, less its untrained pooler (384*384 + 384), replaced by mean pooling.
    assert before == ParameterCount(total=22_566_146, trained=22_566_146, trained_percent=100.0)
    apply_method(model, AdaptersConfig(size=64))
    after = count_parameters(model)
    d, m, adapters = 384, 64, 2 * 6
    assert after.total == before.total + adapters * (2 * m * d + d + m)
    assert after.trained == 605_954  # DESIGN.md: same as AdapterHub's Houlsby config with LayerNorms unfrozen
    assert after.trained_percent == pytest.approx(100 * 605_954 / after.total)


def test_paper_bert_base_figures() -> None:
    # Section 3.4: LayerNorm-only tuning trains "40k" parameters on BERT-base.
    layernorm = count_parameters(apply_method(bert_base_on_meta(), LayerNormConfig()))
    assert round(layernorm.trained, -3) == 40_000
    # Section 3.5: adapters of size 64 train about 2% of the parameters.
    adapters = count_parameters(apply_method(bert_base_on_meta(), AdaptersConfig(size=64)))
    assert round(adapters.trained_percent) == 2
    # Top-k with k = all 12 layers is full fine-tuning: everything trains, the embeddings included.
    top_all = count_parameters(apply_method(bert_base_on_meta(), TopKConfig(k=12)))
    assert top_all.trained == top_all.total
    # One layer fewer leaves the embeddings and the lowest layer frozen.
    top_11 = count_parameters(apply_method(bert_base_on_meta(), TopKConfig(k=11)))
    model = bert_base_on_meta()
    frozen = sum(p.numel() for module in (model.bert.embeddings, model.bert.encoder.layer[0]) for p in module.parameters())
    assert top_11.trained == top_11.total - frozen


def test_total_size_multiple_full_fine_tuning_matches_paper() -> None:
    base = 330_000_000  # BERT-large, as the paper states
    assert total_size_multiple([base] * 9, base, shares_backbone=False) == 9.0  # Table 1, 9 GLUE tasks
    assert total_size_multiple([base] * 17, base, shares_backbone=False) == 17.0  # Table 2


@pytest.mark.parametrize(
    ("percent_per_task", "tasks", "digits", "paper"),
    [(3.6, 9, 1, 1.3), (2.1, 9, 1, 1.2), (1.14, 17, 2, 1.19)],
    ids=["table1-adapters-8-256", "table1-adapters-64", "table2-adapters"],
)
def test_total_size_multiple_shared_backbone_matches_paper(percent_per_task: float, tasks: int, digits: int, paper: float) -> None:
    base = 110_000_000
    per_task = round(base * percent_per_task / 100)
    assert round(total_size_multiple([per_task] * tasks, base, shares_backbone=True), digits) == paper


def test_total_size_multiple_sums_uneven_tasks() -> None:
    assert total_size_multiple([10, 30], 100, shares_backbone=True) == pytest.approx(1.4)


def test_total_size_multiple_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="one trained-parameter count per task"):
        total_size_multiple([], 100, shares_backbone=True)
    with pytest.raises(ValueError, match="base_params must be positive"):
        total_size_multiple([1], 0, shares_backbone=True)
    with pytest.raises(ValueError, match=">= 0"):
        total_size_multiple([-1], 10, shares_backbone=False)
