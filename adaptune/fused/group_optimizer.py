"""The optimizer step of a fused run group: every run's gradient clipping and AdamW update in a fixed
number of multi-tensor (foreach) operators, whatever the group size, instead of one optimizer per run.

Each run keeps its own torch AdamW and schedule: they hold its learning rate, weight decay and state
(step, exp_avg, exp_avg_sq, in torch's own layout), so a run's saved state loads into the same run
trained alone or in another group. Only the arithmetic is shared: the update is torch's AdamW with
decoupled weight decay, operator for operator (torch.optim.adam's multi-tensor path), with a learning
rate per tensor, which no library AdamW takes (torch's takes one per call), hence written here.
Clipping is each run's own: its norm over its own tensors, its own coefficient.

`clip_and_step(..., together=False)` is the reference: each run's clip_grad_norm_ and optimizer.step(),
one run after another, as the group did before (the benchmark measures the two side by side).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any, Protocol

import torch


class OptimizedRun(Protocol):
    params: dict[str, torch.nn.Parameter]
    optimizer: torch.optim.Optimizer
    scheduler: Any
    config: Any  # max_grad_norm


def clip_each(runs: Sequence[OptimizedRun]) -> list[torch.Tensor]:
    """Each run's gradients clipped to its own max norm, as clip_grad_norm_ does alone; returns each run's
    norm before clipping, on the device. One norm operator for all runs, one scaling operator per run."""
    grads = [[p.grad for p in run.params.values() if p.grad is not None] for run in runs]
    limits = {float(run.config.max_grad_norm) for run in runs}  # a group's runs share it (adaptune.fused.grouping)
    if len(limits) != 1 or len({len(run_grads) for run_grads in grads}) != 1 or not grads[0]:
        return [torch.nn.utils.clip_grad_norm_(list(run.params.values()), run.config.max_grad_norm) for run in runs]
    flat = [grad for run_grads in grads for grad in run_grads]
    per_tensor = torch.stack(torch._foreach_norm(flat)).view(len(runs), -1)
    norms = torch.linalg.vector_norm(per_tensor, 2.0, dim=1)
    coefficients = (limits.pop() / (norms + 1e-6)).clamp(max=1.0)  # a host scalar: no copy to the device
    for run_grads, coefficient in zip(grads, coefficients.unbind(), strict=True):
        torch._foreach_mul_(run_grads, coefficient)
    return list(norms.unbind())


def adamw_together(optimizers: Sequence[torch.optim.Optimizer]) -> None:
    """One AdamW step of every optimizer at once. The optimizers must agree on betas and eps (a group's
    runs do: they differ in lr and seed); each tensor gets its own optimizer's lr and weight decay."""
    beta1, beta2, eps = _shared_betas_eps(optimizers)
    step = _AdamWStep()
    for optimizer in optimizers:
        step.gather(optimizer, beta1, beta2)
    for optimizer in optimizers:
        optimizer._opt_called = True  # type: ignore[attr-defined]  # what optimizer.step() marks for its scheduler's order check
    if step.params:
        step.apply(beta1, beta2, eps)


def _shared_betas_eps(optimizers: Sequence[torch.optim.Optimizer]) -> tuple[float, float, float]:
    settings = {(tuple(group["betas"]), group["eps"], group.get("amsgrad", False), group.get("maximize", False))
                for optimizer in optimizers for group in optimizer.param_groups}
    if len(settings) != 1 or any(amsgrad or maximize for _, _, amsgrad, maximize in settings):
        raise ValueError(f"optimizers stepped together must share betas and eps, without amsgrad or maximize; got {sorted(settings)}")
    ((beta1, beta2), eps, _, _), = settings
    return beta1, beta2, eps


