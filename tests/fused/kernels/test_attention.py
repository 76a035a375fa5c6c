"""The attention kernel (adaptune.fused.kernels.attention) against eager attention, on the CPU under
Triton's interpreter (TRITON_INTERPRET=1: the kernel's own code, run by numpy, program by program).
The interpreter has no bf16 matrix product, so these run in float32 and float16; a lent GPU's call
checks bf16 (`make bench-gpu`'s attention check, bench.gpu_fused.attention_kernel_matches).

Tolerances: float32 differs from eager attention only in summation order, ~1e-6 on values of order 1
(observed 4e-7 to 1.5e-6); 1e-5 leaves room and still fails on any wrong mask bit, scale or term.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest
import torch

from adaptune.core.devices import Device
from adaptune.fused.kernels import attention as attention_kernel
from adaptune.fused.kernels.counter_coordinates import keep_threshold
from adaptune.fused.run_dropout import CounterStream, RunRandomness, counter_keep_mask
from adaptune.fused.settings import COMPILE_ENV, StepSettings
from adaptune.fused.step_graphs import STEP_GRAPHS
from adaptune.train.group_loop import train_group
from bench.gpu_fused import KernelLaunches, attention_kernel_matches, check_attention_kernel
from tests.test_bench_gpu_fused import TINY, _batches, tiny_adapter_runs
from tests.test_fused_groups import SMALL, _assert_same_run, step_losses  # noqa: F401  (a fixture)

pytest.importorskip("triton", reason="make venv installs triton (requirements-kernel-tests.txt)")

CPU = Device("cpu", torch.device("cpu"), "cpu", None)
P = 0.1


@pytest.fixture
def interpreted(monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel on, under the interpreter that tests/conftest.py chose before triton was imported."""
    assert os.environ.get("TRITON_INTERPRET") == "1", "run under tests/conftest.py, which sets TRITON_INTERPRET=1"
    monkeypatch.setenv(attention_kernel.ATTENTION_ENV, "kernel")


def _words(seeds: list[int], draw: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each run's keys and draw as a group holds them: int32 words."""
    return RunRandomness([CounterStream(seed) for seed in seeds]).keys, torch.full((len(seeds),), draw, dtype=torch.int32)


def _attend(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, seeds: list[int], mask: torch.Tensor | None = None) -> torch.Tensor:
    keys, draws = _words(seeds, 5)
    return attention_kernel.run_dropout_attention(query, key, value, mask, keys, draws, keep_threshold(P), P, 0.25)


def test_one_call_keeps_counter_keep_masks_bits_and_computes_eager_attention(interpreted: None) -> None:
    """The kept positions bit for bit (blocks of 130 rows: a row index with the hash input's top bit; and 150
    tokens: three tiles of 64, the last one partial), and the output and all three gradients against eager
    float32 attention with a padding mask."""
    checked = attention_kernel_matches(CPU)
    assert checked["mask_bits_equal"] and 0.85 < checked["kept_share"] < 0.95
    assert checked["max_out_difference"] < 1e-5 and checked["max_grad_difference"] < 1e-5 < checked["max_grad"]


def test_a_runs_rows_do_not_depend_on_the_runs_beside_it(interpreted: None) -> None:
    """Run 7's rows come out bit for bit the same whether it is the first run of a group or the second,
    beside another run: its mask is its own words' and its rows' coordinates in its own block."""
    generator = torch.Generator().manual_seed(1)
    mine, other = (torch.randn(3, 2, 2, 24, 16, generator=generator) for _ in range(2))  # (q, k, v), 2 rows, 2 heads
    first = _attend(*torch.cat([mine, other], dim=1), seeds=[7, 8])[:2]
    second = _attend(*torch.cat([other, mine], dim=1), seeds=[9, 7])[2:]
    assert torch.equal(first, second)
    keys, draws = _words([7], 5)
    alone_mask = counter_keep_mask(keys, draws, (1, 2, 2, 24, 24), P)
    assert not alone_mask.all()  # the mask dropped something, so equality above says something


def test_the_stacked_call_computes_what_the_three_views_do(interpreted: None) -> None:
    """run_dropout_attention_stacked (frozen_projections' one matmul, taken whole) against run_dropout_attention on the
    same tensor's three head-split views: the same kernels on the same values, so the output and the gradient are equal
    bit for bit, the gradient laid out as the stacked input (query's, key's and value's side by side)."""
    rows, length, heads, head_size = 6, 20, 2, 16
    stacked = torch.randn(rows, length, 3 * heads * head_size, generator=torch.Generator().manual_seed(0), requires_grad=True)
    mask = torch.zeros(rows, 1, length, length).masked_fill(torch.arange(length) >= 15, torch.finfo(torch.float32).min)
    keys, draws = _words([0, 1], 5)
    grad_out = torch.randn(rows, length, heads, head_size, generator=torch.Generator().manual_seed(1))
    whole = attention_kernel.run_dropout_attention_stacked(stacked, heads, mask, keys, draws, keep_threshold(P), P, 0.25)
    (grad_whole,) = torch.autograd.grad(whole, stacked, grad_out)
    views = attention_kernel.split_heads(stacked, heads)
    parts = attention_kernel.run_dropout_attention(*views, mask, keys, draws, keep_threshold(P), P, 0.25)
    (grad_parts,) = torch.autograd.grad(parts, stacked, grad_out)
    assert torch.equal(whole, parts) and torch.equal(grad_whole, grad_parts)
    assert grad_whole.shape == stacked.shape and grad_whole.is_contiguous()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_inputs_stay_within_their_rounding(interpreted: None, dtype: torch.dtype) -> None:
    """float16 in and out (the kernel's low-precision casts, as bf16's on a GPU), and bf16, which the interpreter
    cannot multiply and the kernel runs in float32 here: within their rounding of the float32 result, gradients too."""
    generator = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(4, 2, 20, 16, generator=generator, requires_grad=True) for _ in range(3))
    exact = _attend(q, k, v, seeds=[1, 2])
    exact_grads = torch.autograd.grad(exact.sum(), (q, k, v))
    low = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
    half = _attend(*low, seeds=[1, 2])
    half_grads = torch.autograd.grad(half.float().sum(), low)
    assert half.dtype == dtype and all(grad.dtype == dtype for grad in half_grads)
    # bf16 keeps 8 bits: 0.4% of values up to 2.6 is 1e-2 (observed: float16 8e-4 and 1.2e-3, bf16 6.4e-3 and 1.4e-2)
    assert float((half.detach().float() - exact.detach()).abs().max()) < 2e-2 < float(exact.detach().abs().max())
    assert max(float((a.float() - b).abs().max()) for a, b in zip(half_grads, exact_grads, strict=True)) < 5e-2


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["eager", "step_graphs"])
def test_a_group_trains_with_the_kernel_as_with_eager_attention(interpreted: None, mode: str) -> None:
    """Two adapter runs (a tiny BERT, counter masks) trained 4 fused steps each way, in the eager fused
    step and in the step-graph step (on a CPU: the same step padded to 32-token buckets, uncaptured):
    every attention call ran in the kernel, and losses and trained tensors agree."""
    checked = check_attention_kernel(TINY, "tiny", "adapters64", _batches((12, 20, 16, 9)), 2, CPU, steps=2, passes=2,
                                     settings=StepSettings(compile=mode, dropout_masks="counter"),
                                     one_call=False)
    assert checked["kernel_calls"] == TINY["num_hidden_layers"] * 4
    assert checked["kernel"]["max_loss_difference"] < 1e-5 and checked["kernel"]["max_tensor_difference"] < 1e-5


