"""The run record: one JSON-serialisable dict per run (ARCHITECTURE.md, "The run record").

Declared once here; train.py fills it in as a run goes, and a run that raised before train.py could
write one (a data error inside a pipeline component) still gets every key.
"""

from __future__ import annotations

from typing import Any

from adaptune.config import TrainConfig, method_label


def run_record(config: TrainConfig, primary_metric: str, device: str | None = None) -> dict[str, Any]:
    """Every key of the run record, status "ok" and nothing measured yet."""
    return {
        "run_id": config.run_id,
        "experiment": config.experiment,
        "task": config.task,
        "method": dict(config.method),
        "method_label": method_label(config.method),
        "lr": config.lr,
        "epochs": config.epochs,
        "seed": config.seed,
        "backbone": config.backbone,
        "config": config.to_dict(),
        "status": "ok",
        "reason": None,
        "trained_params": None,
        "total_params": None,
        "primary_metric": primary_metric,
        "best_epoch": None,
        "val_metrics": {},
        "test_metrics": {},
        "curve": [],
        "wall_time_s": None,
        "train_examples_per_s": None,
        "device": device,
        "checkpoint_dir": None,
    }
