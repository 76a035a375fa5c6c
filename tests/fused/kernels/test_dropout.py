"""The dropout kernel (adaptune.fused.kernels.dropout, ADAPTUNE_DROPOUT=kernel) against counter_keep_mask and
the torch formula it replaces, on the CPU under Triton's interpreter (TRITON_INTERPRET=1: the kernel's own code,
run by numpy, program by program). A lent GPU's call checks bf16 there (`make bench-gpu`'s dropout check,
bench.gpu_fused.dropout_kernel_matches).

Values: a kept value is x * (1 / (1 - p)) in float32, rounded to x's dtype, exactly. Eager's (x * mask) / (1 - p)
divides instead: on this CPU it is the same value in float16 and bf16 (computed in float32, then rounded), and
in float32 one unit in the last place away for some values (26% at p = 0.1, observed); a GPU's torch multiplies
by the reciprocal, as the kernel does. So the groups below train alike within float32 rounding: observed, equal
step losses and trained tensors 2e-8 apart; a mask drawn one draw off moves them by 3e-3 and 1e-3.
"""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path

import pytest
import torch

import adaptune.fused.kernels
from adaptune.core.devices import Device
from adaptune.fused.kernels import attention as attention_kernel
from adaptune.fused.kernels import dropout as dropout_kernel
from adaptune.fused.run_dropout import (
    CounterStream,
    RunDropout,
    RunRandomness,
    counter_keep_mask,
    keep_threshold,
)
from adaptune.fused.settings import StepSettings
from adaptune.train.group_loop import train_group
from adaptune.train.loop import train_and_evaluate
from bench.gpu_fused import KernelLaunches, check_dropout_kernel, dropout_kernel_matches, ulps_apart
from tests.test_bench_gpu_fused import TINY, _batches, tiny_adapter_runs
from tests.test_fused_groups import SMALL, _assert_same_run, step_losses  # noqa: F401  (a fixture)

pytest.importorskip("triton", reason="make venv installs triton (requirements-kernel-tests.txt)")

CPU = Device("cpu", torch.device("cpu"), "cpu", None)
P = 0.1
TIGHT = 1e-6  # losses and trained tensors: 50x the observed 2e-8, 1000x below a wrong mask's 1e-3 (module docstring)


