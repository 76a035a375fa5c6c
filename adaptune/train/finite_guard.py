"""A training step's result and its finiteness check, shared by a run alone (adaptune.train.loop) and a fused
group (adaptune.train.group_loop): a diverged run must be caught at the step it diverged at, without a host sync
per step on a device with a queue."""

from __future__ import annotations

import math

import torch

from adaptune.core.devices import Device

StepResult = tuple[torch.Tensor, torch.Tensor]  # (loss, gradient norm), still on the device
# On a GPU or TPU, read the steps' losses back this often: a read waits for every queued kernel.
SYNC_EVERY_STEPS = 50


class RunFailed(Exception):
    """The run cannot go on (non-finite loss or gradients); becomes a "failed" record, not a crash."""


class FiniteGuard:
    """Loss and gradient-norm checks without a host sync per step: results stay on the device and are
    read every `every` steps (every step on the CPU, where reading costs nothing)."""

    def __init__(self, device: Device, every: int | None = None) -> None:
        self.every = every or (1 if device.kind == "cpu" else SYNC_EVERY_STEPS)
        self.results: list[StepResult] = []
        self.last_loss = math.nan

    @property
    def pending(self) -> int:
        return len(self.results)

    def add(self, result: StepResult) -> None:
        self.results.append(result)

    def due(self) -> bool:
        return len(self.results) >= self.every

    def collect(self, first_step: int) -> tuple[float, int]:
        """(sum of the losses, number of steps) since the last call; RunFailed names the first bad step."""
        if not self.results:
            return 0.0, 0
        values = torch.stack([torch.stack([loss.float(), norm.float()]) for loss, norm in self.results]).cpu()
        self.results = []
        for offset, (loss, norm) in enumerate(values.tolist()):
            if not math.isfinite(loss):
                raise RunFailed(f"non-finite training loss ({loss}) at step {first_step + offset}")
            if not math.isfinite(norm):
                raise RunFailed(f"non-finite gradient norm ({norm}) at step {first_step + offset}")
        self.last_loss = float(values[-1, 0])
        return float(values[:, 0].sum()), len(values)
