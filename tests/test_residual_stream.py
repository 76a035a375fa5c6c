"""The residual stream in bf16 (adaptune.model.residual_stream, ADAPTUNE_RESIDUAL=autocast): every LayerNorm's output in
the autocast dtype, computed in float32 and rounded once, whichever path computes it (a run's nn.LayerNorm, a group's
torch operators or its kernel, a group of one); nothing changes outside autocast or under the default; records say
which stream a run trained with. On this CPU, bf16 autocast (the CPU's own, as the trainers run it where the CPU
multiplies bf16 natively).

Exactness: the rounding is the last operation, so a rounded output equals the float32 path's output rounded to bf16,
bit for bit, and a gradient exactly representable in bf16 flows back through it unchanged."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest
import torch
from transformers import BertConfig, BertForSequenceClassification

from adaptune.bench.attention import step_census
from adaptune.bench.gpu_fused import check_residual_stream
from adaptune.core.devices import Device, native_cpu_bf16
from adaptune.core.step_settings import LAYER_NORM_ENV, RESIDUAL_ENV
from adaptune.model.run_groups import GroupedLayerNorm
from adaptune.train.group_loop import train_group
from adaptune.train.loop import frozen_backbone_for_autocast, train_and_evaluate
from tests.test_bench_gpu_fused import TINY, _batches, tiny_adapter_runs
from tests.test_fused_groups import _Killed

BF16 = Device("cpu", torch.device("cpu"), "cpu:bf16", torch.bfloat16)


def _hidden_states(residual: str, monkeypatch: pytest.MonkeyPatch, autocast: bool = True) -> tuple[dict[str, str], list[torch.Tensor]]:
    monkeypatch.setenv(RESIDUAL_ENV, residual)
    torch.manual_seed(0)
    model = BertForSequenceClassification(BertConfig(**TINY)).eval()
    fields = frozen_backbone_for_autocast(model, torch.bfloat16)
    ids = torch.randint(1000, 2000, (3, 11), generator=torch.Generator().manual_seed(1))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        return fields, list(model(input_ids=ids, output_hidden_states=True).hidden_states)


def test_every_hidden_state_between_layers_is_bf16_under_the_setting_and_float32_without(monkeypatch: pytest.MonkeyPatch) -> None:
    default, float32_states = _hidden_states("float32", monkeypatch)
    rounded, bf16_states = _hidden_states("autocast", monkeypatch)
    assert default["residual"] == "float32" and rounded["residual"] == "bf16"
    assert {state.dtype for state in float32_states} == {torch.float32}
    assert {state.dtype for state in bf16_states} == {torch.bfloat16}
    # The embeddings' LayerNorm sees the same float32 sum either way: its output is the float32 one, rounded once.
    assert torch.equal(bf16_states[0], float32_states[0].bfloat16())
    # Later layers read a rounded stream: close to the float32 one, not equal (the setting acted).
    assert not torch.equal(bf16_states[-1].float(), float32_states[-1])
    torch.testing.assert_close(bf16_states[-1].float(), float32_states[-1], atol=0.1, rtol=0.05)


def test_outside_autocast_the_setting_changes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    _, plain = _hidden_states("float32", monkeypatch, autocast=False)
    _, rounded = _hidden_states("autocast", monkeypatch, autocast=False)
    assert all(torch.equal(a, b) and a.dtype == torch.float32 for a, b in zip(plain, rounded, strict=True))


def test_without_autocast_a_run_records_a_float32_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(RESIDUAL_ENV, "autocast")
    model = BertForSequenceClassification(BertConfig(**TINY))
    assert frozen_backbone_for_autocast(model, None) == {"projections": "separate", "residual": "float32"}


@pytest.mark.parametrize(("runs", "layer_norm"), [(1, "torch"), (3, "torch"), (3, "kernel")])
def test_a_groups_layer_norm_rounds_its_output_once_on_every_path(runs: int, layer_norm: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A group of one (torch's F.layer_norm), a group's torch operators and its kernel (under Triton's interpreter): in bf16
    the float32 path's output rounded, and the scales', shifts' and input's gradients those of the float32 path."""
    if layer_norm == "kernel":
        pytest.importorskip("triton", reason="make venv installs triton (requirements-kernel-tests.txt)")
        assert os.environ.get("TRITON_INTERPRET") == "1"
    monkeypatch.setenv(LAYER_NORM_ENV, layer_norm)
    generator = torch.Generator().manual_seed(2)
    features = 48
    module = GroupedLayerNorm(torch.nn.LayerNorm(features), [1 + torch.randn(features, generator=generator) for _ in range(runs)],
                              [torch.randn(features, generator=generator) for _ in range(runs)])
    x = (torch.randn(runs * 7, features, generator=generator) * 3 + 1).requires_grad_()
    grad_out = torch.randn(runs * 7, features, generator=generator).bfloat16()  # exactly representable either way
    results = {}
    for rounds_to in (None, torch.bfloat16):
        module.rounds_to = rounds_to
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = module(x)
        results[rounds_to] = [out, *torch.autograd.grad(out, (x, module.weight, module.bias), grad_out.to(out.dtype))]
    (float32_out, *float32_grads), (bf16_out, *bf16_grads) = results[None], results[torch.bfloat16]
    assert float32_out.dtype == torch.float32 and bf16_out.dtype == torch.bfloat16
    assert torch.equal(bf16_out, float32_out.bfloat16())
    for rounded, reference in zip(bf16_grads, float32_grads, strict=True):
        assert torch.equal(rounded, reference)


