"""The paper's Figures 3-7 from a results set (PNG and PDF, matplotlib's Agg backend).

Every figure function returns a `FigureOutput`; when a sweep holds no data for a figure (say, no
SQuAD runs), it returns `skipped` with the reason instead of drawing an empty plot.
Scores are plotted in percent; points are the configuration best on validation (mean across seeds,
error bars one s.e.m.). Each figure (each panel of Figure 3) shows one backbone: the paper's where
measured (BERT-base for Figures 3, 4, 6 and 7; BERT-large for Figure 5, see SQUAD_BACKBONE_NOTE), else
the most common one (`runs_for_backbone`); the title and `FigureOutput.backbone` name it.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import textwrap
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # headless: components and CI have no display

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.ticker import NullFormatter  # noqa: E402

from adaptune.report.reference import task_suite  # noqa: E402
from adaptune.report.selection import (  # noqa: E402
    BERT_BASE,
    BERT_LARGE,
    best_by_validation,
    best_configuration,
    reported_score,
    runs_for_backbone,
    scored_runs,
    to_percent,
    usable_runs,
)

METHOD_STYLE = {
    "adapters": ("Adapters", "tab:orange"),
    "top_k": ("Fine-tune top k", "tab:blue"),
    "layernorm": ("LayerNorm only", "tab:green"),
    "full": ("Full fine-tuning", "tab:red"),
    # Beside the paper's methods (issue #21): extra curves on Figures 3 and 4 where a sweep ran them.
    "pfeiffer": ("Adapters, Pfeiffer placement", "tab:purple"),
    "lora": ("LoRA", "tab:brown"),
    "ia3": ("(IA)3", "tab:pink"),
}
BEYOND_PAPER_METHODS = ("pfeiffer", "lora", "ia3")
TRADEOFF_METHODS = ("adapters", "top_k", *BEYOND_PAPER_METHODS)  # Figure 3's curves, each relative to full fine-tuning
# §3.5 names no backbone for SQuAD: the choice (experiments.SQUAD_BACKBONE, paper_reference.json) and its alternative.
SQUAD_BACKBONE_NOTE = (
    "BERT-large, inferred: §3.5 names no model, and its fine-tuning F1 of 90.7 matches Devlin et al.'s BERT-large "
    "(90.9), not BERT-base (88.5). The alternative, BERT-base (the backbone of the paper's other figures), would "
    "put the paper's fine-tuning 2.2 F1 above what Devlin et al. report for it"
)
PREFERRED_TASKS = ("mnli_m", "cola")  # the paper's Figure 4 and 6 tasks come first
MAX_PANELS = 12
# Figure name -> a note stamped at its foot ("partial: N of M runs"); set by `notes` while a report draws.
_NOTES: contextvars.ContextVar[Mapping[str, str]] = contextvars.ContextVar("figure_notes", default={})


@contextlib.contextmanager
def notes(by_figure: Mapping[str, str]) -> Iterator[None]:
    """Stamp each named figure drawn inside with its note, so a figure copied alone still says it."""
    token = _NOTES.set(dict(by_figure))
    try:
        yield
    finally:
        _NOTES.reset(token)


@dataclasses.dataclass(frozen=True)
class FigureOutput:
    name: str
    title: str
    paths: tuple[Path, ...] = ()
    skipped: str | None = None  # why the figure was not drawn
    backbone: str | None = None  # the backbone whose runs it shows (panels' names joined, Figure 3)


def all_figures(frames: dict[str, pd.DataFrame], reference: dict[str, Any], out_dir: Path) -> list[FigureOutput]:
    runs = frames["runs"]
    return [
        figure3_tradeoff(runs, reference, out_dir),
        figure4_per_task(runs, out_dir),
        figure5_squad(runs, reference, out_dir),
        figure6_ablation(frames["ablation"], out_dir, runs),
        figure6_init_std(runs, out_dir),
        figure7_learning_rate(runs, out_dir),
    ]


def figure3_tradeoff(runs: pd.DataFrame, reference: dict[str, Any], out_dir: Path) -> FigureOutput:
    """Score minus full fine-tuning's, per task, vs trained params: 20/50/80th percentiles across tasks."""
    name, title = "figure3_tradeoff", "Figure 3: score vs trained parameters, relative to full fine-tuning"
    usable = usable_runs(runs)
    usable = usable.assign(suite=[task_suite(task, reference) for task in usable["task"]])
    panels = []
    for suite, label in (("glue", "GLUE (dev)"), ("extra", "Additional tasks (test)")):
        in_suite = usable[(usable["suite"] == suite) & usable["method"].isin(["full", *TRADEOFF_METHODS])]
        suite_runs, backbone = runs_for_backbone(in_suite, BERT_BASE)
        points = _relative_points(suite_runs)
        if not points.empty:
            assert backbone is not None  # runs_for_backbone names the backbone of any runs
            panels.append((f"{label}, {backbone}", points, backbone))
    if not panels:
        return FigureOutput(name, title, skipped="needs, for some task, a full fine-tuning run and a run of "
                            "adapters, top-k or a method beside the paper's (pfeiffer, lora, ia3)")
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4), squeeze=False)
    for ax, (label, points, _) in zip(axes[0], panels):
        for method, group in points.groupby("method"):
            method_name, color = METHOD_STYLE[method]
            bands = group.groupby("point").agg(
                x=("trained_params", "median"),
                p20=("delta", lambda v: np.percentile(v, 20)),
                p50=("delta", lambda v: np.percentile(v, 50)),
                p80=("delta", lambda v: np.percentile(v, 80)),
                n_tasks=("task", "nunique"),
            )
            bands = bands.sort_values("x")
            ax.plot(bands["x"], bands["p50"], marker="o", color=color, label=f"{method_name} ({bands['n_tasks'].max()} task(s))")
            ax.fill_between(bands["x"], bands["p20"], bands["p80"], color=color, alpha=0.25)
        ax.axhline(0.0, color="grey", linestyle="--", linewidth=1)
        ax.set(xscale="log", xlabel="trained parameters per task", ylabel="score − full fine-tuning (points)", title=label)
        ax.xaxis.set_minor_formatter(NullFormatter())  # a span under a decade labels every minor tick, overlapping
        ax.legend(fontsize=8)
    return _save(fig, out_dir, name, title, ", ".join(dict.fromkeys(backbone for _, _, backbone in panels)))