@pytest.mark.slow
def test_the_trainer_trains_a_group_with_the_kernel_as_with_eager_attention(interpreted: None, tmp_path: Path, shared_data_dir: Path,
                                                                          step_losses: list[list[float]],
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Two adapter runs on MRPC (a tiny BERT of width 32 with the embedded backbone's vocabulary: the interpreter
    runs a program per row and head), counter masks, dropout on, step graphs' step (uncaptured here), trained
    by train_group with the kernel and with eager attention: the same runs within the fused tests' tolerance,
    every training attention call in the kernel, and the records say which attention each trained with."""
    runs = tiny_adapter_runs(tmp_path, monkeypatch)
    monkeypatch.setenv(COMPILE_ENV, STEP_GRAPHS)
    with KernelLaunches() as launches:
        kernel = train_group(runs, [tmp_path / "kernel" / name for name in ("a", "b")], data_dir=shared_data_dir)
    steps = math.ceil(SMALL["max_train_examples"] / SMALL["batch_size"])
    assert launches.forward == TINY["num_hidden_layers"] * steps
    monkeypatch.setenv(attention_kernel.ATTENTION_ENV, "eager")
    eager = train_group(runs, [tmp_path / "eager" / name for name in ("a", "b")], data_dir=shared_data_dir)
    assert [record["attention"] for record in kernel + eager] == ["kernel"] * 2 + ["eager"] * 2
    assert {record["dropout"] for record in kernel + eager} == {"mask"}  # ADAPTUNE_DROPOUT unset: the masks
    for index in range(2):
        _assert_same_run({**kernel[index], "attention": "eager"}, eager[index], step_losses[index], step_losses[2 + index])


def test_the_kernel_applies_only_where_it_fits(interpreted: None, monkeypatch: pytest.MonkeyPatch) -> None:
    squad = torch.zeros(2, 2, 384, 64)
    assert attention_kernel.kernel_applies(squad, squad, squad, P, runs=2)
    longer = torch.zeros(2, 2, 513, 64)  # beyond the hash's 9 bits of a query's or key's position: eager
    assert not attention_kernel.kernel_applies(longer, longer, longer, P, runs=2)
    wide = torch.zeros(2, 2, 16, 80)
    assert not attention_kernel.kernel_applies(wide, wide, wide, P, runs=2)
    many_rows = torch.zeros(257, 2, 16, 64)  # one run's 257 rows: beyond the hash's 8 bits of a row
    assert not attention_kernel.kernel_applies(many_rows, many_rows, many_rows, P, runs=1)
    monkeypatch.delenv("TRITON_INTERPRET")  # a CPU without the interpreter: eager
    assert not attention_kernel.kernel_applies(squad, squad, squad, P, runs=2)
