"""`make bench-states`: what saving a run's resume state costs, and what adaptune.train.state_saves spares a sweep.

    python -m bench.state_saves --out bench/state_saves.json [--experiment paper_full]

1. `saves`: adaptune.train.state.save_state timed here (median of 3, this machine's disk) for BERT-base and
   BERT-large shaped models (random weights: a save's time depends on its bytes, not its values), adapters 64,
   top-k 3 and full fine-tuning, each with AdamW's moments filled: bytes, seconds, MB/s.
2. `experiment`: the experiment's planned groups on its accelerator, each epoch taking the plan's estimated
   hours (adaptune.sweep.plan: a group's epoch is the sum of its runs' shares), each save its runs' state bytes
   at the slowest rate measured in 1. How many states the runs write, and the hours a group's accelerator waits
   for them, when every epoch's end saves (as before 2026-11-28) against state_saves' rule. An estimate from
   measured parts: the plan's hours are estimates, and a GPU machine's disk is not this one's.
Not a test: no pass/fail here.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import BertConfig, BertForSequenceClassification, get_linear_schedule_with_warmup

from adaptune.model.methods import apply_method, method_from_dict
from adaptune.sweep.experiments import get_experiment
from adaptune.sweep.plan import plan
from adaptune.sweep.throughput import backbone_key
from adaptune.train.state import Progress, save_state, trained_parameters
from adaptune.train.state_saves import SAVE_COST_MULTIPLE, STATE_EVERY_S, StateSaves

SHAPES = {  # BERT's published sizes (Devlin et al. 2019), by the throughput table's names
    "bert-base-uncased": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072),
    "bert-large-uncased": dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096),
}
MEASURED = {"bert-base-uncased": ("adapters64", "top_k3", "full"), "bert-large-uncased": ("adapters64", "full")}
METHODS = {"adapters64": {"name": "adapters", "size": 64}, "top_k3": {"name": "top_k", "k": 3}, "full": {"name": "full"}}


def _model(backbone: str, method: dict[str, Any], device: str = "cpu") -> torch.nn.Module:
    with torch.device(device):
        model = BertForSequenceClassification(BertConfig(**SHAPES[backbone], num_labels=2))
        apply_method(model, method_from_dict(method))
    return model


def measure_saves(repeats: int = 3) -> list[dict[str, Any]]:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for backbone, labels in MEASURED.items():
            for label in labels:
                model = _model(backbone, METHODS[label])
                trained = trained_parameters(model)
                optimizer = torch.optim.AdamW(trained.values(), lr=1e-4)
                for parameter in trained.values():
                    parameter.grad = torch.zeros_like(parameter)
                optimizer.step()  # fills both moments, as any saved run has them
                scheduler = get_linear_schedule_with_warmup(optimizer, 10, 100)
                seconds = []
                for _ in range(repeats):
                    started = time.perf_counter()
                    save_state(Path(tmp), "bench", trained, optimizer, scheduler, Progress())
                    seconds.append(time.perf_counter() - started)
                size = (Path(tmp) / "train_state.pt").stat().st_size
                median = statistics.median(seconds)
                rows.append({"backbone": backbone, "method": label, "trained_params": sum(p.numel() for p in trained.values()),
                             "state_bytes": size, "save_s": round(median, 3), "mb_per_s": round(size / median / 1e6, 1)})
                del model, trained, optimizer
    return rows


@functools.lru_cache(maxsize=None)
def _trained_count(backbone: str, method_json: str) -> int:
    return sum(p.numel() for p in trained_parameters(_model(backbone, json.loads(method_json), device="meta")).values())


def state_bytes(backbone: str, method: dict[str, Any]) -> int:
    """A run's state: its trained tensors and AdamW's two moments, in float32 (the rest is small)."""
    return 12 * _trained_count(backbone_key(backbone), json.dumps(method, sort_keys=True))


def _saves(epoch_s: float, epochs: int, save_s: float, every_epoch: bool) -> int:
    """How many states a group writes: at every epoch's end, or as StateSaves decides on a clock that each epoch
    moves on by `epoch_s` and each save by `save_s`."""
    if every_epoch:
        return epochs
    now = [0.0]
    saves, count = StateSaves(every_s=STATE_EVERY_S, clock=lambda: now[0]), 0
    for epoch in range(1, epochs + 1):
        now[0] += epoch_s
        if saves.due_at_epoch_end(last_epoch=epoch == epochs):
            with saves.saving():
                now[0] += save_s
            count += 1
    return count


def experiment_saves(name: str, bytes_per_s: float) -> dict[str, Any]:
    planned = plan(get_experiment(name))
    totals = {"every_epoch": [0, 0.0, 0.0], "state_saves": [0, 0.0, 0.0]}  # states, TB, hours
    for group in planned.groups:
        epochs = group[0].epochs
        epoch_s = sum(planned.run_hours[run.run_id] for run in group) * 3600 / epochs
        group_bytes = sum(state_bytes(run.backbone, run.method) for run in group)
        for policy, total in totals.items():
            saves = _saves(epoch_s, epochs, group_bytes / bytes_per_s, every_epoch=policy == "every_epoch")
            total[0] += saves * len(group)
            total[1] += saves * group_bytes / 1e12
            total[2] += saves * group_bytes / bytes_per_s / 3600
    hours = planned.accelerator_hours
    return {"experiment": name, "accelerator": planned.spec.accelerator.label, "planned_hours": round(hours, 1),
            "groups": len(planned.groups), "runs": len(planned.runs), "bytes_per_s": round(bytes_per_s),
            **{policy: {"states": states, "terabytes": round(tb, 2), "hours_writing": round(h, 1), "share_of_plan": round(h / hours, 4)}
               for policy, (states, tb, h) in totals.items()}}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.state_saves", description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench/state_saves.json")
    parser.add_argument("--experiment", default="paper_full")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    started = time.perf_counter()
    saves = measure_saves()
    slowest = min(row["mb_per_s"] for row in saves if row["method"] == "full") * 1e6
    results = {"saves": saves, "experiment": experiment_saves(args.experiment, slowest),
               "rule": {"state_every_s": STATE_EVERY_S, "save_cost_multiple": SAVE_COST_MULTIPLE},
               "elapsed_s": round(time.perf_counter() - started, 1)}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))
    print(f"bench: wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
