"""Compare two sweeps: per task and method label, the best-on-validation score of each and the delta;
and run by run, the runs both trained (the same configuration on another precision, device or code).

A run of a fused group of k trained its rows beside k - 1 other runs, all in the group's time: its own
examples/s is a k-th of what the device did. Speed is compared as the device's: a run's examples/s times its
group's size (what its group trained per second), and each run's share of its group's wall time."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd

from adaptune.report.bootstrap import bootstrap_ci
from adaptune.report.results import read_results, run_precision
from adaptune.report.selection import best_configuration, to_percent, usable_runs


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


# ---- the same runs trained twice: another precision, device or code version --------------------

PAIR_KEYS = ["run_id", "task", "method_label", "lr", "epochs", "seed"]
# What `python -m pipelines compare` prints of each pair (paired_runs.parquet keeps every column).
SHOWN_PAIR_COLUMNS = ["run_id", "precision_a", "precision_b", "group_size_a", "group_size_b", "status_a", "status_b", "val_a", "val_b",
                      "test_a", "test_b", "test_delta", "speed_ratio"]


def paired_runs(runs_a: pd.DataFrame, runs_b: pd.DataFrame) -> pd.DataFrame:
    """The runs both sweeps trained (same run id, so the same configuration), side by side: device,
    `precision` (results.run_precision), `group_size` (the runs that shared its steps), status and scores (percent)
    of each, `val_delta` and `test_delta` b minus a; speed read a group as a group: `examples_per_s` (the run's
    training examples/s times its group's size: what the device trained a second), `run_seconds` (its share of its
    group's wall time: wall time / group size) and `speed_ratio` (b's examples_per_s over a's); and
    `settings_changed`: the step settings that differ ("residual: float32 -> bf16"; "" for none, None where a side
    recorded none of them, "unrecorded" for one a side did not record). Runs only one side has are left out: there
    is nothing to pair."""
    columns = ["device", "group_size", "status", "val_score", "test_score", "train_examples_per_s", "wall_time_s", "step_settings_json"]
    merged = runs_a[PAIR_KEYS + columns].merge(runs_b[["run_id"] + columns], on="run_id", suffixes=("_a", "_b"))
    for split in ("val", "test"):
        for side in ("a", "b"):
            merged[f"{split}_{side}"] = to_percent(merged.pop(f"{split}_score_{side}"))
        merged[f"{split}_delta"] = merged[f"{split}_b"] - merged[f"{split}_a"]
    for side in ("a", "b"):
        size = merged[f"group_size_{side}"].fillna(1).clip(lower=1).astype(int)  # records before groups: alone
        merged[f"group_size_{side}"] = size
        merged[f"precision_{side}"] = merged[f"device_{side}"].map(run_precision)
        merged[f"examples_per_s_{side}"] = merged.pop(f"train_examples_per_s_{side}") * size
        merged[f"run_seconds_{side}"] = merged.pop(f"wall_time_s_{side}") / size
    merged["speed_ratio"] = merged["examples_per_s_b"] / merged["examples_per_s_a"]
    merged["settings_changed"] = [_settings_changed(a, b) for a, b in zip(merged.pop("step_settings_json_a"),
                                                                          merged.pop("step_settings_json_b"), strict=True)]
    return merged.sort_values(["task", "method_label", "lr", "epochs", "seed"]).reset_index(drop=True)


def paired_markdown(pairs: pd.DataFrame) -> str:
    """The pairs as the compare command prints them: SHOWN_PAIR_COLUMNS, to 2 decimals, each delta the difference of
    the two values shown (48.92 vs 48.93: +0.01, never 0.00), and never "-0.00"."""
    shown = _rounded(pairs[SHOWN_PAIR_COLUMNS])
    for split in ("val", "test"):
        if f"{split}_delta" in shown:
            shown[f"{split}_delta"] = _rounded(shown[f"{split}_b"] - shown[f"{split}_a"])
    return shown.to_markdown(index=False, floatfmt=".2f")


def summary_markdown(summary: pd.DataFrame) -> str:
    """paired_summary as printed: to 2 decimals, never "-0.00"."""
    return _rounded(summary).to_markdown(index=False, floatfmt=".2f")


def _rounded(frame: pd.DataFrame | pd.Series, digits: int = 2) -> Any:
    """Float columns rounded to `digits` as printed, a negative zero made 0 (adding 0.0 does: -0.0 + 0.0 == +0.0)."""
    if isinstance(frame, pd.Series):
        return frame.round(digits) + 0.0
    frame = frame.copy()
    for column in frame.select_dtypes("float").columns:
        frame[column] = frame[column].round(digits) + 0.0
    return frame


def _settings_changed(settings_a: str | None, settings_b: str | None) -> str | None:
    a, b = (json.loads(settings) if isinstance(settings, str) else {} for settings in (settings_a, settings_b))
    if not a or not b:
        return None
    return "; ".join(f"{name}: {a.get(name, 'unrecorded')} -> {b.get(name, 'unrecorded')}"
                     for name in sorted(a.keys() | b.keys()) if a.get(name) != b.get(name))


def paired_summary(pairs: pd.DataFrame) -> pd.DataFrame:
    """Per task and over all pairs: how many, how many changed status (ok, degenerate, failed), the
    mean test and validation deltas with a percentile bootstrap interval over the pairs, the largest
    |test delta|, and beside them the seed spread of side a (the standard deviation of its test scores
    across seeds of one configuration, averaged): what a delta that size means; the median speed ratio (the
    device's examples/s, groups read as groups), and each side's group sizes and precisions ("4", "1, 4")."""
    rows = []
    for task, group in [*pairs.groupby("task", sort=True), ("all", pairs)]:
        row: dict = {"task": task, "pairs": len(group), "status_changed": int((group["status_a"] != group["status_b"]).sum())}
        for split in ("test", "val"):
            deltas = group[f"{split}_delta"].dropna().to_numpy()
            low, high = bootstrap_ci([deltas], lambda means: means[..., 0])
            row |= {f"{split}_delta": deltas.mean() if len(deltas) else None, f"{split}_low": low, f"{split}_high": high}
        row["max_abs_test_delta"] = group["test_delta"].abs().max()
        row["seed_spread_a"] = group.groupby(["task", "method_label", "lr", "epochs"])["test_a"].std().mean()
        row["speed_ratio"] = group["speed_ratio"].median()
        for side in ("a", "b"):
            row[f"group_sizes_{side}"] = ", ".join(str(size) for size in sorted(set(group[f"group_size_{side}"])))
            row[f"precisions_{side}"] = ", ".join(sorted(set(group[f"precision_{side}"].dropna())))
        rows.append(row)
    return pd.DataFrame(rows)
