"""A group's adapter and LoRA outputs added to their sums in the matmul (adaptune.model.branch_sums) against the
layers' own operators ("separate"): the same values and gradients, the same dtypes, and the solo path where it must
stay. Whole groups trained this way against their runs alone: tests/test_fused_groups.py (the default is in_matmul)."""

from __future__ import annotations

import pytest
import torch
from transformers import BertConfig, BertForSequenceClassification

from adaptune.core.step_settings import BRANCH_SUMS_ENV, STEP_SETTINGS
from adaptune.model.adapters import Adapter
from adaptune.model.methods import apply_method, method_from_dict
from adaptune.model.run_groups import GroupedAdapter, GroupedLoRA, group_model, recorded_branch_sums, trained_tensors
from tests.test_bench_gpu_fused import TINY


def _grouped_adapter(runs: int, size: int, nonlinearity: str) -> GroupedAdapter:
    torch.manual_seed(size)
    adapters = [Adapter(48, size, nonlinearity, init_std=0.1) for _ in range(runs)]
    for adapter in adapters:  # biases away from zero, so that a bias left out shows
        torch.nn.init.normal_(adapter.down.bias)
        torch.nn.init.normal_(adapter.up.bias)
    return GroupedAdapter(adapters[0], [trained_tensors(adapter) for adapter in adapters], "")


def _each_way(module: torch.nn.Module, x: torch.Tensor, monkeypatch: pytest.MonkeyPatch,
              autocast: bool = False) -> dict[str, list[torch.Tensor]]:
    """Output, the input's gradient and every trained tensor's, under each setting, for one weighted loss."""
    results = {}
    for mode in STEP_SETTINGS[BRANCH_SUMS_ENV][1]:
        monkeypatch.setenv(BRANCH_SUMS_ENV, mode)
        for parameter in module.parameters():
            parameter.grad = None
        inputs = x.detach().clone().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            out = module(inputs)
        weights = torch.linspace(-1, 1, out.numel()).reshape(out.shape)
        (out.float() * weights).sum().backward()
        results[mode] = [out.detach(), inputs.grad, *(parameter.grad for parameter in module.parameters())]
    return results


@pytest.mark.parametrize("nonlinearity", ["gelu", "relu", "gelu_new"])
@pytest.mark.parametrize("size", [16, 13])  # a multiple of 8 and not: the bias's column pads up to one either way
def test_an_adapter_group_sums_in_the_matmul_what_its_operators_do(monkeypatch: pytest.MonkeyPatch, nonlinearity: str, size: int) -> None:
    """Float32: equal up to summation order (a float32 step is 1.2e-7 of a value, and the bias's gradient sums 60 rows:
    1e-6 of a value, or absolute near zero; a left-out bias or skip would be off by about 1)."""
    module = _grouped_adapter(3, size, nonlinearity)
    x = torch.randn(3 * 4, 5, 48, generator=torch.Generator().manual_seed(1))
    results = _each_way(module, x, monkeypatch)
    assert len(results["in_matmul"]) == 6  # output, input and the four tensors of the down and up projections
    for fused, separate in zip(results["in_matmul"], results["separate"], strict=True):
        assert fused.dtype == separate.dtype and fused.shape == separate.shape
        torch.testing.assert_close(fused, separate, rtol=1e-6, atol=1e-6)


def test_under_bf16_autocast_a_sum_is_rounded_once_instead_of_twice(monkeypatch: pytest.MonkeyPatch) -> None:
    """bf16 input, as a step's under autocast: the same dtypes; the output within one bf16 step of its magnitude (the
    adapter's operators round the up projection and then the sum, the matmul rounds the sum once), and the
    gradients, which see that output only through their weighted loss, within the same."""
    module = _grouped_adapter(3, 16, "gelu")
    x = torch.randn(3 * 4, 5, 48, generator=torch.Generator().manual_seed(1)).bfloat16()
    results = _each_way(module, x, monkeypatch, autocast=True)
    assert [tensor.dtype for tensor in results["in_matmul"]] == [torch.bfloat16] * 2 + [torch.float32] * 4
    for fused, separate in zip(results["in_matmul"], results["separate"], strict=True):
        assert fused.dtype == separate.dtype
        scale = separate.float().abs().max()
        torch.testing.assert_close(fused.float(), separate.float(), rtol=0, atol=float(scale) * 2**-7)


