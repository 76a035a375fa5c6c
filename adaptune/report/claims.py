"""A verdict on each of the paper's claims, from a results set: holds / does not hold / not measured.

Every claim is one row of `claims_table` (written as claims.parquet, rendered into report.md): the
measured difference (the point estimate the verdict reads), a 95% bootstrap confidence interval
across seeds (percentile method, 2,000 resamples of each configuration's seeds; none where every
group has a single seed), the rule the verdict applies, and the one backbone it was measured on
(the paper's for that claim where measured, else the most common; see selection.runs_for_backbone).

Scores are in points (percent x 100 of a fraction); the ablation claims read validation accuracy
where recorded (the paper's Figure 6). Degenerate runs (one predicted class) are real outcomes and
stay in; failed runs have no score. The verdict reads the point estimate; `ci_low`/`ci_high` say
how firm it is, and `detail` says when the interval straddles the threshold.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd

from adaptune.report.baselines import run_baseline
from adaptune.report.figures import ablation_metric
from adaptune.report.reference import extra_tasks, glue_tasks
from adaptune.report.selection import (
    BERT_BASE,
    BERT_LARGE,
    base_params,
    best_configuration,
    reported_score,
    runs_for_backbone,
    scored_runs,
)

HOLDS, FAILS, NOT_MEASURED = "holds", "does not hold", "not measured"
FEW_PERCENT = 5.0  # "a few percent of the parameters": the paper's adapters train 3.6% (GLUE), 1.14% (Table 2)
NEAR_MAJORITY_POINTS = 5.0  # all adapters removed: within this many points of the majority class
LEARNED_POINTS = 5.0  # ...provided the trained model is this far above it (else nothing was there to lose)
SINGLE_LAYER_DROP_PERCENT = 2.0  # the paper: removing one layer's adapters costs at most ~2% (relative)
INIT_STD_LIMIT = 1e-2
INIT_STD_TOLERANCE = 1.0  # points between the best and the worst init std <= 1e-2
N_RESAMPLES = 2000
CI_LEVEL = 0.95
COLUMNS = (
    "claim_id", "claim", "section", "verdict", "measured", "unit", "ci_low", "ci_high", "threshold", "rule",
    "n_tasks", "n_runs", "backbone", "detail",
)


def claims_table(frames: dict[str, pd.DataFrame], reference: dict[str, Any], data_dir: Any = None) -> pd.DataFrame:
    """One row per claim (COLUMNS); `frames` as results.read_results gives them."""
    runs = frames["runs"]
    ablation = frames.get("ablation", pd.DataFrame())
    rows = [
        _within_full(runs, glue_tasks(reference), 1.0, BERT_LARGE, "adapters_glue_within_1pt",
                     "Adapters come within 1 point of full fine-tuning on GLUE, at a few percent of the parameters", "3.2, Table 1"),
        _within_full(runs, extra_tasks(reference), 0.4, BERT_BASE, "adapters_extra_within_0.4pt",
                     "Adapters come within 0.4 points of full fine-tuning on the additional tasks, at a few percent of the parameters",
                     "3.3, Table 2"),
        _layernorm_worse(runs),
        *_ablation_claims(ablation, runs, data_dir),
        _init_std_robust(runs),
        _lr_robust(runs),
    ]
    return pd.DataFrame.from_records(rows, columns=list(COLUMNS))


def claims_markdown(table: pd.DataFrame) -> str:
    lines = [
        "| claim | verdict | measured | 95% CI | threshold | backbone | tasks / runs | detail |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in table.itertuples():
        ci = "—" if _missing(row.ci_low) else f"[{row.ci_low:+.2f}, {row.ci_high:+.2f}]"
        measured = "—" if _missing(row.measured) else f"{row.measured:+.2f} {row.unit}"
        counts = "—" if row.verdict == NOT_MEASURED else f"{row.n_tasks} / {row.n_runs}"
        cells = [f"{row.claim} (§{row.section})", f"**{row.verdict}**", measured, ci, str(row.threshold), "—" if _missing(row.backbone) else str(row.backbone), counts,
                 " ".join(str(row.detail).split()).replace("|", "\\|")]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


# ---- method vs full fine-tuning (Tables 1 and 2) --------------------------------------------------


def _within_full(runs: pd.DataFrame, tasks: list[str], threshold: float, preferred: str, claim_id: str, claim: str, section: str) -> dict:
    row = _row(claim_id, claim, section, "points", f">= -{threshold:g}", (
        f"mean over tasks of (adapters - full fine-tuning), each the configuration best on mean validation score, "
        f"scored as the tables report (test where labelled, else validation); holds when >= -{threshold:g} and the "
        f"adapters train <= {FEW_PERCENT:g}% of the backbone's parameters"))
    candidates = scored_runs(runs)
    candidates = candidates[candidates["task"].isin(tasks) & candidates["method"].isin(["full", "adapters"])]
    candidates, backbone = runs_for_backbone(candidates, preferred)
    paired = _paired_groups(candidates, "adapters", "full", by_reported=True)
    if not paired:
        return {**row, "detail": "needs, on some task, both a full fine-tuning and an adapters run with a score"}
    estimate, low, high = _difference_with_ci(paired)
    base = base_params(runs).get(backbone)
    trained = float(np.mean([group["a_trained"] for group in paired]))
    percent = 100.0 * trained / base if base else None
    holds = estimate >= -threshold and (percent is not None and percent <= FEW_PERCENT)
    detail = (f"tasks: {', '.join(group['task'] for group in paired)}; adapters train {percent:.2f}% of the backbone"
              if percent is not None else "adapters' trained share unknown")
    return {**row, "verdict": HOLDS if holds else FAILS, "measured": estimate, "ci_low": low, "ci_high": high,
            "n_tasks": len(paired), "n_runs": sum(len(g["a"]) + len(g["b"]) for g in paired), "backbone": backbone,
            "detail": detail + _straddle(low, high, -threshold)}


def _layernorm_worse(runs: pd.DataFrame) -> dict:
    row = _row("layernorm_clearly_worse", "Tuning only the LayerNorm parameters is clearly worse than full fine-tuning", "3.4",
               "points", "< -1", "mean over tasks of (LayerNorm-only - full fine-tuning), best configuration per method on mean "
               "validation score, scored on validation (the paper's Figure 4); holds when below -1 point and the interval is below 0")
    candidates = scored_runs(runs)
    candidates = candidates[candidates["method"].isin(["full", "layernorm"]) & ~candidates["task"].str.startswith("squad")]
    candidates, backbone = runs_for_backbone(candidates, BERT_BASE)
    paired = _paired_groups(candidates, "layernorm", "full", by_reported=False)
    if not paired:
        return {**row, "detail": "needs, on some task, both a full fine-tuning and a LayerNorm-only run with a score"}
    estimate, low, high = _difference_with_ci(paired)
    holds = estimate < -1.0 and (high is None or high < 0)
    degenerate = sum(g["a_degenerate"] for g in paired)
    detail = f"tasks: {', '.join(g['task'] for g in paired)}" + (f"; {degenerate} LayerNorm-only run(s) degenerate (kept)" if degenerate else "")
    return {**row, "verdict": HOLDS if holds else FAILS, "measured": estimate, "ci_low": low, "ci_high": high, "n_tasks": len(paired),
            "n_runs": sum(len(g["a"]) + len(g["b"]) for g in paired), "backbone": backbone, "detail": detail}


def _paired_groups(candidates: pd.DataFrame, a: str, b: str, by_reported: bool) -> list[dict]:
    """Per task with both methods: the seed scores (points) of each method's best configuration."""
    if candidates.empty:
        return []
    candidates = candidates.copy()
    candidates["score"] = (reported_score(candidates)[0] if by_reported else candidates["val_score"]) * 100.0
    chosen = best_configuration(candidates, ["task", "method"])
    groups = []
    for task, per_task in chosen.groupby("task"):
        methods = per_task.set_index("method")
        if a not in methods.index or b not in methods.index:
            continue
        seeds = {m: candidates[candidates["run_id"].isin(methods.loc[m, "run_ids"].split(","))] for m in (a, b)}
        groups.append({
            "task": task,
            "a": seeds[a]["score"].to_numpy(float), "b": seeds[b]["score"].to_numpy(float),
            "a_trained": float(seeds[a]["trained_params"].mean()),
            "a_degenerate": int((seeds[a]["status"] == "degenerate").sum()),
        })
    return groups


