"""The GPU benchmark's fused-group measurement (bench.gpu_fused) runs on the CPU too, on a tiny
BERT: a lent GPU's minutes are too few to find a broken benchmark there (the first GPU session lost
its side-by-side shard to failures that no CPU run had exercised)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import BertConfig, BertForSequenceClassification

from adaptune.core.devices import pick_device
from adaptune.train.group_loop import stack_run_batches
from bench.gpu import main as bench_gpu
from bench.gpu_batches import REHEARSAL
from bench.gpu_fused import check_step_graphs, group_batches, initialised_group, measure_fused, profile_fused

TINY = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64}


def tiny_adapter_runs(directory: Path, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Two adapter runs on MRPC of a tiny BERT (TINY, saved in `directory` with the embedded backbone's vocabulary), counter
    masks: what the kernels' trainer tests train (Triton's interpreter runs a program per row and head)."""
    from adaptune.fused.run_dropout import DROPOUT_MASKS_ENV
    from adaptune.model.backbone import load_tokenizer
    from tests.test_fused_groups import METHODS, _config

    backbone = directory / "tiny-bert"
    torch.manual_seed(0)
    BertForSequenceClassification(BertConfig(**TINY)).save_pretrained(backbone)
    load_tokenizer(None).save_pretrained(backbone)
    monkeypatch.setenv(DROPOUT_MASKS_ENV, "counter")
    return [_config(METHODS["adapters"], lr, seed, backbone=str(backbone), epochs=1) for lr, seed in ((1e-3, 0), (3e-4, 1))]


