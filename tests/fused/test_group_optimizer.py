"""A fused group's optimizer step (adaptune.fused.group_optimizer) is each run's own clipping and torch
AdamW step, done for all runs at once.

The runs here are adapter-shaped tensor sets (two decayed matrices, an undecayed bias and LayerNorm
scale) with their own learning rates, warmup-and-decay schedules and gradient scales, so that some runs
are clipped and some are not. Reference: each run's clip_grad_norm_ and torch.optim.AdamW.step(), one
after another. Both sides run the same float32 operators in the same order on each tensor, so the bound
is float32 rounding (1e-6 relative), far below what a wrong learning rate, decay or clipping gives.
"""

from __future__ import annotations

import copy
import io
import math
from types import SimpleNamespace

import pytest
import torch
from transformers import get_linear_schedule_with_warmup

from adaptune.fused.group_optimizer import adamw_together, clip_and_step, clip_each
from adaptune.train.optimizer_step import adamw
from adaptune.train.state import saved_optimizer_state

SHAPES = {"down.weight": (8, 16), "up.weight": (16, 8), "down.bias": (8,), "norm.weight": (16,)}
DECAYED = {"down.weight", "up.weight"}
STEPS = 12


def _runs(lrs: list[float], seed: int = 0) -> list[SimpleNamespace]:
    generator = torch.Generator().manual_seed(seed)
    runs = []
    for lr in lrs:
        params = {name: torch.nn.Parameter(torch.randn(shape, generator=generator)) for name, shape in SHAPES.items()}
        optimizer = adamw(params, DECAYED, lr, 0.01)
        scheduler = get_linear_schedule_with_warmup(optimizer, 3, STEPS)
        runs.append(SimpleNamespace(params=params, optimizer=optimizer, scheduler=scheduler, config=SimpleNamespace(max_grad_norm=1.0)))
    return runs


def _set_grads(runs: list[SimpleNamespace], step: int, scales: list[float]) -> None:
    generator = torch.Generator().manual_seed(1000 + step)
    for run, scale in zip(runs, scales, strict=True):
        for param in run.params.values():
            param.grad = torch.randn(param.shape, generator=generator) * scale


def _train(runs: list[SimpleNamespace], together: bool, scales: list[float], steps: range = range(STEPS)) -> list[list[float]]:
    norms = []
    for step in steps:
        _set_grads(runs, step, scales)
        losses = [torch.tensor(1.0)] * len(runs)
        norms.append([float(norm) for _, norm in clip_and_step(runs, losses, skip_non_finite=True, together=together)])
    return norms


def _assert_same(a: list[SimpleNamespace], b: list[SimpleNamespace]) -> None:
    for run_a, run_b in zip(a, b, strict=True):
        for name in SHAPES:
            torch.testing.assert_close(run_a.params[name], run_b.params[name], rtol=1e-6, atol=1e-6)
        for group_a, group_b in zip(run_a.optimizer.param_groups, run_b.optimizer.param_groups, strict=True):
            assert group_a["lr"] == group_b["lr"]


def test_together_equals_each_run_stepped_alone() -> None:
    lrs, scales = [1e-3, 3e-3, 1e-2, 3e-4], [0.01, 5.0, 0.02, 30.0]  # runs 1 and 3 are clipped, 0 and 2 not
    together, alone = _runs(lrs), _runs(lrs)
    norms_together, norms_alone = _train(together, True, scales), _train(alone, False, scales)
    assert sum(norms_together, []) == pytest.approx(sum(norms_alone, []), rel=1e-6)
    assert min(norms_alone[0][1], norms_alone[0][3]) > 1.0 > max(norms_alone[0][0], norms_alone[0][2])
    _assert_same(together, alone)
    moved = [float((run.params["down.weight"] - start.params["down.weight"]).detach().abs().max()) for run, start in zip(together, _runs(lrs))]
    assert all(change > 0 for change in moved)


