"""Compare two sweeps: per task and method label, the best-on-validation score of each and the delta."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from adaptune.report.selection import best_configuration, to_percent, usable_runs
from adaptune.report.results import read_results


def sweep_summary(runs: pd.DataFrame) -> pd.DataFrame:
    """Per (task, method_label): the configuration best on validation, mean across its seeds, in percent."""
    chosen = best_configuration(usable_runs(runs), ["task", "method_label"])
    if chosen.empty:
        return pd.DataFrame(columns=["task", "method_label", "val", "reported", "split", "n_seeds", "lr", "epochs"])
    return pd.DataFrame(
        {
            "task": chosen["task"],
            "method_label": chosen["method_label"],
            "val": to_percent(chosen["val_mean"]),
            "reported": to_percent(chosen["reported_mean"]),
            "split": chosen["reported_split"],
            "n_seeds": chosen["n_seeds"],
            "lr": chosen["lr"],
            "epochs": chosen["epochs"],
        }
    )


def compare_sweeps(results_a: str | Path, results_b: str | Path) -> pd.DataFrame:
    """Outer join of two sweeps' summaries; `val_delta` and `reported_delta` are b minus a.

    A (task, method) present in only one sweep keeps its row with the other side empty, so what a
    sweep lacks shows up instead of vanishing.
    """
    a = sweep_summary(read_results(results_a)["runs"])
    b = sweep_summary(read_results(results_b)["runs"])
    merged = a.merge(b, on=["task", "method_label"], how="outer", suffixes=("_a", "_b"))
    merged["val_delta"] = merged["val_b"] - merged["val_a"]
    merged["reported_delta"] = merged["reported_b"] - merged["reported_a"]
    merged["in"] = merged.apply(_presence, axis=1)
    return merged.sort_values(["task", "method_label"]).reset_index(drop=True)


def _presence(row: pd.Series) -> str:
    if pd.isna(row["val_a"]):
        return "b only"
    if pd.isna(row["val_b"]):
        return "a only"
    return "both"
