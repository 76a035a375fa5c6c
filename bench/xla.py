"""The project on XLA's CPU device: torch_xla through PJRT with PJRT_DEVICE=CPU, the TPU's lazy tensors, tracing,
compilation and mark_step with the CPU as the device (bench/xla.json).

Run in the TPU image's environment (`make venv-xla`: torch and torch_xla at the TPU image's pins):

    PJRT_DEVICE=CPU .venv-xla/bin/python -m bench.xla [--out bench/xla.json]

What it measures, on a smoke-sized sweep (SMS spam, 128 training rows, 2 epochs, MiniLM, length 64) through the shard
runner under the TPU preset:
- `runs`: per method, the graphs XLA compiled per epoch and phase (each record's curve, `xla_graphs`), its scores, and
  the same run's scores on the eager CPU in float32 beside them (XLA runs autocast to bf16, as on a TPU);
- `fused`: two adapter runs (seeds 0 and 1) as one fused group on XLA against the same runs alone on XLA;
- `step_seconds`: one adapters training step on XLA:CPU beside the eager CPU for the same batch, after warm-up (for
  information only: XLA:CPU is not a TPU);
- the versions of torch and torch_xla, the CPU, the date.
The tests of tests/xla (make test-xla) run the same sweeps through `xla_sweep` and assert on them.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import platform
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from adaptune.core import environment
from adaptune.sweep.experiments import get_experiment
from adaptune.sweep.plan import plan
from adaptune.sweep.shard_runner import run_shard
from adaptune.sweep.spec import TPU_V5E, ExperimentSpec, Sweep
from adaptune.sweep.store import RunStore

TASK = "sst2"
# The four methods a TPU sweep trains, each at a rate that learns in 16 steps (as the smoke experiment's).
METHOD_RATES = (({"name": "head"}, 1e-2), ({"name": "adapters", "size": 16, "init_std": 1e-2}, 3e-3), ({"name": "layernorm"}, 3e-3),
                ({"name": "full"}, 2e-4))


def xla_spec(methods: Sequence[tuple[dict[str, Any], float]] = METHOD_RATES, seeds: tuple[int, ...] = (0,)) -> ExperimentSpec:
    """A smoke-sized sweep under the TPU preset: one task, these (method, rate) pairs, 2 epochs of 8 steps, one shard."""
    sweeps = tuple(Sweep(tasks=(TASK,), methods=(method,), learning_rates=(lr,), epochs=(2,), seeds=seeds, max_length=64, batch_size=16)
                   for method, lr in methods)
    return dataclasses.replace(get_experiment("smoke"), name="xla_cpu", accelerator=TPU_V5E, ablation=None, max_train_examples=128,
                               max_eval_examples=64, shard_size=64, sweeps=sweeps)


def xla_sweep(spec: ExperimentSpec, root: Path, data_dir: Path, device: str, group_size: int | None = None) -> list[dict[str, Any]]:
    """Every run of `spec` trained into a store at `root` on `device` ("xla" or "cpu": the eager CPU in float32);
    their records in plan order. `group_size` fuses runs as the shard runner would (None: the preset's, 1 on a TPU)."""
    store = RunStore(str(root))
    planned = plan(spec)
    with environment.patch(device=device, cpu_bf16="0"):
        for shard in planned.shards:
            run_shard(spec, shard.id, store, data_dir=data_dir, group_size=group_size)
    runs = [run for shard in planned.shards for run in shard.runs]
    records = [store.record(run.run_id) for run in runs]
    missing = [run.run_id for run, record in zip(runs, records, strict=True) if record is None]
    assert not missing, f"runs without a record: {missing}"
    return [record for record in records if record is not None]


def graphs(record: dict[str, Any]) -> list[dict[str, int]]:
    """The graphs XLA compiled in each epoch of a run, by phase (steps, epoch_end)."""
    return [point["xla_graphs"] for point in record["curve"]]


def step_seconds(device_kind: str, steps: int = 10, warmup: int = 3) -> dict[str, Any]:
    """Seconds of one adapters training step (batch 16 x 64 tokens, the same token ids on every device) on `device_kind`
    ("xla" or "cpu", float32 eager), after `warmup` steps (XLA compiles there); the mean of `steps` timed ones."""
    import torch

    from adaptune.core.backbones import DEFAULT_BACKBONE
    from adaptune.core.devices import pick_device
    from adaptune.model.backbone import load_model
    from adaptune.model.methods import AdaptersConfig, apply_method
    from adaptune.train.optimizer_step import model_adamw, training_step
    from adaptune.train.state import trained_parameters

    torch.manual_seed(0)
    device = pick_device(device_kind, cpu_precision="float32")
    model = load_model(DEFAULT_BACKBONE, "classification", 2)
    apply_method(model, AdaptersConfig(size=16))
    model.to(device.torch_device)  # type: ignore[arg-type]  # transformers' to() wraps nn.Module.to with a wrong signature
    model.train()
    generator = torch.Generator().manual_seed(0)
    batch = {"input_ids": torch.randint(1000, 20000, (16, 64), generator=generator), "attention_mask": torch.ones(16, 64, dtype=torch.long),
             "labels": torch.randint(0, 2, (16,), generator=generator)}
    batch = {name: tensor.to(device.torch_device) for name, tensor in batch.items()}
    trainable = list(trained_parameters(model).values())
    optimizer = model_adamw(model, 1e-3, 0.01)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    for _ in range(warmup):
        training_step(model, batch, optimizer, scheduler, trainable, device, 1.0)
    device.synchronize()
    started = time.perf_counter()
    for _ in range(steps):
        loss, _ = training_step(model, batch, optimizer, scheduler, trainable, device, 1.0)
    float(loss)
    device.synchronize()
    return {"device": device.name, "precision": str(device.autocast_dtype or torch.float32).removeprefix("torch."),
            "seconds_per_step": round((time.perf_counter() - started) / steps, 4), "compiled_graphs": device.compiled_graphs()}


def _scores(record: dict[str, Any]) -> dict[str, Any]:
    return {"status": record["status"], "device": record["device"], "val": record["val_metrics"], "test": record["test_metrics"],
            "train_loss": [point["train_loss"] for point in record["curve"]]}


def main(argv: Sequence[str] | None = None) -> int:
    import torch
    import torch_xla

    from adaptune.data.sources import resolve_data_dir

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench/xla.json")
    parser.add_argument("--work", default=None, help="where the stores go (default: a temporary directory)")
    args = parser.parse_args(argv)
    import tempfile

    work = Path(args.work or tempfile.mkdtemp(prefix="bench-xla-"))
    found = resolve_data_dir(None)
    if found is None:
        raise SystemExit("no data mirror found: run from a checkout with ../shared/data beside it")
    data_dir = Path(found)
    spec = xla_spec()
    result: dict[str, Any] = {
        "date": datetime.date.today().isoformat(), "torch": torch.__version__, "torch_xla": torch_xla.__version__,
        "cpu": platform.processor() or platform.machine(), "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "sweep": {"task": TASK, "train_rows": spec.max_train_examples, "eval_rows": spec.max_eval_examples, "epochs": 2, "batch_size": 16,
                  "max_length": 64},
    }
    timed = {}
    for device in ("xla", "cpu"):
        started = time.perf_counter()
        timed[device] = xla_sweep(spec, work / device, data_dir, device)
        result[f"{device}_sweep_seconds"] = round(time.perf_counter() - started, 1)
    result["runs"] = [{"method": xla["method_label"] if "method_label" in xla else xla["method"]["name"], "xla": _scores(xla),
                       "cpu_float32": _scores(cpu), "xla_graphs": graphs(xla)} for xla, cpu in zip(timed["xla"], timed["cpu"], strict=True)]
    pair = xla_spec(methods=METHOD_RATES[1:2], seeds=(0, 1))
    alone = xla_sweep(pair, work / "alone", data_dir, "xla", group_size=1)
    fused = xla_sweep(pair, work / "fused", data_dir, "xla", group_size=2)
    result["fused"] = [{"seed": a["config"]["seed"], "alone": _scores(a), "fused": _scores(f), "fused_graphs": graphs(f)}
                       for a, f in zip(alone, fused, strict=True)]
    result["step_seconds"] = {kind: step_seconds(kind) for kind in ("xla", "cpu")}
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