def figure4_per_task(runs: pd.DataFrame, out_dir: Path) -> FigureOutput:
    """Per task: validation score vs trained params for adapters, top-k and LayerNorm-only (± s.e.m.), and
    the methods beside the paper's where a sweep ran them; full fine-tuning is the dashed line."""
    name, title = "figure4_per_task", "Figure 4: validation score vs trained parameters per task"
    usable = usable_runs(runs)
    usable = usable[~usable["task"].str.startswith("squad")]
    curves = usable[usable["method"].isin(["adapters", "top_k", "layernorm", *BEYOND_PAPER_METHODS])]
    curves, backbone = runs_for_backbone(curves, BERT_BASE)
    tasks = _ordered_tasks(curves["task"].unique())
    if not tasks:
        return FigureOutput(name, title, skipped="no usable adapters, top-k, LayerNorm-only, pfeiffer, lora or ia3 runs on a "
                            "classification task")
    usable = usable[usable["backbone"] == backbone]
    fig, axes = _panel_grid(len(tasks))
    for ax, task in zip(axes, tasks):
        _method_points(ax, usable[usable["task"] == task])
        ax.set_title(task)
    return _save(fig, out_dir, name, title, backbone)


def figure5_squad(runs: pd.DataFrame, reference: dict[str, Any], out_dir: Path) -> FigureOutput:
    """SQuAD v1.1 validation F1 vs trained params, with the paper's values from its text."""
    name, title = "figure5_squad", "Figure 5: SQuAD F1 vs trained parameters"
    usable = usable_runs(runs)
    paper_backbone = reference["figures"]["figure5_squad_f1"].get("backbone", BERT_LARGE)
    squad, backbone = runs_for_backbone(usable[usable["task"].str.startswith("squad")], paper_backbone)
    if squad.empty:
        return FigureOutput(name, title, skipped="no usable SQuAD runs in this results set")
    other_splits = sorted(set(squad.get("data_split", pd.Series(dtype=str)).dropna()) - {"standard"})
    if other_splits:  # e.g. the local stand-in (dev articles split 80/20): never to be read as the paper's numbers
        title += f" -- on {', '.join(other_splits)}, NOT the paper's split (runs.parquet split_note)"
    fig, axes = _panel_grid(1)
    _method_points(axes[0], squad)
    paper = reference["figures"]["figure5_squad_f1"]["points"]
    axes[0].axhline(paper["full"], color="tab:red", linestyle=":", label=f"paper full FT {paper['full']}")
    axes[0].axhline(paper["adapters64"], color="tab:orange", linestyle=":", label=f"paper adapters 64 {paper['adapters64']}")
    axes[0].legend(fontsize=8)
    axes[0].set_ylabel("F1")
    return _save(fig, out_dir, name, title, backbone)