@pytest.fixture
def interpreted(monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel on, under the interpreter that tests/conftest.py chose before triton was imported."""
    assert os.environ.get("TRITON_INTERPRET") == "1", "run under tests/conftest.py, which sets TRITON_INTERPRET=1"
    monkeypatch.setenv(dropout_kernel.DROPOUT_ENV, "kernel")


def _words(seeds: list[int], draws: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Each run's keys and draw as a group holds them: int32 words."""
    return RunRandomness([CounterStream(seed) for seed in seeds]).keys, torch.tensor(draws, dtype=torch.int32)


def _dropped(x: torch.Tensor, seeds: list[int], draws: list[int], p: float = P) -> torch.Tensor:
    keys, words = _words(seeds, draws)
    return dropout_kernel.run_dropout(x, keys, words, keep_threshold(p), p)


@pytest.mark.parametrize("p", [P, 0.73])  # 0.73: a threshold above 2^31
@pytest.mark.parametrize("shape", [(3, 300, 40), (3, 1030, 1, 8), (3, 5, 7, 40), (3, 9000)],
                         ids=["rank2", "rank3-rows-past-1024", "rank3", "rank1-three-programs-a-line"])
def test_the_kernel_keeps_counter_keep_masks_bits(interpreted: None, shape: tuple[int, ...], p: float) -> None:
    """Three runs with unlike draws (one near 2^31), read from a call on ones: 1030 rows of a rank-3 block set the
    hash index's top bit (rows have 11 bits); 9000 rows of a rank-1 block take three programs each."""
    seeds, draws = [0, 5, 9], [3, 70_001, 2**31 - 5]
    kept = _dropped(torch.ones(shape), seeds, draws, p) != 0
    expected = counter_keep_mask(*_words(seeds, draws), shape, p)
    assert torch.equal(kept, expected) and 0 < float(expected.float().mean()) < 1


def test_rank_2_rows_past_2_19_set_the_hash_indexs_top_bit(interpreted: None) -> None:
    """A rank-2 block's rows have 20 bits, above 12 of features: row 2^19 is the index's top bit (512 programs, seconds)."""
    shape = (1, 2**19 + 2, 1)
    kept = _dropped(torch.ones(shape), [7], [11]) != 0
    assert torch.equal(kept, counter_keep_mask(*_words([7], [11]), shape, P))


def test_the_calls_check_finds_bits_values_and_gradients_equal(interpreted: None) -> None:
    """The bench's check of single calls (run on a lent GPU in bf16) here in float32: eager's division is a ulp away."""
    checked = dropout_kernel_matches(CPU)
    assert checked["mask_bits_equal"] and checked["values_equal"] and checked["grads_equal"]
    assert checked["max_eager_ulps"] == 1 and 0.85 < checked["kept_share"] < 0.95


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_values_and_gradients_are_the_masks_formula_in_float32(interpreted: None, dtype: torch.dtype) -> None:
    """Output and gradient in x's dtype: x * keep * (1 / (1 - p)) in float32 rounded to it, exactly; eager's
    (x * mask) / (1 - p) and its autograd gradient within one unit in the last place (exact in float16 and bf16 here).
    bf16 runs in float32 under the interpreter (triton_device.interpreted_bf16), which gives the GPU kernel's values."""
    shape, seeds, draws = (2, 6, 5, 24), [1, 2], [4, 9]
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(shape, generator=generator).to(dtype).requires_grad_()
    grad_out = torch.randn(shape, generator=generator).to(dtype)
    out = _dropped(x, seeds, draws)
    (grad,) = torch.autograd.grad(out, x, grad_out)
    mask, scale = counter_keep_mask(*_words(seeds, draws), shape, P), 1 / (1 - P)
    assert out.dtype == grad.dtype == dtype
    assert torch.equal(out, torch.where(mask, x.detach().float() * scale, 0).to(dtype))
    assert torch.equal(grad, torch.where(mask, grad_out.float() * scale, 0).to(dtype))
    eager = (x * mask) / (1 - P)
    (eager_grad,) = torch.autograd.grad(eager, x, grad_out)
    ulps = (ulps_apart(eager.detach(), out.detach()), ulps_apart(eager_grad, grad))
    assert ulps == ((1, 1) if dtype == torch.float32 else (0, 0))
    assert torch.equal(_dropped(-x.detach(), seeds, draws).signbit(), (-x.detach() * mask).signbit())  # -0 where dropped, as x * mask


def test_a_run_dropout_site_applies_the_kernel_only_where_it_applies(interpreted: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """A training RunDropout with counter masks takes its draw from the group's counts and gives the masks' values (within
    float32's ulp) from one launch; the attention probabilities (rank 4), evaluation, generator masks, float64, a
    torch.compile trace, a CPU without the interpreter and the "mask" mode keep torch's operators."""
    randomness = RunRandomness([CounterStream(0), CounterStream(1)], StepSettings(dropout_masks="counter", dropout="kernel"))
    site, x = RunDropout(P, randomness).train(), torch.randn(2 * 3, 5, 16)
    randomness.advance()
    with KernelLaunches() as launches:
        out = site(x)
    expected = (x.reshape(2, 3, 5, 16) * counter_keep_mask(randomness.keys, randomness.base, (2, 3, 5, 16), P)).reshape(x.shape) / (1 - P)
    assert launches.dropout == 1 and ulps_apart(out, expected) <= 1
    assert dropout_kernel.kernel_applies(x.reshape(2, 3, 5, 16), P)
    assert not dropout_kernel.kernel_applies(torch.zeros(2, 3, 2, 5, 5), P)  # attention probabilities
    assert not dropout_kernel.kernel_applies(x.double().reshape(2, 3, 5, 16), P)
    assert not any(dropout_kernel.kernel_applies(x.reshape(2, 3, 5, 16), p) for p in (0.0, 1.0, 1 - 2**-40))
    assert not dropout_kernel.kernel_applies(torch.zeros(2, 3, 600, 16), P)  # 600 tokens: past the hash's 9 bits
    with KernelLaunches() as launches:
        assert torch.equal(site.eval()(x), x)
        generator_site = RunDropout(P, RunRandomness([torch.Generator().manual_seed(0)] * 2)).train()
        generator_site(x)
    assert launches.dropout == 0
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert not dropout_kernel.kernel_applies(x.reshape(2, 3, 5, 16), P)
    monkeypatch.undo()
    monkeypatch.delenv("TRITON_INTERPRET")  # a CPU without the interpreter: torch's operators
    assert not dropout_kernel.kernel_applies(x.reshape(2, 3, 5, 16), P)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with KernelLaunches() as launches:  # the "mask" setting: torch's operators
        RunDropout(P, RunRandomness([CounterStream(0), CounterStream(1)], StepSettings(dropout_masks="counter"))).train()(x)
    assert launches.dropout == 0


@pytest.mark.parametrize("mode", ["eager", "step_graphs"])
def test_a_group_trains_with_the_kernel_as_with_the_masks(interpreted: None, mode: str) -> None:
    """Two adapter runs (a tiny BERT, counter masks, eager attention) trained 4 fused steps each way, in the eager
    fused step and in the step-graph step (on a CPU: the same step padded to 32-token buckets, uncaptured): every
    hidden-state site ran in the kernel, forward and backward, and losses and trained tensors agree (module docstring)."""
    checked = check_dropout_kernel(TINY, "tiny", "adapters64", _batches((12, 20, 16, 9)), 2, CPU, steps=2, passes=2,
                                   settings=StepSettings(compile=mode, dropout_masks="counter"),
                                   one_call=False)
    sites = 2 * TINY["num_hidden_layers"] + 2  # embeddings, each layer's attention output and output, the pooled output
    assert checked["dropout_kernel_calls"] == 2 * sites * 4  # forward and backward (adapters train the LayerNorms before each)
    assert checked["kernel"]["max_loss_difference"] < TIGHT and checked["kernel"]["max_tensor_difference"] < TIGHT
    # The step-graph step also trains each way uncaptured (here every step is: a CPU captures nothing), to tell capture apart.
    pairs = ("uncaptured", "masks_captured_vs_uncaptured", "kernel_captured_vs_uncaptured")
    assert (mode == "step_graphs") == all(pair in checked for pair in pairs)
    for pair in pairs[: 3 if mode == "step_graphs" else 0]:
        assert checked[pair]["max_loss_difference"] < TIGHT and checked[pair]["max_tensor_difference"] < TIGHT


@pytest.mark.slow
def test_the_trainers_train_with_the_kernel_as_with_the_masks_and_record_it(interpreted: None, tmp_path: Path, shared_data_dir: Path,
                                                                          step_losses: list[list[float]],
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Two adapter runs on MRPC (a tiny BERT of width 32 with the embedded backbone's vocabulary), counter masks, trained by
    train_group with the kernel and with the masks, and the first alone with the kernel (train_and_evaluate): the same
    runs within the fused tests' tolerance, every hidden-state site of every step in the kernel, and the records say
    which dropout each trained with."""
    runs = tiny_adapter_runs(tmp_path, monkeypatch)
    with KernelLaunches() as launches:
        kernel = train_group(runs, [tmp_path / "kernel" / name for name in ("a", "b")], data_dir=shared_data_dir)
    steps = math.ceil(SMALL["max_train_examples"] / SMALL["batch_size"])
    assert launches.dropout == 2 * (2 * TINY["num_hidden_layers"] + 2) * steps
    alone = train_and_evaluate(runs[0], data_dir=shared_data_dir, out_dir=tmp_path / "alone", progress=False)
    monkeypatch.setenv(dropout_kernel.DROPOUT_ENV, "mask")
    masks = train_group(runs, [tmp_path / "mask" / name for name in ("a", "b")], data_dir=shared_data_dir)
    assert [record["dropout"] for record in [*kernel, alone, *masks]] == ["kernel"] * 3 + ["mask"] * 2
    for index in range(2):
        _assert_same_run({**kernel[index], "dropout": "mask"}, masks[index], step_losses[index], step_losses[3 + index])
    _assert_same_run(kernel[0], alone, step_losses[0], step_losses[2])


# Both kernels' settings and loaders (the attention kernel's too: tests/fused/kernels/test_attention.py).
KERNELS = {"attention": (attention_kernel, "attention_triton", "flash", "use one of eager, kernel"),
           "dropout": (dropout_kernel, "dropout_triton", "fused", "use one of mask, kernel")}


@pytest.mark.parametrize("kernel", KERNELS)
def test_a_misspelt_kernel_mode_fails_before_training(kernel: str, monkeypatch: pytest.MonkeyPatch) -> None:
    module, _, wrong, message = KERNELS[kernel]
    name = f"ADAPTUNE_{kernel.upper()}"
    monkeypatch.setenv(name, wrong)
    with pytest.raises(ValueError, match=f"^{name}='{wrong}' is not valid: {message} "):
        StepSettings.from_environment()
    monkeypatch.setenv(name, "kernel")  # the kernel without counter masks: one line saying what it needs
    with pytest.raises(ValueError, match=f"^{name}=kernel needs ADAPTUNE_DROPOUT_MASKS=counter "):
        StepSettings.from_environment()


@pytest.mark.parametrize("kernel", KERNELS)
def test_without_triton_a_kernel_says_what_it_needs(kernel: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A machine without triton (a CPU-only torch) that asks for a kernel gets one line saying so."""
    module, triton_module, _, _ = KERNELS[kernel]
    monkeypatch.setitem(sys.modules, "triton", None)
    for name in ("attention_triton", triton_module):  # imported by an earlier test: import them anew
        monkeypatch.delitem(sys.modules, f"adaptune.fused.kernels.{name}", raising=False)
        monkeypatch.delattr(adaptune.fused.kernels, name, raising=False)
    with pytest.raises(RuntimeError, match=f"ADAPTUNE_{kernel.upper()}=kernel needs triton"):
        module._kernels.__wrapped__()


