"""The grouped LayerNorm kernel (adaptune.fused.kernels.layer_norm, ADAPTUNE_LAYER_NORM=kernel) against the torch operators
it replaces (run_groups.GroupedLayerNorm's "torch" path), on the CPU under Triton's interpreter (TRITON_INTERPRET=1: the
kernel's own code, run by numpy, program by program). A lent GPU's call checks bf16 there (`make bench-gpu`'s
--layer-norm-check, bench.gpu_fused.layer_norm_kernel_matches).

Tolerances: both compute the statistics in float32 over the same values, in different summation orders, so outputs and
the input's gradient agree to float32 rounding (observed: 2e-6 on outputs of magnitude 10); the scales' and shifts'
gradients sum over a run's rows in another order (the kernel by spans of rows, then the spans) and agree to 1e-5 relative
(observed: 1e-6). A wrong run's scale, a row off, or a dropped term of the backward pass moves them by order 1.
"""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path

import pytest
import torch
from transformers import BertConfig, BertForSequenceClassification

import adaptune.fused.kernels
from adaptune.core.devices import Device
from adaptune.fused.kernels import layer_norm as layer_norm_kernel
from adaptune.fused.run_groups import GroupedLayerNorm, recorded_layer_norm
from adaptune.fused.settings import LAYER_NORM_ENV, StepSettings
from adaptune.train.group_loop import train_group
from adaptune.train.loop import train_and_evaluate
from bench.gpu_fused import KernelLaunches, check_layer_norm_kernel, layer_norm_kernel_matches, measure_fused
from tests.test_bench_gpu_fused import TINY, _batches, tiny_adapter_runs
from tests.test_fused_groups import SMALL, _assert_same_run, step_losses  # noqa: F401  (a fixture)

pytest.importorskip("triton", reason="make venv installs triton (requirements-kernel-tests.txt)")

CPU = Device("cpu", torch.device("cpu"), "cpu", None)
TIGHT = 1e-6  # trained groups' losses and tensors, as tests/fused/kernels/test_dropout.py bounds its kernel


