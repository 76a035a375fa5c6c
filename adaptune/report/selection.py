"""Model selection on validation, shared by every table and figure.

Selection always uses `val_score` (the task's primary metric on validation); test scores are only
reported, never used to choose. Runs that failed, were degenerate or have no validation score are
excluded from selection and listed by `problem_runs`.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

from adaptune.core.backbones import BERT_BASE, BERT_LARGE  # noqa: F401 (the tables' and figures' backbones, named here for them)
from adaptune.data.tasks import UnknownTaskError, get_task

SEED_FREE_KEYS = ("seed", "experiment")  # what may differ between seeds of one configuration

# The backbone each of the paper's tables and figures used: BERT_BASE or BERT_LARGE (adaptune.core.backbones).


def usable_runs(runs: pd.DataFrame) -> pd.DataFrame:
    """Runs that may be selected: status ok and a validation score."""
    return runs[(runs["status"] == "ok") & runs["val_score"].notna()].copy()


def scored_runs(runs: pd.DataFrame) -> pd.DataFrame:
    """Runs with a validation score, degenerate ones included: robustness plots (init std, learning
    rate) must show where training breaks down, which is what a degenerate run is."""
    return runs[runs["status"].isin(["ok", "degenerate"]) & runs["val_score"].notna()].copy()


def problem_runs(runs: pd.DataFrame) -> pd.DataFrame:
    """Failed, degenerate, and 'ok' runs without a validation score, with why each is excluded."""
    problems = runs[(runs["status"] != "ok") | runs["val_score"].isna()].copy()
    no_score = (problems["status"] == "ok") & problems["val_score"].isna()
    problems.loc[no_score, "reason"] = problems.loc[no_score, "reason"].fillna("no validation score recorded")
    problems["reason"] = problems["reason"].fillna("(no reason recorded)")
    columns = ["run_id", "task", "method_label", "lr", "epochs", "seed", "status", "reason"]
    return problems[columns].sort_values(["status", "task", "run_id"]).reset_index(drop=True)


def reported_score(runs: pd.DataFrame) -> tuple[pd.Series, pd.Series]:
    """The score a table reports for each run (test where labelled, else validation) and its split."""
    has_test = runs["test_score"].notna()
    return runs["test_score"].where(has_test, runs["val_score"]), pd.Series(np.where(has_test, "test", "validation"), index=runs.index)


def publisher_split(task: str, split: str) -> str:
    """A split as the data's publisher names it, for what a reader sees: GLUE's reported split is its dev set
    (dev.tsv; its test labels are not public) and SQuAD's validation is dev-v1.1, so both read "dev"; GLUE's
    validation is a slice held out of train.tsv, named as such. Other tasks' splits are cut here (80/10/10) and
    keep their names."""
    try:
        family = get_task(task).family
    except UnknownTaskError:
        return split
    if family == "glue":
        return {"test": "dev", "validation": "validation (held out of train)"}.get(split, split)
    if family == "squad" and split == "validation":
        return "dev"
    return split


def runs_for_backbone(runs: pd.DataFrame, preferred: str) -> tuple[pd.DataFrame, str | None]:
    """The runs of one backbone, so that a table or figure never mixes models: the paper's backbone
    for it (`preferred`, matched on the name or a path/hub id ending in it) when some run used it,
    else the most common backbone among `runs` (ties: the first name in sorted order).
    Returns (those runs, that backbone); (runs, None) when there are no runs."""
    if runs.empty:
        return runs.copy(), None
    names = runs["backbone"].astype(str)
    is_preferred = (names == preferred) | names.str.rstrip("/").str.split("/").str[-1].eq(preferred)
    if is_preferred.any():
        backbone = names[is_preferred].mode().sort_values().iloc[0]
    else:
        counts = names.value_counts()
        backbone = sorted(counts[counts == counts.max()].index)[0]
    return runs[names == backbone].copy(), backbone


def validation_order(runs: pd.DataFrame) -> pd.DataFrame:
    """Runs best first on validation (ties: the smallest run_id, for a stable answer): the order every
    best-run selection reads, Table 1's and the claims' bootstrap alike (the first run drawn wins)."""
    return runs.sort_values(["val_score", "run_id"], ascending=[False, True])


def best_by_validation(runs: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    """One run per group: the first in validation_order (the paper's Table 1: "re-run 5 times with
    different random seeds and select the best model on the validation set")."""
    if runs.empty:
        return runs.copy()
    return validation_order(runs).groupby(by, sort=True, dropna=False).head(1).reset_index(drop=True)


def with_config_key(runs: pd.DataFrame) -> pd.DataFrame:
    """Adds `config_key`: the whole run config minus the seed, so seeds of one configuration group together."""
    runs = runs.copy()
    runs["config_key"] = [_config_key(text) for text in runs["config_json"]]
    return runs


def seed_summary(runs: pd.DataFrame) -> pd.DataFrame:
    """Per configuration: mean and s.e.m. across seeds of the validation and reported scores."""
    runs = with_config_key(runs)
    runs["reported"], runs["reported_split"] = reported_score(runs)
    keys = ["task", "method", "method_label", "config_key"]
    summary = runs.groupby(keys, sort=True, dropna=False).agg(
        adapter_size=("adapter_size", "first"),
        top_k=("top_k", "first"),
        init_std=("init_std", "first"),
        lr=("lr", "first"),
        epochs=("epochs", "first"),
        trained_params=("trained_params", "mean"),
        total_params=("total_params", "first"),
        backbone=("backbone", "first"),
        primary_metric=("primary_metric", "first"),
        val_mean=("val_score", "mean"),
        val_sem=("val_score", "sem"),
        reported_mean=("reported", "mean"),
        reported_sem=("reported", "sem"),
        reported_split=("reported_split", "first"),
        n_seeds=("run_id", "count"),
        run_ids=("run_id", lambda ids: ",".join(sorted(ids))),
    )
    return summary.reset_index()


def best_configuration(runs: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    """Per group, the configuration with the best mean validation score across seeds (ties: the
    smallest config_key; the claims' bootstrap re-applies this same rule to resampled seeds)."""
    summary = seed_summary(runs)
    if summary.empty:
        return summary
    ordered = summary.sort_values(["val_mean", "config_key"], ascending=[False, True])
    return ordered.groupby(by, sort=True, dropna=False).head(1).reset_index(drop=True)


def base_params(runs: pd.DataFrame) -> dict[str, int]:
    """Pre-trained model size per backbone, for trained-% and total-size multiples.

    Runs record the model's total size as trained (adapters included), not the backbone's own size,
    so the smallest total among runs that add no parameters (full, top-k, LayerNorm) is the base;
    a backbone seen only with adapters falls back to its smallest total (slightly high).
    """
    known = runs[runs["total_params"].notna()]
    sizes = {}
    for backbone, group in known.groupby("backbone"):
        no_new_params = group[group["method"] != "adapters"]
        sizes[backbone] = int((no_new_params if not no_new_params.empty else group)["total_params"].min())
    return sizes


def val_metric(runs: pd.DataFrame, metric: str) -> pd.Series:
    """One validation metric of each run, read from its `val_metrics` JSON (NaN where it lacks it):
    for tables that report a metric other than the task's selection metric (Section 3.6: accuracy)."""
    def value(text: object) -> float:
        found = json.loads(text).get(metric) if isinstance(text, str) and text else None
        return float(found) if found is not None else np.nan

    return pd.Series([value(text) for text in runs["val_metrics"]], index=runs.index, dtype=float)


def to_percent(values: pd.Series | float) -> pd.Series | float:
    """Metric values are fractions (scikit-learn's scale); the paper prints percent."""
    return values * 100.0


def _config_key(config_json: str) -> str:
    config = json.loads(config_json)
    for key in SEED_FREE_KEYS:
        config.pop(key, None)
    return json.dumps(config, sort_keys=True)
