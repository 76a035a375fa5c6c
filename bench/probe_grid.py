"""The head alone as a probe (adaptune.train.probe): which epochs and rates it needs, and what it costs beside the head
trained through the whole model, on real tasks.

    .venv/bin/python -m bench.probe_grid [--tasks mrpc,sms_spam] [--train-rows 384] [--eval-rows 128] [--max-length 64]
        [--batch-size 16] [--epochs 2,10,30,100] [--rates 1e-3,3e-3,1e-2,3e-2,1e-1] [--out bench/probe_grid.json]

Per task, one process trains the probe over every (epochs, rate), seed 0, in float32, the task's features computed by
the first run and reused by the rest; then the head through the whole model (the probe refused) at the grid's first
epochs and each rate, side by side in the same process: the old way, with the backbone's dropout on. Writes per run
its validation and test score, last epoch's loss and seconds, and per task the grid's best on validation and the
seconds of the feature pass. The experiments' PROBE_EPOCHS and PROBE_RATES come from it (bench/LOG.md).
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def train(config: Any, data_dir: str | None, out: Path) -> dict[str, Any]:
    from adaptune.train.loop import train_and_evaluate

    started = time.perf_counter()
    record = train_and_evaluate(config, data_dir=data_dir, out_dir=out / config.run_id, progress=False)
    metric = record["primary_metric"]
    return {"epochs": config.epochs, "lr": config.lr, "status": record["status"],
            "val": _points(record["val_metrics"].get(metric)), "test": _points((record["test_metrics"] or {}).get(metric)),
            "last_loss": round(record["curve"][-1]["train_loss"], 4), "seconds": round(time.perf_counter() - started, 2),
            "probe": record.get("probe")}


def _points(value: float | None) -> float | None:
    return None if value is None else round(100 * value, 2)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", default="mrpc,sms_spam")
    parser.add_argument("--train-rows", type=int, default=384)
    parser.add_argument("--eval-rows", type=int, default=128)
    parser.add_argument("--max-length", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--epochs", default="2,10,30,100")
    parser.add_argument("--rates", default="1e-3,3e-3,1e-2,3e-2,1e-1")
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "probe_grid.json")
    args = parser.parse_args(argv)

    import torch

    from adaptune.core import environment
    from adaptune.core.files import write_json
    from adaptune.train import loop
    from adaptune.train.config import TrainConfig

    epochs_grid = [int(value) for value in args.epochs.split(",")]
    rates = [float(value) for value in args.rates.split(",")]
    results: dict[str, Any] = {"date": datetime.date.today().isoformat(), "torch": torch.__version__,
                               "cpu": platform.processor() or platform.machine(), "cpu_capability": torch.backends.cpu.get_cpu_capability(),
                               "args": {k: str(v) for k, v in vars(args).items()}, "tasks": {}}
    with environment.patch(cpu_bf16="0"), tempfile.TemporaryDirectory() as scratch:
        for task in args.tasks.split(","):
            def config(epochs: int, lr: float, task: str = task) -> Any:
                return TrainConfig(task=task, method={"name": "head"}, lr=lr, epochs=epochs, max_length=args.max_length,
                                   batch_size=args.batch_size, max_train_examples=args.train_rows, max_eval_examples=args.eval_rows,
                                   experiment="probe_grid")

            probes = [train(config(epochs, lr), args.data_dir, Path(scratch) / "probe") for epochs in epochs_grid for lr in rates]
            real_probe_head = loop.probe_head
            loop.probe_head = lambda *a: None  # the head through the whole model, as before
            try:
                whole = [train(config(epochs_grid[0], lr), args.data_dir, Path(scratch) / "whole") for lr in rates]
            finally:
                loop.probe_head = real_probe_head
            best = max(probes, key=lambda run: -1e9 if run["val"] is None else run["val"])
            results["tasks"][task] = {"probe": probes, "whole_model": whole, "best_on_validation": best,
                                      "feature_pass_s": probes[0]["probe"]["feature_s"]}
            print(json.dumps({"task": task, "best": best, "feature_pass_s": probes[0]["probe"]["feature_s"]}), flush=True)
    write_json(args.out, results, sort_keys=False)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