@pytest.fixture
def interpreted(monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel on, under the interpreter that tests/conftest.py chose before triton was imported."""
    assert os.environ.get("TRITON_INTERPRET") == "1", "run under tests/conftest.py, which sets TRITON_INTERPRET=1"
    monkeypatch.setenv(LAYER_NORM_ENV, "kernel")


def _module(runs: int, features: int, seed: int = 0) -> GroupedLayerNorm:
    generator = torch.Generator().manual_seed(seed)
    scales = [1 + torch.randn(features, generator=generator) for _ in range(runs)]
    shifts = [torch.randn(features, generator=generator) for _ in range(runs)]
    return GroupedLayerNorm(torch.nn.LayerNorm(features, eps=1e-12), scales, shifts, kernel=True)


def _both_ways(module: GroupedLayerNorm, x: torch.Tensor, monkeypatch: pytest.MonkeyPatch) -> dict[str, list[torch.Tensor]]:
    grad_out = torch.randn(x.shape, generator=torch.Generator().manual_seed(1))
    results = {}
    for mode in layer_norm_kernel.LAYER_NORM_MODES:
        module.kernel = mode == "kernel"
        with KernelLaunches() as launches:
            out = module(x)
            wanted = [tensor for tensor in (x, module.weight, module.bias) if tensor.requires_grad]
            grads = torch.autograd.grad(out, wanted, grad_out.to(out.dtype))
        assert (launches.layer_norm, launches.layer_norm_backward) == ((1, 1) if mode == "kernel" else (0, 0))
        results[mode] = [out.detach(), *grads]
    return results


@pytest.mark.parametrize(("runs", "rows", "features"), [
    (2, 7, 32),
    (3, 50, 40),  # 40 features: a tile of 64, masked past the last
    (2, 37, 384),  # MiniLM's width; 37 x 5 rows a run: no backward span divides them
    (2, 70, 768),  # BERT-base's
])
def test_the_kernel_computes_what_torchs_operators_do(interpreted: None, monkeypatch: pytest.MonkeyPatch, runs: int, rows: int,
                                                     features: int) -> None:
    module = _module(runs, features)
    x = (torch.randn(runs * rows, 5, features, generator=torch.Generator().manual_seed(2)) * 4 + 1).requires_grad_()
    results = _both_ways(module, x, monkeypatch)
    for name, kernel, reference in zip(("out", "grad_x", "grad_weight", "grad_bias"), results["kernel"], results["torch"], strict=True):
        assert kernel.dtype == reference.dtype and kernel.shape == reference.shape, name
        scale = float(reference.abs().max())
        assert float((kernel - reference).abs().max()) <= 1e-5 * max(1.0, scale), name


def test_a_group_of_one_takes_torchs_layer_norm_with_its_scale_in_either_mode(interpreted: None) -> None:
    """One run's scale and shift are what torch's LayerNorm takes itself (a group of one trains as alone): no kernel."""
    module, solo = _module(1, 32), torch.nn.LayerNorm(32, eps=1e-12)
    with torch.no_grad():
        solo.weight.copy_(module.weight[0])
        solo.bias.copy_(module.bias[0])
    x = torch.randn(7, 5, 32, generator=torch.Generator().manual_seed(2))
    with KernelLaunches() as launches:
        out = module(x)
    assert launches.layer_norm == 0 and torch.equal(out, solo(x))


def test_each_run_gets_its_own_scale_and_its_own_gradients(interpreted: None) -> None:
    """Run r's rows take run r's scale and shift and nothing else: a run's rows normalised alone with its own nn.LayerNorm
    give the same output, and its scale's gradient is that LayerNorm's."""
    runs, rows, features = 3, 11, 48
    module = _module(runs, features)
    x = torch.randn(runs, rows, features, generator=torch.Generator().manual_seed(3))
    out = module(x.reshape(runs * rows, features))
    out.sum().backward()
    for run in range(runs):
        alone = torch.nn.LayerNorm(features, eps=1e-12)
        with torch.no_grad():
            alone.weight.copy_(module.weight[run])
            alone.bias.copy_(module.bias[run])
        expected = alone(x[run])
        expected.sum().backward()
        torch.testing.assert_close(out[run * rows:(run + 1) * rows], expected.detach(), rtol=0, atol=1e-5)
        torch.testing.assert_close(module.weight.grad[run], alone.weight.grad, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(module.bias.grad[run], alone.bias.grad, rtol=0, atol=1e-5)


def test_an_input_without_gradient_leaves_its_gradient_out(interpreted: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """The embeddings' LayerNorm: its input (frozen embeddings) needs no gradient; the kernel writes none, and the scales'
    and shifts' gradients are torch's."""
    module = _module(2, 64)
    x = torch.randn(2 * 9, 64, generator=torch.Generator().manual_seed(4))
    results = _both_ways(module, x, monkeypatch)
    assert len(results["kernel"]) == 3  # the output, the scales' and the shifts' gradients
    for kernel, reference in zip(results["kernel"], results["torch"], strict=True):
        torch.testing.assert_close(kernel, reference, rtol=1e-5, atol=1e-5)


def test_bf16_input_is_normalised_in_float32(interpreted: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """A bf16 input gives a float32 output computed from the bf16 values in float32, as torch's path does where autocast
    runs layer_norm in float32 (CUDA's autocast; this CPU's keeps bf16, so the reference here is the float32 input); the
    input's gradient comes back in bf16."""
    module = _module(2, 96)
    x = torch.randn(2 * 13, 96, generator=torch.Generator().manual_seed(5)).bfloat16().requires_grad_()
    results = _both_ways(module, x, monkeypatch)
    reference = _both_ways(module, x.detach().float().requires_grad_(), monkeypatch)["torch"]
    out, grad_x, grad_weight, grad_bias = results["kernel"]
    assert out.dtype == torch.float32 and grad_x.dtype == torch.bfloat16
    torch.testing.assert_close(out, reference[0], rtol=0, atol=1e-5)
    torch.testing.assert_close(grad_x, reference[1].bfloat16(), rtol=0, atol=0)
    torch.testing.assert_close(grad_weight, reference[2], rtol=1e-5, atol=1e-5)


def test_the_kernel_applies_only_where_it_can(monkeypatch: pytest.MonkeyPatch) -> None:
    x, weight = torch.randn(6, 32), torch.ones(2, 32)
    monkeypatch.setenv(LAYER_NORM_ENV, "kernel")
    assert layer_norm_kernel.kernel_applies(x, weight)
    assert not layer_norm_kernel.kernel_applies(x.double(), weight)
    assert not layer_norm_kernel.kernel_applies(torch.randn(6, 16), weight)  # features unlike the scales'
    assert not layer_norm_kernel.kernel_applies(torch.randn(2, 1, layer_norm_kernel.MAX_FEATURES * 2),
                                                torch.ones(2, layer_norm_kernel.MAX_FEATURES * 2))
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)  # compiled layers: inductor fuses torch's operators
    assert not layer_norm_kernel.kernel_applies(x, weight)
    monkeypatch.undo()
    monkeypatch.delenv("TRITON_INTERPRET")  # a CPU without the interpreter: torch's operators
    assert not layer_norm_kernel.kernel_applies(x, weight)