def _batches(lengths: tuple[int, ...]) -> list[dict[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(0)
    batches = []
    for length in lengths:
        ids = torch.randint(1000, 2000, (8, length), generator=generator)
        batches.append({"input_ids": ids, "attention_mask": torch.ones_like(ids), "token_type_ids": torch.zeros_like(ids),
                        "labels": torch.randint(0, 2, (8,), generator=generator)})
    return batches


def test_fused_rows_count_every_runs_examples_and_flops() -> None:
    device, batches = pick_device(), _batches((12, 20, 16, 9))
    # A peak this low keeps the MFU's 3 decimals above 0 however loaded the machine (at 1e12 a busy CPU rounded it to 0).
    rows = measure_fused(TINY, "tiny", "adapters64", batches, (1, 2), device, repeats=1, peak=1e9, steps=2,
                         optimizer_steps=("together", "per_run"), mask_schemes=("generator", "counter"))
    assert [(row["k"], row["optimizer_step"], row["masks"], row["compile"]) for row in rows] == [
        (k, optimizer, masks, "eager") for k in (1, 2) for optimizer in ("together", "per_run") for masks in ("generator", "counter")]
    assert rows[0]["speedup_vs_k1"] == 1.0
    assert all(row["examples_per_s"] > 0 and row["mfu"] > 0 and row["peak_gib"] is None for row in rows)
    # Two runs' FLOPs per fused step: each run's own batch at the step's padded length (20 tokens).
    fused = [stack_run_batches(batches[:2], 0, device.torch_device)]
    _, _, runs, run_flops = initialised_group(TINY, {"name": "layernorm"}, 2, device, fused)
    solo = initialised_group(TINY, {"name": "layernorm"}, 1, device, [stack_run_batches(batches[1:2], 0, device.torch_device)])
    assert len(runs) == 2 and run_flops == solo[3]  # batch 1 is the longer: both runs pay its length


def test_the_step_graphs_rows_and_check_run_here_as_the_eager_step() -> None:
    """No CUDA here: the step-graphs step runs eagerly (padded to its bucket, each run's own AdamW), so its
    check finds nothing captured and the replay column equal to its reference, and the default eager step
    within float32 reduction noise of it (tests/test_fused_groups.py's bound)."""
    device, batches = pick_device(), _batches((12, 20, 16, 9))
    rows = measure_fused(TINY, "tiny", "adapters64", batches, (2,), device, repeats=1, peak=1e12, steps=2, mask_schemes=("counter",),
                         compile_modes=("eager", "step_graphs"))
    assert [(row["compile"], row.get("graphs_captured")) for row in rows] == [("eager", None), ("step_graphs", 0)]
    check = check_step_graphs(TINY, "tiny", "adapters64", batches, 2, device, steps=2, passes=2)
    assert check["graphs"] == {"graphs_captured": 0, "max_loss_difference": 0.0, "max_tensor_difference": 0.0}
    assert check["eager"]["max_loss_difference"] < 1e-4 and check["eager"]["max_tensor_difference"] < 1e-4
    assert check["fused_mask_equals_eager"] is None and len(check["first_losses"]) == 2


def test_rehearsal_runs_the_gpu_calls_parts_on_the_cpu(tmp_path, shared_data_dir) -> None:
    """`--rehearse` runs bench-gpu's solo and fused parts here on a tiny BERT and real rows, writing the JSON a
    lent GPU's call would (bench/gpu_session.sh rehearses the whole call the same way); the tokenized
    batches are kept in the cache and read back by the next call."""
    out, cache = tmp_path / "gpu.json", tmp_path / "batches.pt"
    args = ["--rehearse", "--data-dir", str(shared_data_dir), "--batches-cache", str(cache), "--backbones", "bert-base", "--batch-sets", "length_grouped",
            "--variants", "now", "--repeats", "1", "--fused", "1,2", "--fused-methods", "layernorm,top_k3", "--fused-optimizer", "together",
            "--fused-masks", "generator", "--shard", "", "--shard-groups", ""]
    assert bench_gpu(["--out", str(out), *args]) == 0
    result = json.loads(out.read_text())
    assert "rehearsal" in result and result["batches"]["length_grouped"]["count"] == 4 * REHEARSAL.batches_per_task
    assert [(row["method"], row["variant"]) for row in result["runs"]] == [("full", "now"), ("adapters64", "now")]
    assert [(row["method"], row["k"], row["speedup_vs_k1"] > 0) for row in result["fused"]] == [
        ("layernorm", 1, True), ("layernorm", 2, True), ("top_k3", 1, True), ("top_k3", 2, True)]  # top 3 of the rehearsal's 12 layers
    assert all(row["real_tokens_per_s"] > 0 and row["peak_gib"] is None for row in result["runs"])  # no CUDA: no memory figure
    cached = torch.load(cache, weights_only=True)["length_grouped"]
    assert sum(b["input_ids"].numel() for b in cached) == result["batches"]["length_grouped"]["computed_tokens"]
    assert bench_gpu(["--out", str(tmp_path / "again.json"), *args, "--variants", ""]) == 0
    again = json.loads((tmp_path / "again.json").read_text())
    assert again["batches"] == result["batches"] and again["runs"] == []  # the same batches, read from the cache


def test_the_kernel_checks_take_the_calls_settings(tmp_path, shared_data_dir, monkeypatch: pytest.MonkeyPatch) -> None:
    """--attention-check, --dropout-check and --layer-norm-check call their kernel's check at each group size with the
    first fused method and one StepSettings: counter masks, the first compile mode and (for the later kernels) the kernels
    before them as the call gives them; and keep each row under its own key. The checks themselves are stood in for: under
    Triton's interpreter each takes minutes at the rehearsal's 12 layers (tests/fused/kernels/ run them on a 2-layer BERT)."""
    import bench.gpu_fused as gpu_fused
    from adaptune.fused.settings import StepSettings

    calls = []

    def stand_in(name: str) -> Any:
        def check(config: dict, size: str, method: str, batches: list, k: int, device: Any, **settings: Any) -> dict:
            calls.append((name, size, method, k, settings))
            return {"k": k, "attention_call": None, "dropout_call": None, "layer_norm_call": None, "kernel": {}, "kernel_calls": 0,
                    "dropout_kernel_calls": 0, "layer_norm_kernel_calls": 0, "layer_norm_backward_calls": 0}
        return check

    for name in ("attention", "dropout", "layer_norm"):
        monkeypatch.setattr(gpu_fused, f"check_{name}_kernel", stand_in(name))
    out = tmp_path / "checks.json"
    assert bench_gpu(["--out", str(out), "--rehearse", "--data-dir", str(shared_data_dir), "--batches-cache", str(tmp_path / "batches.pt"),
                      "--backbones", "bert-base", "--variants", "", "--fused", "", "--shard", "", "--shard-groups", "",
                      "--fused-methods", "adapters64,layernorm", "--fused-compile", "step_graphs,eager", "--fused-attention", "kernel",
                      "--fused-dropout", "kernel,mask", "--attention-check", "2", "--dropout-check", "2", "--layer-norm-check", "2,4"]) == 0
    def given(**held: str) -> dict[str, Any]:
        return {"task_count": 4, "settings": StepSettings(compile="step_graphs", dropout_masks="counter", **held)}

    assert calls == [("attention", "bert-base", "adapters64", 2, given()),
                     ("dropout", "bert-base", "adapters64", 2, given(attention="kernel")),
                     *[("layer_norm", "bert-base", "adapters64", k, given(attention="kernel", dropout="kernel")) for k in (2, 4)]]
    result = json.loads(out.read_text())
    assert [len(result[key]) for key in ("attention_check", "dropout_check", "layer_norm_check")] == [1, 1, 2]


def test_the_fused_variants_are_step_settings_a_group_can_train_under(tmp_path) -> None:
    """bench-gpu's --fused-* flags crossed: a kernel or step graphs asked of generator masks take their eager form, as a run
    that keeps generator masks does (StepSettings.for_masks), and a combination that comes out as one before it is timed
    once; a value no setting has fails as the flag's error, before anything runs."""
    from adaptune.fused.settings import StepSettings
    from bench.gpu_fused import crossed_settings

    crossed = crossed_settings(("generator", "counter"), ("eager", "step_graphs"), {"attention": ("eager", "kernel")})
    assert crossed == [StepSettings(), *(StepSettings(compile=compile, dropout_masks="counter", attention=attention)
                                         for compile in ("eager", "step_graphs") for attention in ("eager", "kernel"))]
    with pytest.raises(ValueError, match="not layer settings: .'residual'."):
        crossed_settings(layer_settings={"residual": ("autocast",)})
    with pytest.raises(SystemExit):
        bench_gpu(["--out", str(tmp_path / "x.json"), "--rehearse", "--fused-compile", "eager,compiled"])
    assert not (tmp_path / "x.json").exists()


def test_every_group_size_is_timed_on_every_task_alike() -> None:
    """A fused step's k batches come from one task (a group is one task's runs), the tasks in turn, so k = 1
    and k = 16 are timed on the same mix of short (CoLA) and long (RTE) batches."""
    tasks, per_task = 4, 16
    batches = [{"task": torch.tensor(task), "index": torch.tensor(i)} for task in range(tasks) for i in range(per_task)]
    for k in (1, 4, 8, 16):
        steps = [group_batches(batches, tasks, step, k) for step in range(8)]
        assert all(len(step) == k and len({int(b["task"]) for b in step}) == 1 for step in steps)
        assert sorted(int(step[0]["task"]) for step in steps) == [0, 0, 1, 1, 2, 2, 3, 3]
        first_task = [int(b["index"]) for step in steps if int(step[0]["task"]) == 0 for b in step]
        assert len(set(first_task)) == min(2 * k, per_task)  # a task's turns take its batches in order, wrapping


def test_the_fused_step_profile_names_where_its_time_goes() -> None:
    """--fused-profile's row on the CPU: aten operators per step, the heaviest by self time, no kernel
    figures without CUDA (a lent GPU adds kernels per step and the device's busy share)."""
    device, batches = pick_device(), _batches((12, 20, 16, 9))
    assert len(profile_fused(TINY, "tiny", "adapters64", batches, 2, device, steps=2, top=5)["top"]) == 5
    # Every operator (top=1000): which are heaviest depends on this machine's load, that the matmuls are profiled does not.
    row = profile_fused(TINY, "tiny", "adapters64", batches, 2, device, steps=2, top=1000)
    assert (row["k"], row["steps"], row["kernels_per_step"], row["device_busy_share"]) == (2, 2, None, None)
    assert row["step_ms"] > 0 and row["aten_ops_per_step"] > 100  # a BERT step with its optimizer: hundreds of operators
    times = [entry["self_ms_per_step"] for entry in row["top"]]
    assert 20 < len(times) < 1000 and times == sorted(times, reverse=True)
    assert {"aten::addmm", "aten::bmm"} <= {entry["name"] for entry in row["top"] if entry["calls_per_step"] > 0}


def test_a_host_profile_names_where_the_hosts_time_went() -> None:
    """bench-gpu's --shard-host-profile keeps a cProfile's heaviest functions: a function that waits 50 ms heads the
    own-time list (as a host waiting on its GPU would), its caller carries it in the cumulative list, and paths read
    from the repository, not from this machine's root."""
    import cProfile
    import time

    from bench.gpu_shard import heaviest_functions

    def waits() -> None:
        time.sleep(0.05)

    def calls_it() -> None:
        waits()
        sum(range(1000))

    with cProfile.Profile() as profiler:
        calls_it()
    heaviest = heaviest_functions(profiler, 3)
    assert len(heaviest["by_own"]) == len(heaviest["by_cumulative"]) == 3
    assert heaviest["by_own"][0]["function"] == "<built-in method time.sleep>" and heaviest["by_own"][0]["own_s"] >= 0.05
    caller = next(row for row in heaviest["by_cumulative"] if row["function"].endswith("(calls_it)"))
    assert caller["function"].startswith("tests/test_bench_gpu_fused.py:") and caller["calls"] == 1 and caller["cumulative_s"] >= 0.05
