"""One line per finished epoch, on stderr, as a run goes (the training loop calls `report_epoch`).

    rte-adapters64-s0-1a2b3c4d5e epoch 2/3: train_loss 0.6412, val accuracy 0.6354 (best so far), ...

stderr, so that `python -m adaptune train`'s stdout stays the run record (JSON); through tqdm, so the
line lands above a progress bar rather than through it. ADAPTUNE_EPOCH_LINES=0 (or off, false, no) turns the lines off.
"""

from __future__ import annotations

import math
import sys
from typing import Any

from adaptune.core import environment

ENV = "ADAPTUNE_EPOCH_LINES"


def format_epoch(run_id: str, epochs: int, primary_metric: str, point: dict[str, Any], best_epoch: int | None) -> str:
    """The line for one learning-curve point ({epoch, train_loss, val_metrics}); the selection metric first."""
    metrics = dict(point.get("val_metrics") or {})
    ordered = [primary_metric, *sorted(name for name in metrics if name != primary_metric)] if primary_metric in metrics else sorted(metrics)
    parts = [f"train_loss {_number(point.get('train_loss'))}"]
    for name in ordered:
        best = " (best so far)" if name == primary_metric and best_epoch == point.get("epoch") else ""
        parts.append(f"val {name} {_number(metrics[name])}{best}")
    return f"{run_id} epoch {point.get('epoch')}/{epochs}: " + ", ".join(parts)


def report_epoch(run_id: str, epochs: int, primary_metric: str, point: dict[str, Any], best_epoch: int | None) -> None:
    """Print `format_epoch(...)` on stderr now (flushed), unless ADAPTUNE_EPOCH_LINES=0."""
    if not environment.settings().epoch_lines:
        return
    from tqdm.auto import tqdm

    tqdm.write(format_epoch(run_id, epochs, primary_metric, point, best_epoch), file=sys.stderr)
    sys.stderr.flush()


def _number(value: Any) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "n/a"
    return f"{float(value):.4f}"