def figure6_ablation(ablation: pd.DataFrame, out_dir: Path, runs: pd.DataFrame | None = None) -> FigureOutput:
    """Heatmaps: change (% of the baseline validation accuracy, as the paper's; another metric only where
    accuracy was not recorded) when the adapters of layers first..last are switched off.
    With `runs`, the ablated runs' backbones are looked up and one backbone is shown (BERT-base first)."""
    name, title = "figure6_ablation", "Figure 6: removing adapters from layer spans"
    if ablation.empty:
        return FigureOutput(name, title, skipped="no ablation rows (ablation.parquet is empty or absent)")
    backbone = None
    if runs is not None:
        backbones = runs.drop_duplicates("run_id").set_index("run_id")["backbone"]
        ablation = ablation.assign(backbone=ablation["run_id"].map(backbones).fillna("(run not in results)"))
        ablation, backbone = runs_for_backbone(ablation, BERT_BASE)
    # One trained model per task, as in the paper: the run with the most ablated spans.
    chosen = ablation.groupby(["task", "run_id"]).size().reset_index(name="n").sort_values(["task", "n"], ascending=[True, False])
    chosen = chosen.groupby("task").head(1)
    tasks = _ordered_tasks(chosen["task"].unique())
    fig, axes = _panel_grid(len(tasks), size=(4.5, 4))
    for ax, task in zip(axes, tasks):
        run_id = chosen.loc[chosen["task"] == task, "run_id"].iloc[0]
        rows = ablation[ablation["run_id"] == run_id]
        metric = ablation_metric(rows)
        rows = rows[rows["metric"] == metric]
        n_layers = int(max(rows["first_layer"].max(), rows["last_layer"].max())) + 1
        grid = np.full((n_layers, n_layers), np.nan)
        for row in rows.itertuples():
            grid[int(row.first_layer), int(row.last_layer)] = 100.0 * row.relative_change
        image = ax.imshow(grid, cmap="viridis", origin="upper")
        fig.colorbar(image, ax=ax, label="change (%)")
        ax.set(xlabel="last layer", ylabel="first layer", title=f"{task} ({metric})")
    return _save(fig, out_dir, name, title, backbone)


def ablation_metric(rows: pd.DataFrame) -> str:
    """The metric Figure 6's heatmaps show: validation accuracy, the paper's (its caption: "relative
    decrease in validation accuracy"), where the ablation holds it; else the first one recorded."""
    metrics = list(dict.fromkeys(rows["metric"]))
    return "accuracy" if "accuracy" in metrics else metrics[0]


def figure6_init_std(runs: pd.DataFrame, out_dir: Path) -> FigureOutput:
    """Validation score vs the adapters' initialisation std (best lr/epochs per std, ± s.e.m.)."""
    name, title = "figure6_init_std", "Figure 6 (right): validation score vs adapter init std (degenerate runs included)"
    usable = scored_runs(runs)
    adapters = usable[(usable["method"] == "adapters") & usable["init_std"].notna()]
    adapters, backbone = runs_for_backbone(adapters, BERT_BASE)
    varied = adapters.groupby("task")["init_std"].nunique()
    tasks = _ordered_tasks(varied[varied >= 2].index)
    if not tasks:
        return FigureOutput(name, title, skipped="no task has adapter runs at two or more init stds")
    chosen = best_configuration(adapters[adapters["task"].isin(tasks)], ["task", "init_std"])
    fig, axes = _panel_grid(1)
    for task in tasks:
        rows = chosen[chosen["task"] == task].sort_values("init_std")
        axes[0].errorbar(rows["init_std"], to_percent(rows["val_mean"]), yerr=_sem(rows), marker="o", capsize=3, label=task)
    axes[0].set(xscale="log", xlabel="adapter init std", ylabel="validation score (%)")
    axes[0].legend(fontsize=8)
    return _save(fig, out_dir, name, title, backbone)