def test_a_group_of_one_a_switched_off_adapter_and_a_compiled_step_keep_the_adapters_operators(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object) -> None:
        raise AssertionError("summed in the matmul")

    monkeypatch.setattr("adaptune.model.run_groups.grouped_adapter", refuse)
    x = torch.randn(2 * 3, 4, 48)
    alone = _grouped_adapter(1, 8, "gelu")
    assert alone(x).shape == x.shape
    off = _grouped_adapter(2, 8, "gelu")
    off.enabled = False  # adapters.set_adapters_enabled's switch
    assert off(x) is x
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert _grouped_adapter(2, 8, "gelu")(x).shape == x.shape
    monkeypatch.undo()
    with pytest.raises(AssertionError, match="summed in the matmul"):
        monkeypatch.setattr("adaptune.model.run_groups.grouped_adapter", refuse)
        _grouped_adapter(2, 8, "gelu")(x)


def _grouped(method: dict, runs: int = 2) -> torch.nn.Module:
    models = []
    for seed in range(runs):
        torch.manual_seed(seed)
        model = BertForSequenceClassification(BertConfig(**TINY))
        apply_method(model, method_from_dict(method))
        for name, parameter in model.named_parameters():  # LoRA's B starts at zero: make each run's branch count
            if "lora_B" in name:
                torch.nn.init.normal_(parameter)
        models.append(model)
    return group_model(models[0], [trained_tensors(model) for model in models])


def test_a_lora_group_sums_in_the_matmul_what_its_operators_do(monkeypatch: pytest.MonkeyPatch) -> None:
    model = _grouped({"name": "lora"})
    layers = [module for module in model.modules() if isinstance(module, GroupedLoRA)]
    assert layers
    x = torch.randn(2 * 3, 5, TINY["hidden_size"], generator=torch.Generator().manual_seed(2))
    results = _each_way(layers[0], x, monkeypatch)
    for fused, separate in zip(results["in_matmul"], results["separate"], strict=True):
        torch.testing.assert_close(fused, separate, rtol=1e-6, atol=1e-6)
    assert (results["in_matmul"][0] - layers[0].base_layer(x)).abs().max() > 0.1  # the branches did add something


def test_records_say_where_a_group_made_its_sums(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(BRANCH_SUMS_ENV, raising=False)
    assert recorded_branch_sums(_grouped({"name": "adapters", "size": 8})) == "in_matmul"
    assert recorded_branch_sums(_grouped({"name": "lora"})) == "in_matmul"
    assert recorded_branch_sums(_grouped({"name": "adapters", "size": 8}, runs=1)) == "separate"
    assert recorded_branch_sums(_grouped({"name": "layernorm"})) == "separate"
    assert recorded_branch_sums(_grouped({"name": "adapters", "size": 8}), compiled=True) == "separate"
    monkeypatch.setenv(BRANCH_SUMS_ENV, "separate")
    assert recorded_branch_sums(_grouped({"name": "adapters", "size": 8})) == "separate"
    monkeypatch.setenv(BRANCH_SUMS_ENV, "fused")
    with pytest.raises(ValueError, match=f"^{BRANCH_SUMS_ENV}='fused' is not a way to add a group's adapter and LoRA outputs"):
        recorded_branch_sums(torch.nn.Linear(2, 2))


def test_the_census_counts_fewer_bytes_and_no_more_operators_with_sums_in_the_matmul() -> None:
    """make bench-attention's last configuration against the one before it, a one-layer BERT-base-width step at 16 tokens:
    an adapter's sum and its input's summed gradient are each a full-width pass less (at 128 tokens, 0.578 GiB a layer
    to 0.534, bench/attention_kernel.json); the bias's column of ones and the weights' costs small operators for the
    full-width ones saved."""
    from adaptune.bench.attention import CONFIGURATIONS, step_census

    separate, in_matmul = list(CONFIGURATIONS)[-2:]
    assert CONFIGURATIONS[separate][BRANCH_SUMS_ENV] == "separate" and CONFIGURATIONS[in_matmul][BRANCH_SUMS_ENV] == "in_matmul"
    (separate_ops, separate_bytes), (in_matmul_ops, in_matmul_bytes) = (step_census(1, 2, 16, name) for name in (separate, in_matmul))
    assert in_matmul_ops <= separate_ops and in_matmul_bytes < 0.97 * separate_bytes
