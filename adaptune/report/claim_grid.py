"""The grid each claim was decided on: what the runs swept, and what of the paper's grid they lack."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import pandas as pd

from adaptune.core.paper_grids import DEVLIN_GLUE_EPOCHS, DEVLIN_GLUE_LRS, EXTRA_LRS, GLUE_EPOCHS, GLUE_LRS
from adaptune.data.tasks import UnknownTaskError, get_task

# (learning rates, epochs) the paper sweeps for a method on a task; rates None: each rate the runs have.
PaperGrid = Callable[[str, str], tuple[tuple[float, ...] | None, tuple[int, ...]]]


def paper_grid(method: str, task: str) -> tuple[tuple[float, ...], tuple[int, ...]]:
    """An additional task's: §3.3's rates at Table 4's epochs (its fine-tuning column for full and top-k).
    GLUE's (and any other task's): §3.2's grid; for full fine-tuning, Devlin et al.'s."""
    try:
        epochs = get_task(task).paper_epochs
    except UnknownTaskError:
        epochs = None
    if epochs is not None:
        return EXTRA_LRS, (epochs[0] if method in ("full", "top_k") else epochs[1],)
    return (DEVLIN_GLUE_LRS, DEVLIN_GLUE_EPOCHS) if method == "full" else (GLUE_LRS, GLUE_EPOCHS)


def figure7_grid(method: str, task: str) -> tuple[None, tuple[int, ...]]:
    """Figure 7 gives a range of rates, not a grid: §3.2's epochs at each rate measured."""
    return None, GLUE_EPOCHS


def grid_columns(runs: pd.DataFrame, grid: PaperGrid) -> dict:
    """`grid`, `grid_lacks` and `grid_smaller_than_paper` of the runs a claim was decided on, per method label."""
    if runs.empty:
        return {"grid": None, "grid_lacks": None, "grid_smaller_than_paper": None}
    runs = runs.drop_duplicates("run_id")
    runs = runs.assign(label=runs["method_label"].fillna(runs["method"]), lr_text=runs["lr"].map(_lr_text))
    described, lacking = [], []
    for label, rows in runs.groupby("label", sort=False):
        described.append(f"{label}: {_grid_text(rows)}")
        if lacks := _grid_lacks(rows, grid):
            lacking.append(f"{label} lacks {lacks}")
    return {"grid": "; ".join(described), "grid_lacks": "; ".join(lacking), "grid_smaller_than_paper": bool(lacking)}


def _grid_text(rows: pd.DataFrame) -> str:
    """e.g. "lr {3e-4, 3e-3} x epochs {3, 20}, 3 seeds"; a grid that is not a full product lists its
    configurations; a configuration not on every task says where it is."""
    lrs = sorted(rows["lr_text"].unique(), key=float)
    epochs = sorted(rows["epochs"].unique())
    configs = rows.groupby(["lr_text", "epochs"])["task"].unique()
    configs = configs.reindex(sorted(configs.index, key=lambda config: (float(config[0]), config[1])))
    if len(configs) == len(lrs) * len(epochs):
        text = f"lr {{{', '.join(lrs)}}} x epochs {{{', '.join(map(str, epochs))}}}"
    else:
        text = "lr x epochs {" + ", ".join(f"{lr} x {n}" for lr, n in configs.index) + "}"
    seeds = rows.groupby(["task", "lr_text", "epochs"])["seed"].nunique()  # per task and configuration
    fewest, most = int(seeds.min()), int(seeds.max())
    text += f", {fewest} seed{'s' if fewest > 1 else ''}" if fewest == most else f", {fewest}-{most} seeds"
    tasks = set(rows["task"])
    some = [f"{lr} x {n} on {', '.join(sorted(on))} only" for (lr, n), on in configs.items() if set(on) < tasks]
    return text + (f" ({'; '.join(some)})" if some else "")


def _grid_lacks(rows: pd.DataFrame, grid: PaperGrid) -> str:
    """What of the paper's grid (per task) these runs of one method lack, e.g. "lr {3e-5}, 3e-3 x 20 epochs on
    {mrpc}": rates and epoch counts with no run at all, then single configurations (on the tasks that lack
    them where not all do); "" when they lack nothing."""
    method = rows["method"].iloc[0]
    present = set(zip(rows["lr_text"], rows["epochs"], rows["task"]))
    expected = set()
    for task in sorted(set(rows["task"])):
        lrs, epochs = grid(method, task)
        lr_texts = [_lr_text(lr) for lr in lrs] if lrs is not None else sorted({lr for lr, _, on in present if on == task})
        expected |= {(lr, n, task) for lr, n in itertools.product(lr_texts, epochs)}
    missing = expected - present
    have_lrs, have_epochs = {lr for lr, _, _ in present}, {n for _, n, _ in present}
    no_lrs = sorted({lr for lr, _, _ in missing} - have_lrs, key=float)
    no_epochs = sorted({n for _, n, _ in missing} - have_epochs)
    parts = [f"lr {{{', '.join(no_lrs)}}}"] if no_lrs else []
    parts += [f"epochs {{{', '.join(map(str, no_epochs))}}}"] if no_epochs else []
    for lr, n in sorted({(lr, n) for lr, n, _ in missing if lr in have_lrs and n in have_epochs}, key=lambda c: (float(c[0]), c[1])):
        lacking = sorted(task for lr2, n2, task in missing if (lr2, n2) == (lr, n))
        asked = {task for lr2, n2, task in expected if (lr2, n2) == (lr, n)}
        parts.append(f"{lr} x {n} epochs" + ("" if set(lacking) == asked else f" on {{{', '.join(lacking)}}}"))
    return ", ".join(parts)


def _lr_text(lr: float) -> str:
    """3e-4, 1e-5, 2.5e-5: the paper's notation."""
    mantissa, exponent = f"{lr:e}".split("e")
    return f"{float(mantissa):g}e{int(exponent)}"