@dataclasses.dataclass
class _AdamWStep:
    """The tensors of one AdamW step of several optimizers, listed for torch's foreach operators."""

    params: list[torch.Tensor] = dataclasses.field(default_factory=list)
    grads: list[torch.Tensor] = dataclasses.field(default_factory=list)
    exp_avgs: list[torch.Tensor] = dataclasses.field(default_factory=list)
    exp_avg_sqs: list[torch.Tensor] = dataclasses.field(default_factory=list)
    steps: list[torch.Tensor] = dataclasses.field(default_factory=list)
    step_sizes: list[float] = dataclasses.field(default_factory=list)
    bias_correction2_sqrts: list[float] = dataclasses.field(default_factory=list)
    decayed: list[torch.Tensor] = dataclasses.field(default_factory=list)
    decay_factors: list[float] = dataclasses.field(default_factory=list)

    def gather(self, optimizer: torch.optim.Optimizer, beta1: float, beta2: float) -> None:
        """List one optimizer's tensors with a gradient (their state made where it is new)."""
        # A run's tensors are always stepped together (each gets a gradient every step), so they share one
        # step count: one tensor per run that torch's layout lists under each of them, one increment per
        # run instead of one per tensor (each a host operator).
        run_step: torch.Tensor | None = None
        for group in optimizer.param_groups:
            lr, weight_decay = float(group["lr"]), float(group["weight_decay"])
            for param in group["params"]:
                if param.grad is None:
                    continue
                state = optimizer.state[param]
                if not state:  # as torch initialises it; the step on the host, so reading it never syncs
                    state["step"] = run_step if run_step is not None else torch.tensor(0.0)
                    state["exp_avg"] = torch.zeros_like(param, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(param, memory_format=torch.preserve_format)
                elif state["step"].device.type != "cpu":  # a state torch's fused AdamW kept on the device
                    state["step"] = state["step"].cpu()
                if run_step is None:
                    run_step = state["step"]
                    step = float(run_step) + 1
                    self.steps.append(run_step)
                elif state["step"] is not run_step:  # a loaded state holds a copy per tensor
                    state["step"] = run_step
                self.params.append(param)
                self.grads.append(param.grad)
                self.exp_avgs.append(state["exp_avg"])
                self.exp_avg_sqs.append(state["exp_avg_sq"])
                self.step_sizes.append(-lr / (1 - beta1**step))
                self.bias_correction2_sqrts.append((1 - beta2**step) ** 0.5)
                if weight_decay != 0:
                    self.decayed.append(param)
                    self.decay_factors.append(1 - lr * weight_decay)

    def apply(self, beta1: float, beta2: float, eps: float) -> None:
        """The update of every listed tensor, one foreach operator per AdamW stage."""
        with torch.no_grad():
            torch._foreach_add_(self.steps, 1.0)
            if self.decayed:
                torch._foreach_mul_(self.decayed, self.decay_factors)
            torch._foreach_lerp_(self.exp_avgs, self.grads, 1 - beta1)
            torch._foreach_mul_(self.exp_avg_sqs, beta2)
            torch._foreach_addcmul_(self.exp_avg_sqs, self.grads, self.grads, 1 - beta2)
            denominators = torch._foreach_sqrt(self.exp_avg_sqs)
            torch._foreach_div_(denominators, self.bias_correction2_sqrts)
            torch._foreach_add_(denominators, eps)
            torch._foreach_addcdiv_(self.params, self.exp_avgs, denominators, self.step_sizes)


def clip_and_step(runs: Sequence[OptimizedRun], losses: Sequence[torch.Tensor], skip_non_finite: bool,
                  together: bool = True) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each run's clipping, AdamW update and schedule step after a shared backward; returns each run's
    (loss, gradient norm before clipping), on the device. With `skip_non_finite` (the CPU, where reading
    costs nothing) a run whose loss or norm is not finite is not updated, as alone. `together=False` is
    the reference: each run's own clip_grad_norm_ and optimizer.step(), one run after another."""
    if together:
        norms = clip_each(runs)
    else:
        norms = [torch.nn.utils.clip_grad_norm_(list(run.params.values()), run.config.max_grad_norm) for run in runs]
    results = list(zip(losses, norms, strict=True))
    stepping = [run for run, (loss, norm) in zip(runs, results, strict=True)
                if not skip_non_finite or (math.isfinite(float(loss)) and math.isfinite(float(norm)))]
    if together:
        adamw_together([run.optimizer for run in stepping])
    else:
        for run in stepping:
            run.optimizer.step()
    for run in stepping:
        run.scheduler.step()
    for run in runs:
        run.optimizer.zero_grad(set_to_none=True)
    return results