def _difference_with_ci(paired: list[dict]) -> tuple[float, float | None, float | None]:
    """Mean over tasks of mean(a seeds) - mean(b seeds), and its bootstrap interval (seeds resampled per group)."""
    samples = [g["a"] for g in paired] + [g["b"] for g in paired]
    n = len(paired)

    def statistic(means: np.ndarray) -> np.ndarray:
        return (means[..., :n] - means[..., n:]).mean(axis=-1)

    estimate = float(statistic(np.array([s.mean() for s in samples])))
    low, high = bootstrap_ci(samples, statistic)
    return estimate, low, high


# ---- Figure 6: the ablation -----------------------------------------------------------------------


def _ablation_claims(ablation: pd.DataFrame, runs: pd.DataFrame, data_dir: Any) -> list[dict]:
    near = _row("remove_all_adapters_near_majority", "Removing every layer's adapters drops the trained model to near the majority class",
                "3.6, Figure 6", "points", f"<= +{NEAR_MAJORITY_POINTS:g}",
                f"mean over ablated runs of (validation score with all adapters off - majority-class baseline); holds when "
                f"<= {NEAR_MAJORITY_POINTS:g} points (runs whose trained model is within {LEARNED_POINTS:g} points of the "
                "majority class are left out: they had nothing to lose)")
    single = _row("remove_one_layer_costs_little", "Removing one layer's adapters costs little", "3.6, Figure 6", "% (relative)",
                  f"<= {SINGLE_LAYER_DROP_PERCENT:g}",
                  "mean over ablated runs of the largest relative drop from switching off a single layer's adapters; holds when "
                  f"<= {SINGLE_LAYER_DROP_PERCENT:g}% (the paper's largest single-layer drop); runs that learned nothing "
                  f"(within {LEARNED_POINTS:g} points of the majority class) are left out")
    lower = _row("lower_layers_matter_less", "Adapters in lower layers matter less than in higher layers", "3.6, Figure 6",
                 "% (relative)", "> 0",
                 "mean over ablated runs of (relative drop with the upper half's adapters off - drop with the lower half's off); "
                 f"holds when > 0; runs that learned nothing (within {LEARNED_POINTS:g} points of the majority class) are left out")
    if ablation.empty:
        why = "no ablation rows in this results set"
        return [{**near, "detail": why}, {**single, "detail": why}, {**lower, "detail": why}]
    known = runs.drop_duplicates("run_id").set_index("run_id")
    ablation = ablation.assign(backbone=ablation["run_id"].map(known["backbone"]).fillna("(run not in results)"))
    ablation, backbone = runs_for_backbone(ablation, BERT_BASE)
    gaps, skipped, largest, halves, metrics = [], [], [], [], set()
    for run_id, rows in ablation.groupby("run_id"):
        metric = ablation_metric(rows)
        metrics.add(metric)
        rows = rows[rows["metric"] == metric].set_index(["first_layer", "last_layer"])
        layers = int(max(rows.index.get_level_values(0).max(), rows.index.get_level_values(1).max())) + 1
        if (0, layers - 1) in rows.index and run_id in known.index:
            majority = run_baseline(rows["task"].iloc[0], known.loc[run_id], metric, "validation", data_dir)
            all_off, trained = rows.loc[(0, layers - 1), "value"], rows.loc[(0, layers - 1), "baseline_value"]
            if majority is None or pd.isna(all_off) or pd.isna(trained):
                skipped.append(f"{run_id}: no majority baseline (data not in the local mirror)")
            elif 100.0 * trained - majority < LEARNED_POINTS:
                # A model that learned nothing has nothing for its adapters to carry: no claim about them reads it.
                skipped.append(f"{run_id}: trained model {100 * trained:.1f} is within {LEARNED_POINTS:g} points of the majority {majority:.1f}")
                continue
            else:
                gaps.append((100.0 * all_off - majority, f"{rows['task'].iloc[0]}: all off "
                             f"{100 * all_off:.1f}, trained {100 * trained:.1f}, majority {majority:.1f}"))
        drop = lambda first, last: -100.0 * rows.loc[(first, last), "relative_change"]  # noqa: E731  (relative %, positive = worse)
        single_drops = [drop(i, i) for i in range(layers) if (i, i) in rows.index and pd.notna(rows.loc[(i, i), "relative_change"])]
        if single_drops:
            largest.append(max(single_drops))
        half = layers // 2
        if half and (0, half - 1) in rows.index and (half, layers - 1) in rows.index:
            halves.append(drop(half, layers - 1) - drop(0, half - 1))
    n_runs = ablation["run_id"].nunique()
    n_tasks = ablation["task"].nunique()
    common = {"backbone": backbone, "n_runs": n_runs, "n_tasks": n_tasks}
    metric_note = f"metric: {', '.join(sorted(metrics))}"
    results = []
    if gaps:
        values = np.array([g for g, _ in gaps])
        low, high = bootstrap_ci([values], lambda m: m[..., 0])
        estimate = float(values.mean())
        results.append({**near, **common, "n_runs": len(values), "verdict": HOLDS if estimate <= NEAR_MAJORITY_POINTS else FAILS,
                        "measured": estimate, "ci_low": low, "ci_high": high,
                        "detail": "; ".join([metric_note, *(text for _, text in gaps), *skipped]) + _straddle(low, high, NEAR_MAJORITY_POINTS)})
    else:
        results.append({**near, **common, "detail": "; ".join(skipped) or "no span with every layer's adapters off"})
    for row, values, passes in ((single, largest, lambda v: v <= SINGLE_LAYER_DROP_PERCENT), (lower, halves, lambda v: v > 0)):
        if not values:
            results.append({**row, **common, "detail": "; ".join(skipped) or "no single-layer or half-depth spans in the ablation"})
            continue
        values = np.array(values, dtype=float)
        low, high = bootstrap_ci([values], lambda m: m[..., 0])
        estimate = float(values.mean())
        results.append({**row, **common, "n_runs": len(values), "verdict": HOLDS if passes(estimate) else FAILS, "measured": estimate,
                        "ci_low": low, "ci_high": high, "detail": f"{metric_note}; per run: " + ", ".join(f"{v:+.2f}" for v in values)})
    return results