def test_the_calls_check_finds_the_kernel_equal_to_torch(interpreted: None) -> None:
    checked = layer_norm_kernel_matches(CPU, 48)
    for name in ("out", "grad_x", "grad_weight", "grad_bias"):
        assert checked["float32"][f"max_{name}_difference"] <= 1e-5 * max(1.0, checked["float32"][f"max_{name}"]), name


@pytest.mark.parametrize("mode", ["eager", "step_graphs"])
def test_a_group_trains_with_the_kernel_as_with_torchs_operators(interpreted: None, mode: str) -> None:
    """Two adapter runs (a tiny BERT, counter masks, eager attention) trained 4 fused steps each way, in the eager fused
    step and in the step-graph step (on a CPU: uncaptured): every trained LayerNorm ran in the kernel, forward and
    backward, and losses and trained tensors agree (module docstring)."""
    checked = check_layer_norm_kernel(TINY, "tiny", "adapters64", _batches((12, 20, 16, 9)), 2, CPU, steps=2, passes=2,
                                      settings=StepSettings(compile=mode, dropout_masks="counter"),
                                      one_call=False)
    layer_norms = 2 * TINY["num_hidden_layers"] + 1  # each layer's two, the embeddings'
    assert checked["layer_norm_kernel_calls"] == checked["layer_norm_backward_calls"] == layer_norms * 4
    assert checked["kernel"]["max_loss_difference"] < TIGHT and checked["kernel"]["max_tensor_difference"] < TIGHT


@pytest.mark.parametrize(("method", "trained_layer_norms"), [("layernorm", 2 * TINY["num_hidden_layers"] + 1), ("top_k1", 2)])
def test_the_presets_other_layer_norm_groups_train_with_the_kernel_as_with_torch(interpreted: None, method: str,
                                                                               trained_layer_norms: int) -> None:
    """The H100 preset takes the kernel for every group: LayerNorm-only's (each LayerNorm) and top_k's (its stacked top
    layer's two) train alike in the step-graph step, every trained LayerNorm in the kernel each way."""
    checked = check_layer_norm_kernel(TINY, "tiny", method, _batches((12, 20, 16, 9)), 2, CPU, steps=2, passes=2,
                                      settings=StepSettings(compile="step_graphs", dropout_masks="counter"),
                                      one_call=False)
    assert checked["layer_norm_kernel_calls"] == checked["layer_norm_backward_calls"] == trained_layer_norms * 4
    assert checked["kernel"]["max_loss_difference"] < TIGHT and checked["kernel"]["max_tensor_difference"] < TIGHT


