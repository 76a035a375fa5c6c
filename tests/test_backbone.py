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