# ---- Figures 6 (right) and 7: robustness -----------------------------------------------------------


def _init_std_robust(runs: pd.DataFrame) -> dict:
    row = _row("init_std_robust_to_1e-2", "Adapters are robust to the init std up to 1e-2", "3.6, Figure 6", "points",
               f">= -{INIT_STD_TOLERANCE:g}",
               f"mean over tasks of (worst - best) mean validation score among init stds <= {INIT_STD_LIMIT:g} (best lr/epochs per "
               f"std); holds when >= -{INIT_STD_TOLERANCE:g} point")
    candidates = scored_runs(runs)
    candidates = candidates[(candidates["method"] == "adapters") & candidates["init_std"].notna()]
    candidates, backbone = runs_for_backbone(candidates, BERT_BASE)
    small = candidates[candidates["init_std"] <= INIT_STD_LIMIT * (1 + 1e-9)]
    groups = _levels(small, "init_std")
    if not groups:
        stds = sorted(candidates["init_std"].unique()) if not candidates.empty else []
        return {**row, "detail": f"needs a task with adapter runs at two or more init stds <= {INIT_STD_LIMIT:g} (measured stds: "
                f"{', '.join(f'{s:g}' for s in stds) or 'none'})"}
    return _spread_row(row, groups, backbone, lambda v: v >= -INIT_STD_TOLERANCE, "init std")


