"""A fused group's runs start from one loaded encoder (adaptune.model.backbone.fresh_head_copy): each run's copy
must start exactly as load_model would start it alone, since the run's result must not depend on its group."""

from __future__ import annotations

import pytest
import torch
from transformers import set_seed

from adaptune.model.backbone import fresh_head_copy, load_model
from adaptune.model.methods import apply_method, method_from_dict


@pytest.mark.parametrize(("kind", "labels"), [("classification", 2), ("classification", 3), ("regression", 1), ("span", 2)])
def test_a_fresh_head_copy_starts_as_load_model_does_after_the_same_seed(kind: str, labels: int) -> None:
    set_seed(11)
    alone = load_model(None, kind, labels)
    generator_after_load = torch.get_rng_state()
    loaded = load_model(None, kind, labels)  # under another generator state: its head differs
    set_seed(11)
    copied = fresh_head_copy(loaded)
    assert copied is not None and torch.equal(torch.get_rng_state(), generator_after_load)
    tensors, own = dict(copied.named_parameters()), dict(alone.named_parameters())
    assert tensors.keys() == own.keys()
    assert all(torch.equal(tensors[name], own[name]) for name in own)
    heads = {name for name, tensor in loaded.named_parameters() if tensor is not tensors[name]}
    assert heads and all(name.split(".")[0] in ("classifier", "qa_outputs") for name in heads)  # only the head was drawn
    assert not all(torch.equal(tensor, tensors[name]) for name, tensor in loaded.named_parameters() if name in heads)


def test_a_method_applied_to_a_copy_leaves_the_loaded_model_as_it_was() -> None:
    loaded = load_model(None, "classification", 2)
    before = {name: tensor.clone() for name, tensor in loaded.state_dict().items()}
    copied = fresh_head_copy(loaded)
    apply_method(copied, method_from_dict({"name": "adapters", "size": 8}))
    assert any("adapter" in name for name in copied.state_dict())
    after = loaded.state_dict()
    assert after.keys() == before.keys() and all(torch.equal(after[name], before[name]) for name in before)


@pytest.mark.parametrize("checkpoint", ["encoder", "with_its_own_head"])
def test_a_groups_runs_start_as_load_model_starts_each_alone(checkpoint: str, tmp_path) -> None:
    """group_loop's runs' models, one load for the group: each equals load_model after its run's set_seed, the generator
    left where load_model leaves it. A checkpoint that holds its own head (a fine-tuned model as the backbone) draws
    nothing, so a fresh head would be wrong there: every run loads it, and the runs share nothing."""
    from transformers import BertConfig, BertForSequenceClassification

    from adaptune.train.group_loop import _models_as_alone

    backbone = None
    if checkpoint == "with_its_own_head":
        backbone = str(tmp_path / "tiny")
        torch.manual_seed(0)
        BertForSequenceClassification(BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                                 intermediate_size=64)).save_pretrained(backbone)
    seeds = [3, 5, 8]
    models = []
    for seed, model in zip(seeds, _models_as_alone(backbone, "classification", 2, seeds), strict=True):
        generator = torch.get_rng_state()
        set_seed(seed)
        alone = load_model(backbone, "classification", 2)
        assert torch.equal(generator, torch.get_rng_state())
        assert all(torch.equal(tensor, dict(alone.named_parameters())[name]) for name, tensor in model.named_parameters())
        models.append(model)
    shared = models[0].bert.embeddings.word_embeddings.weight is models[1].bert.embeddings.word_embeddings.weight
    assert shared == (checkpoint == "encoder")