def test_a_misspelt_setting_fails_in_one_line_before_anything_trains(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(RESIDUAL_ENV, "bf16")
    with pytest.raises(ValueError, match=f"^{RESIDUAL_ENV}='bf16' is not a residual stream precision: use one of float32, autocast$"):
        frozen_backbone_for_autocast(torch.nn.Linear(2, 2), torch.bfloat16)


@pytest.mark.parametrize("mode", ["eager", "step_graphs"])
def test_the_check_trains_a_group_both_ways_and_finds_them_close_but_apart(mode: str) -> None:
    """bench-gpu's --residual-check on a tiny BERT: two adapter runs, 8 steps each way in bf16 autocast, in the eager fused
    step and the step-graph step (on a CPU: uncaptured): the streams end apart (the setting acted) by less than a
    hundredth of a step loss (the loss is about 0.69)."""
    checked = check_residual_stream(TINY, "tiny", "adapters64", _batches((12, 20, 16, 9)), 2, BF16, steps=4, passes=2, mode=mode)
    differences = checked["autocast"]
    assert 0 < differences["max_loss_difference"] < 0.01 and 0 < differences["max_tensor_difference"] < 0.05
    assert len(checked["first_losses"]) == len(checked["last_losses"]) == 2


def test_the_census_counts_fewer_bytes_and_operators_with_the_bf16_stream() -> None:
    """make bench-attention's last configuration against the one before it, a BERT-base-width layer at 16 tokens."""
    configurations = ("kernel+dropout_kernel+stacked_projections+layer_norm_kernel",
                      "kernel+dropout_kernel+stacked_projections+layer_norm_kernel+bf16_residual")
    (float32_ops, float32_bytes), (bf16_ops, bf16_bytes) = (step_census(1, 2, 16, configuration) for configuration in configurations)
    assert bf16_ops < float32_ops and bf16_bytes < 0.9 * float32_bytes


@pytest.mark.slow
@pytest.mark.skipif(not native_cpu_bf16(), reason="bf16 autocast on a CPU needs native bf16 (avx512_bf16 or AMX)")
def test_the_trainers_train_with_a_bf16_stream_and_record_it(tmp_path: Path, shared_data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two adapter runs on MRPC (a tiny BERT), in bf16 autocast on this CPU: a group (train_group) and the first run alone
    (train_and_evaluate) train to ok records that say the stream was bf16; under the default, float32."""
    runs = tiny_adapter_runs(tmp_path, monkeypatch)
    monkeypatch.setenv("ADAPTUNE_CPU_BF16", "1")
    monkeypatch.setenv(RESIDUAL_ENV, "autocast")
    grouped = train_group(runs, [tmp_path / "group" / name for name in ("a", "b")], data_dir=shared_data_dir)
    alone = train_and_evaluate(runs[0], data_dir=shared_data_dir, out_dir=tmp_path / "alone", progress=False)
    monkeypatch.setenv(RESIDUAL_ENV, "float32")
    default = train_and_evaluate(runs[0], data_dir=shared_data_dir, out_dir=tmp_path / "default", progress=False)
    assert [record["status"] for record in [*grouped, alone, default]] == ["ok"] * 4
    assert [record["residual"] for record in [*grouped, alone, default]] == ["bf16"] * 3 + ["float32"]
    assert {record["device"] for record in [*grouped, alone, default]} == {"cpu:bf16"}


@pytest.mark.slow
@pytest.mark.skipif(not native_cpu_bf16(), reason="bf16 autocast on a CPU needs native bf16 (avx512_bf16 or AMX)")
def test_a_resumed_run_keeps_the_residual_stream_it_started_with(tmp_path: Path, shared_data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run killed at step 3 under the bf16 stream and resubmitted under float32 resumes with its bf16 stream, grouped
    (beside a fresh run, which trains float32 in a group of its own) and alone, to the uninterrupted run's losses; a run
    trained float32 throughout does not reach them, so the test sees which stream a resumed run took."""
    a, b = (dataclasses.replace(run, epochs=2, checkpoint_every_steps=2) for run in tiny_adapter_runs(tmp_path, monkeypatch))
    monkeypatch.setenv("ADAPTUNE_CPU_BF16", "1")
    monkeypatch.setenv(RESIDUAL_ENV, "autocast")
    (whole,) = train_group([a], [tmp_path / "whole"], data_dir=shared_data_dir)

    def kill_at_step_3(step: int) -> None:
        if step == 3:
            raise _Killed

    for killed in ("grouped", "alone"):
        with pytest.raises(_Killed):
            train_group([a], [tmp_path / killed / "a"], data_dir=shared_data_dir, step_callback=kill_at_step_3)
    monkeypatch.setenv(RESIDUAL_ENV, "float32")  # the setting changed before the resubmission
    resumed, fresh = train_group([a, b], [tmp_path / "grouped" / "a", tmp_path / "grouped" / "b"], data_dir=shared_data_dir)
    alone = train_and_evaluate(a, data_dir=shared_data_dir, out_dir=tmp_path / "alone" / "a", progress=False)
    float32 = train_and_evaluate(a, data_dir=shared_data_dir, out_dir=tmp_path / "float32", progress=False)
    assert [record["residual"] for record in (whole, resumed, alone, fresh, float32)] == ["bf16"] * 3 + ["float32"] * 2
    assert (resumed["group_size"], fresh["group_size"]) == (1, 1)  # different streams: separate groups
    # On this tiny BERT the float32 stream moves the epochs' losses by 3e-5 to 8e-5: fainter than test_fused_groups'
    # bound, so these compare at reduction order's (a group of one against a run alone: measured 4e-8).
    losses = [[point["train_loss"] for point in record["curve"]] for record in (whole, resumed, alone, float32)]
    assert losses[1] == losses[0]  # the same step, resumed: bit for bit
    assert losses[2] == pytest.approx(losses[0], abs=1e-6) and losses[3] != pytest.approx(losses[0], abs=1e-5)