def _lr_robust(runs: pd.DataFrame) -> dict:
    row = _row("adapters_robust_to_lr", "Adapters are at least as robust to the learning rate as full fine-tuning", "Appendix B, Figure 7",
               "points", ">= 0",
               "mean over tasks of (adapters' worst - best) - (full fine-tuning's worst - best) mean validation score across the "
               "learning rates both methods were run at (best other hyperparameters per lr); holds when >= 0")
    candidates = scored_runs(runs)
    candidates = candidates[candidates["method"].isin(["adapters", "full"])]
    candidates, backbone = runs_for_backbone(candidates, BERT_BASE)
    adapters = _levels(candidates[candidates["method"] == "adapters"], "lr")
    full = _levels(candidates[candidates["method"] == "full"], "lr")
    tasks = []
    for task in sorted(set(adapters) & set(full)):
        common = sorted(set(adapters[task]) & set(full[task]))
        if len(common) >= 2:
            tasks.append((task, [adapters[task][lr] for lr in common], [full[task][lr] for lr in common], common))
    if not tasks:
        return {**row, "detail": "needs a task with adapters and full fine-tuning runs at the same two or more learning rates"}
    samples = [s for _, a, f, _ in tasks for s in (*a, *f)]
    sizes = [(len(a), len(f)) for _, a, f, _ in tasks]

    def statistic(means: np.ndarray) -> np.ndarray:
        out, start = [], 0
        for n_a, n_f in sizes:
            a, f = means[..., start : start + n_a], means[..., start + n_a : start + n_a + n_f]
            out.append((a.min(axis=-1) - a.max(axis=-1)) - (f.min(axis=-1) - f.max(axis=-1)))
            start += n_a + n_f
        return np.mean(out, axis=0)

    estimate = float(statistic(np.array([s.mean() for s in samples])))
    low, high = bootstrap_ci(samples, statistic)
    detail = "; ".join(f"{task}: lrs {', '.join(f'{lr:g}' for lr in lrs)}" for task, _, _, lrs in tasks)
    return {**row, "verdict": HOLDS if estimate >= 0 else FAILS, "measured": estimate, "ci_low": low, "ci_high": high,
            "n_tasks": len(tasks), "n_runs": sum(len(s) for s in samples), "backbone": backbone, "detail": detail + _straddle(low, high, 0.0)}