def test_state_is_torch_adamw_state_both_ways() -> None:
    """A run's state saved after grouped steps resumes alone, and a solo state resumes in a group. The
    group shares one step count among a run's tensors; saved as the trainer saves it, each tensor gets
    its own, which torch's AdamW increments (saved as torch.optim's state_dict, this test fails)."""
    lrs, scales = [2e-3, 5e-3], [3.0, 0.5]
    grouped, reference = _runs(lrs), _runs(lrs)
    _train(grouped, True, scales, range(5))
    _train(reference, False, scales, range(5))
    saved = []
    for run in grouped:
        buffer = io.BytesIO()
        torch.save({"optimizer": saved_optimizer_state(run.optimizer), "scheduler": run.scheduler.state_dict()}, buffer)
        buffer.seek(0)
        saved.append(torch.load(buffer, weights_only=True))
    resumed = _runs(lrs)
    for run, source, state in zip(resumed, grouped, saved, strict=True):
        with torch.no_grad():
            for name in SHAPES:
                run.params[name].copy_(source.params[name])
        run.optimizer.load_state_dict(state["optimizer"])
        run.scheduler.load_state_dict(state["scheduler"])
    _train(resumed, False, scales, range(5, STEPS))  # alone, from the group's state
    back_in_group = copy.deepcopy(reference)
    _train(back_in_group, True, scales, range(5, STEPS))  # in a group, from solo states
    _train(reference, False, scales, range(5, STEPS))
    _assert_same(resumed, reference)
    _assert_same(back_in_group, reference)


def test_a_non_finite_run_is_not_updated_and_the_others_are() -> None:
    runs, alone = _runs([1e-3, 1e-3]), _runs([1e-3, 1e-3])
    before = runs[0].params["down.weight"].detach().clone()
    _set_grads(runs, 0, [1.0, 1.0])
    _set_grads(alone, 0, [1.0, 1.0])
    runs[0].params["down.weight"].grad[0, 0] = math.nan
    results = clip_and_step(runs, [torch.tensor(1.0), torch.tensor(1.0)], skip_non_finite=True)
    assert math.isnan(float(results[0][1])) and math.isfinite(float(results[1][1]))
    assert torch.equal(runs[0].params["down.weight"], before)
    assert not runs[0].optimizer.state
    clip_and_step(alone[1:], [torch.tensor(1.0)], skip_non_finite=True, together=False)
    _assert_same(runs[1:], alone[1:])


def test_refuses_optimizers_that_differ_beyond_lr_and_decay() -> None:
    runs = _runs([1e-3, 1e-3])
    runs[1].optimizer.param_groups[0]["betas"] = (0.8, 0.999)
    _set_grads(runs, 0, [1.0, 1.0])
    clip_each(runs)
    with pytest.raises(ValueError, match="share betas and eps"):
        adamw_together([run.optimizer for run in runs])


def test_a_state_saved_from_a_step_replayed_as_cuda_graphs_resumes_alone() -> None:
    """Step graphs (adaptune.fused.step_graphs) hold each run's learning rate in a device tensor and mark its
    AdamW capturable; the run saves plain numbers, so it resumes in a trainer whose AdamW is neither."""
    lrs, scales = [2e-3, 5e-3], [3.0, 0.5]
    graphed, reference = _runs(lrs), _runs(lrs)
    _train(graphed, False, scales, range(5))
    _train(reference, False, scales, range(5))
    resumed = _runs(lrs)
    for run, source in zip(resumed, graphed, strict=True):
        for group in source.optimizer.param_groups:  # as step_graphs leaves them (a CPU tensor here)
            group["lr"], group["capturable"] = torch.tensor(group["lr"]), True
        state = saved_optimizer_state(source.optimizer)
        assert all(type(group["lr"]) is float and group["capturable"] is False for group in state["param_groups"])
        with torch.no_grad():
            for name in SHAPES:
                run.params[name].copy_(source.params[name])
        run.optimizer.load_state_dict(state)
        run.scheduler.load_state_dict(source.scheduler.state_dict())
    _train(resumed, False, scales, range(5, STEPS))
    _train(reference, False, scales, range(5, STEPS))
    _assert_same(resumed, reference)
