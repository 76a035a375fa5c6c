"""Frozen query, key and value projections as one stacked matmul (adaptune.model.frozen_projections): the
same model, the same outputs and gradients, only where all three are frozen.

The embedded backbone (MiniLM, 6 layers), float32 on the CPU, dropout off. The stacked matmul computes
each output column as the separate one does, so the logits come out equal to float32 rounding (1e-6); the
input's gradient is one matmul over 3 x hidden where it was three summed, a different reduction order, so
the trained tensors' gradients agree to 1e-5 relative (measured: 2e-6), far below what a wrong projection,
bias or head split gives (order 1).
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from adaptune.core.step_settings import PROJECTIONS_ENV
from adaptune.model.backbone import load_model
from adaptune.model.frozen_projections import stack_frozen_projections
from adaptune.model.methods import apply_method, parse_method


def _model(method: str) -> nn.Module:
    torch.manual_seed(0)
    model = load_model(None, "classification", num_labels=2)
    apply_method(model, parse_method(method))
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.p = 0.0
    return model.train()


def _batch() -> dict[str, torch.Tensor]:
    ids = torch.randint(1000, 5000, (4, 20), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, 12:] = 0  # a padded row: the additive mask goes through the stacked path too
    return {"input_ids": ids, "attention_mask": mask, "labels": torch.tensor([0, 1, 1, 0])}


def _logits_and_gradients(model: nn.Module) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    out = model(**_batch())
    out.loss.backward()
    return out.logits.detach(), {name: p.grad.clone() for name, p in model.named_parameters() if p.requires_grad}


def _stacked_layers(model: nn.Module) -> list[bool]:
    return [hasattr(layer.attention.self, "stacked_projection_weight") for layer in model.base_model.encoder.layer]


@pytest.mark.parametrize("method", ["adapters:8", "layernorm", "top_k:2"])
def test_stacked_projections_compute_what_separate_ones_do(method: str) -> None:
    separate = _model(method)
    stacked = copy.deepcopy(separate)
    stack_frozen_projections(stacked)
    logits, gradients = _logits_and_gradients(separate)
    stacked_logits, stacked_gradients = _logits_and_gradients(stacked)
    torch.testing.assert_close(stacked_logits, logits, rtol=0, atol=1e-6)
    assert stacked_gradients.keys() == gradients.keys()
    for name, gradient in gradients.items():
        scale = gradient.abs().max().clamp(min=1e-12)
        assert float((stacked_gradients[name] - gradient).abs().max() / scale) < 1e-5, name


@pytest.mark.parametrize(("method", "stacked"), [
    ("adapters:8", [True] * 6),
    ("pfeiffer:8", [True] * 6),
    ("top_k:2", [True] * 4 + [False] * 2),  # the top two layers' projections train
    ("full", [False] * 6),
    ("lora", [False] * 6),  # peft wraps query and value
])
def test_only_layers_whose_three_projections_are_frozen_linears_stack(method: str, stacked: list[bool]) -> None:
    model = _model(method)
    names = set(model.state_dict())
    assert stack_frozen_projections(model) == sum(stacked)
    assert _stacked_layers(model) == stacked
    assert set(model.state_dict()) == names  # the stacked copy is never saved; the projections keep their names
    assert stack_frozen_projections(model) == 0  # once


def test_separate_setting_leaves_the_model_as_transformers_built_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PROJECTIONS_ENV, "separate")
    model = _model("adapters:8")
    assert stack_frozen_projections(model) == 0
    assert type(model.base_model.encoder.layer[0].attention.self).__name__ == "BertSelfAttention"
    monkeypatch.setenv(PROJECTIONS_ENV, "stackd")
    with pytest.raises(ValueError, match="ADAPTUNE_PROJECTIONS='stackd' is not .*stacked, separate"):
        stack_frozen_projections(model)


def test_stacked_model_casts_copies_and_evaluates() -> None:
    """A deep copy keeps the stacked forward, a cast carries the stacked buffers, evaluation runs it too."""
    model = _model("adapters:8")
    stack_frozen_projections(model)
    copied = copy.deepcopy(model).eval()
    assert _stacked_layers(copied) == [True] * 6
    with torch.no_grad():
        expected = model.eval()(**_batch()).logits
        torch.testing.assert_close(copied(**_batch()).logits, expected, rtol=0, atol=0)
    halved = copied.to(torch.bfloat16)
    assert halved.base_model.encoder.layer[0].attention.self.stacked_projection_weight.dtype == torch.bfloat16


def test_stacked_step_dispatches_fewer_operators_per_example() -> None:
    """The benchmark's entry (make bench-projections) on a small batch: per layer the forward pass loses two
    matmuls (and under bf16 autocast two casts), the backward two matmuls and their sums."""
    from adaptune.bench.fused import PROJECTION_GROUP_SIZES, measure_stacked_projections
    from adaptune.core.devices import pick_device

    ids = torch.randint(1000, 5000, (8, 16), generator=torch.Generator().manual_seed(0))
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "token_type_ids": torch.zeros_like(ids),
             "labels": torch.randint(0, 2, (8,), generator=torch.Generator().manual_seed(1))}
    entries = measure_stacked_projections(batch, pick_device(cpu_precision="float32"), repeats=1)["stacked_projections"]
    assert [entry["k"] for entry in entries if entry["precision"] == "float32"] == list(PROJECTION_GROUP_SIZES)
    for entry in entries:
        ops = entry["ops_per_example"]
        # 6 layers x (2 forward matmuls + 2 backward matmuls + 2 sums) fewer, per step of 8 x k examples
        assert ops["separate"] - ops["stacked"] >= 6 * 6 / (8 * entry["k"]) - 1e-6, entry
        assert entry["examples_per_s"]["stacked"] > 0 and entry["speedup"] > 0