def test_the_benchmarks_rows_say_which_layer_norm_they_timed(interpreted: None) -> None:
    """bench-gpu's --fused-layer-norm: a row per mode, the kernel's with its launches counted (so a "kernel" row cannot be
    torch's operators unawares), torch's with none."""
    rows = measure_fused(TINY, "tiny", "layernorm", _batches((12, 20)), (2,), CPU, repeats=1, peak=None, steps=1,
                         mask_schemes=("counter",), layer_settings={"layer_norm": ("torch", "kernel")})
    assert [row["layer_norm"] for row in rows] == ["torch", "kernel"]
    assert "layer_norm_kernel_calls" not in rows[0] and rows[1]["layer_norm_kernel_calls"] > 0


@pytest.mark.slow
def test_the_trainers_train_with_the_kernel_as_with_torch_and_record_it(interpreted: None, tmp_path: Path, shared_data_dir: Path,
                                                                       step_losses: list[list[float]],
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Two adapter runs on MRPC (a tiny BERT of width 32 with the embedded backbone's vocabulary), trained by train_group with
    the kernel and with torch's operators, and the first alone (train_and_evaluate, torch's LayerNorm): the same runs
    within the fused tests' tolerance, every trained LayerNorm of every step in the kernel, and the records say which."""
    runs = tiny_adapter_runs(tmp_path, monkeypatch)
    with KernelLaunches() as launches:
        kernel = train_group(runs, [tmp_path / "kernel" / name for name in ("a", "b")], data_dir=shared_data_dir)
    steps = math.ceil(SMALL["max_train_examples"] / SMALL["batch_size"])
    assert launches.layer_norm_backward == (2 * TINY["num_hidden_layers"] + 1) * steps  # evaluation runs forward only
    alone = train_and_evaluate(runs[0], data_dir=shared_data_dir, out_dir=tmp_path / "alone", progress=False)
    monkeypatch.setenv(LAYER_NORM_ENV, "torch")
    torch_ops = train_group(runs, [tmp_path / "torch" / name for name in ("a", "b")], data_dir=shared_data_dir)
    assert [record["layer_norm"] for record in [*kernel, alone, *torch_ops]] == ["kernel"] * 2 + ["torch"] * 3
    for index in range(2):
        _assert_same_run({**kernel[index], "layer_norm": "torch"}, torch_ops[index], step_losses[index], step_losses[3 + index])
    _assert_same_run({**kernel[0], "layer_norm": "torch"}, alone, step_losses[0], step_losses[2])


def test_a_group_that_trains_no_layer_norm_records_torch(interpreted: None) -> None:
    """LoRA trains no LayerNorm: its group's record says "torch" whatever the setting; a group that does says "kernel"."""
    from adaptune.fused.run_groups import group_model, trained_tensors
    from adaptune.model.methods import apply_method, method_from_dict

    def grouped(method: dict) -> torch.nn.Module:
        torch.manual_seed(0)
        model = BertForSequenceClassification(BertConfig(**TINY))
        apply_method(model, method_from_dict(method))
        return group_model(model, [trained_tensors(model)] * 2, StepSettings(layer_norm="kernel"))

    assert recorded_layer_norm(grouped({"name": "lora"})) == "torch"
    assert recorded_layer_norm(grouped({"name": "layernorm"})) == "kernel"


def test_a_misspelt_mode_fails_before_training(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(LAYER_NORM_ENV, "fused")
    with pytest.raises(ValueError, match=f"^{LAYER_NORM_ENV}='fused' is not valid: use one of torch, kernel "):
        StepSettings.from_environment()


def test_without_triton_the_kernel_says_what_it_needs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "triton", None)
    monkeypatch.delitem(sys.modules, "adaptune.fused.kernels.layer_norm_triton", raising=False)
    monkeypatch.delattr(adaptune.fused.kernels, "layer_norm_triton", raising=False)
    with pytest.raises(RuntimeError, match=f"{LAYER_NORM_ENV}=kernel needs triton"):
        layer_norm_kernel._kernels.__wrapped__()