def figure7_learning_rate(runs: pd.DataFrame, out_dir: Path) -> FigureOutput:
    """Per task and method, the best configuration at each learning rate (± s.e.m.)."""
    name, title = "figure7_lr_robustness", "Figure 7: best validation score at each learning rate (degenerate runs included)"
    usable, backbone = runs_for_backbone(scored_runs(runs), BERT_BASE)
    varied = usable.groupby(["task", "method"])["lr"].nunique()
    tasks = _ordered_tasks(varied[varied >= 2].index.get_level_values("task").unique())
    if not tasks:
        return FigureOutput(name, title, skipped="no task has runs of one method at two or more learning rates")
    fig, axes = _panel_grid(len(tasks))
    for ax, task in zip(axes, tasks):
        chosen = best_configuration(usable[usable["task"] == task], ["method", "lr"])
        for method, rows in chosen.groupby("method"):
            if rows["lr"].nunique() < 2:
                continue
            rows = rows.sort_values("lr")
            method_name, color = METHOD_STYLE.get(method, (method, None))
            ax.errorbar(rows["lr"], to_percent(rows["val_mean"]), yerr=_sem(rows), marker="o", capsize=3, color=color, label=method_name)
        ax.set(xscale="log", xlabel="learning rate", ylabel="validation score (%)", title=task)
        ax.legend(fontsize=8)
    return _save(fig, out_dir, name, title, backbone)


def _relative_points(runs: pd.DataFrame) -> pd.DataFrame:
    """Per task and (method, size/k) point: best-on-validation run's score minus full fine-tuning's."""
    if runs.empty:
        return pd.DataFrame()
    runs = runs.copy()
    runs["reported"], _ = reported_score(runs)
    full = best_by_validation(runs[runs["method"] == "full"], ["task"]).set_index("task")["reported"]
    swept = runs[runs["method"].isin(TRADEOFF_METHODS) & runs["task"].isin(full.index)].copy()
    if swept.empty:
        return pd.DataFrame()
    swept["point"] = swept["method_label"]
    best = best_by_validation(swept, ["task", "point"])
    best["delta"] = to_percent(best["reported"] - best["task"].map(full))
    return best[["task", "method", "point", "trained_params", "delta"]].dropna()


def _method_points(ax: Any, runs: pd.DataFrame) -> None:
    """One errorbar series per method: best configuration per method_label, x = trained params."""
    chosen = best_configuration(runs, ["method", "method_label"])
    for method, rows in chosen.groupby("method"):
        rows = rows.sort_values("trained_params")
        method_name, color = METHOD_STYLE.get(method, (method, None))
        if method == "full":
            ax.axhline(float(to_percent(rows["val_mean"].iloc[0])), color=color, linestyle="--", label=method_name)
            continue
        ax.errorbar(
            rows["trained_params"], to_percent(rows["val_mean"]), yerr=_sem(rows), marker="o", capsize=3, color=color, label=method_name
        )
    ax.set(xscale="log", xlabel="trained parameters", ylabel="validation score (%)")
    ax.legend(fontsize=8)


def _sem(rows: pd.DataFrame) -> np.ndarray:
    # One seed has no spread: draw no bar rather than none-at-all NaNs.
    percent = to_percent(rows["val_sem"].fillna(0.0))
    assert isinstance(percent, pd.Series)  # to_percent keeps a Series a Series
    return percent.to_numpy()


def _ordered_tasks(tasks: Any) -> list[str]:
    tasks = sorted(set(tasks))
    ordered = [task for task in PREFERRED_TASKS if task in tasks] + [task for task in tasks if task not in PREFERRED_TASKS]
    return ordered[:MAX_PANELS]


def _panel_grid(n_panels: int, size: tuple[float, float] = (5.0, 3.8)) -> tuple[Any, list[Any]]:
    columns = min(n_panels, 3)
    rows = int(np.ceil(n_panels / columns))
    fig, axes = plt.subplots(rows, columns, figsize=(size[0] * columns, size[1] * rows), squeeze=False)
    flat = list(axes.flat)
    for ax in flat[n_panels:]:
        ax.set_visible(False)
    return fig, flat[:n_panels]


def _save(fig: Any, out_dir: Path, name: str, title: str, backbone: str | None = None) -> FigureOutput:
    out_dir.mkdir(parents=True, exist_ok=True)
    # Wrapped to the figure's width: a one-panel figure would cut a long title off at both ends.
    fig.suptitle(textwrap.fill(f"{title} — {backbone}" if backbone else title, width=max(40, int(fig.get_figwidth() * 11))))
    fig.tight_layout()
    note = _NOTES.get().get(name)
    if note:
        fig.text(0.995, 0.005, note, ha="right", va="bottom", fontsize=8, color="firebrick")
    paths = tuple(out_dir / f"{name}.{extension}" for extension in ("png", "pdf"))
    for path in paths:
        fig.savefig(path, dpi=120)
    plt.close(fig)
    return FigureOutput(name, title, paths=paths, backbone=backbone)