def _levels(runs: pd.DataFrame, column: str) -> dict[str, dict[float, np.ndarray]]:
    """Per task with >= 2 values of `column`: {value: seed scores (points) of the best configuration at it}."""
    if runs.empty:
        return {}
    runs = runs.copy()
    runs["score"] = runs["val_score"] * 100.0
    chosen = best_configuration(runs, ["task", column])
    out = {}
    for task, rows in chosen.groupby("task"):
        if rows[column].nunique() < 2:
            continue
        out[task] = {float(r[column]): runs[runs["run_id"].isin(r["run_ids"].split(","))]["score"].to_numpy(float) for _, r in rows.iterrows()}
    return out


def _spread_row(row: dict, groups: dict[str, dict[float, np.ndarray]], backbone: str | None, passes: Callable[[float], bool], what: str) -> dict:
    samples, sizes = [], []
    for levels in groups.values():
        samples += list(levels.values())
        sizes.append(len(levels))

    def statistic(means: np.ndarray) -> np.ndarray:
        out, start = [], 0
        for size in sizes:
            block = means[..., start : start + size]
            out.append(block.min(axis=-1) - block.max(axis=-1))
            start += size
        return np.mean(out, axis=0)

    estimate = float(statistic(np.array([s.mean() for s in samples])))
    low, high = bootstrap_ci(samples, statistic)
    detail = "; ".join(f"{task}: {what} {', '.join(f'{v:g}' for v in sorted(levels))}" for task, levels in groups.items())
    return {**row, "verdict": HOLDS if passes(estimate) else FAILS, "measured": estimate, "ci_low": low, "ci_high": high,
            "n_tasks": len(groups), "n_runs": sum(len(s) for s in samples), "backbone": backbone, "detail": detail}


# ---- helpers ----------------------------------------------------------------------------------------


def bootstrap_ci(samples: list[np.ndarray], statistic: Callable[[np.ndarray], np.ndarray], seed: int = 0) -> tuple[float | None, float | None]:
    """Percentile bootstrap interval (CI_LEVEL) of statistic(group means), each group's values
    (seeds) resampled with replacement independently; (None, None) when no group has two values.

    `statistic` takes an array (..., n_groups) of group means and reduces the last axis."""
    if not samples or all(len(s) < 2 for s in samples):
        return None, None
    rng = np.random.default_rng(seed)
    means = np.stack([s[rng.integers(0, len(s), size=(N_RESAMPLES, len(s)))].mean(axis=1) for s in samples], axis=-1)
    values = statistic(means)
    tail = 100.0 * (1 - CI_LEVEL) / 2
    return float(np.percentile(values, tail)), float(np.percentile(values, 100 - tail))


def _row(claim_id: str, claim: str, section: str, unit: str, threshold: str, rule: str) -> dict:
    return {"claim_id": claim_id, "claim": claim, "section": section, "verdict": NOT_MEASURED, "measured": None, "unit": unit,
            "ci_low": None, "ci_high": None, "threshold": threshold, "rule": rule, "n_tasks": 0, "n_runs": 0, "backbone": None, "detail": ""}


def _straddle(low: float | None, high: float | None, threshold: float) -> str:
    if low is None or high is None or not low < threshold < high:
        return ""
    return f"; the interval straddles {threshold:+g}: more seeds would settle it"


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and np.isnan(value)) or value is pd.NA
