"""The GPU benchmark's fused-group measurement (adaptune.bench.gpu_fused) runs on the CPU too, on a tiny
BERT: a lent GPU's minutes are too few to find a broken benchmark there (the first GPU session lost
its side-by-side shard to failures that no CPU run had exercised)."""

from __future__ import annotations

import torch

from adaptune.bench.gpu_fused import _group, measure_fused
from adaptune.core.devices import pick_device
from adaptune.train.group_loop import stack_run_batches

TINY = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64}


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
    rows = measure_fused(TINY, "tiny", "adapters64", batches, (1, 2), device, repeats=1, peak=1e12, steps=2,
                         optimizer_steps=("together", "per_run"), mask_schemes=("generator", "counter"))
    assert [(row["k"], row["optimizer_step"], row["masks"], row["compile"]) for row in rows] == [
        (k, optimizer, masks, "eager") for k in (1, 2) for optimizer in ("together", "per_run") for masks in ("generator", "counter")]
    assert rows[0]["speedup_vs_k1"] == 1.0
    assert all(row["examples_per_s"] > 0 and row["mfu"] > 0 and row["peak_gib"] is None for row in rows)
    # Two runs' FLOPs per fused step: each run's own batch at the step's padded length (20 tokens).
    fused = [stack_run_batches(batches[:2], 0, device.torch_device)]
    _, _, runs, run_flops = _group(TINY, {"name": "layernorm"}, 2, device, fused)
    solo = _group(TINY, {"name": "layernorm"}, 1, device, [stack_run_batches(batches[1:2], 0, device.torch_device)])
    assert len(runs) == 2 and run_flops == solo[3]  # batch 1 is the longer: both runs pay its length
