"""Methods side by side on every measured task: what a small reproduction (cpu_small) is read by.

Tables 1 and 2 follow the paper's layout (GLUE's best single run; the additional tasks only). This
table puts every classification task measured in one place: per task and method, the configuration
with the best mean validation score across seeds, its reported score (test where labelled: GLUE's
dev set) as mean ± s.e.m. across those seeds, the learning rate selected, and two floors on the same
split and subsets: the majority-class baseline, and the head alone (the frozen backbone with only its task
head trained, where measured), so a method's score reads as what it adds to what the backbone gives
untuned. A third floor where the backbone is a sentence encoder and the task a similarity task (zero_shot.py): the
frozen backbone's zero-shot similarity (mean-pooled cosine of the two sentences, no training; a classification task's
threshold chosen on the training split), `zero_shot`, with what it selected on which split in `zero_shot_selected`.
Degenerate seeds stay in the mean (as in Table 2). Splits are named as their publisher names them (GLUE's reported
split: "dev").
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from adaptune.report.baselines import run_baseline
from adaptune.report.floors import floor_note, floor_sentences
from adaptune.report.selection import (
    BERT_BASE,
    base_params,
    best_configuration,
    publisher_split,
    runs_for_backbone,
    scored_runs,
    to_percent,
)
from adaptune.report.zero_shot import NAME as ZERO_SHOT_NAME
from adaptune.report.zero_shot import SIMILARITY_TASKS, run_floor, zero_shot_reason

# The head alone first: the floor beside the majority class, before the methods that stand on it.
METHOD_NAMES = {"head": "Head only (frozen backbone)", "full": "Full fine-tuning", "top_k": "Top-k layers", "adapters": "Adapters",
                "layernorm": "LayerNorm only", "pfeiffer": "Adapters (Pfeiffer)", "lora": "LoRA", "ia3": "(IA)3"}
COLUMNS = ("task", "metric", "split", "rows", "majority", "zero_shot", "zero_shot_selected", "method", "method_name", "mean", "sem", "n_seeds", "n_degenerate",
           "lr", "epochs", "selected", "trained_percent", "backbone", "run_ids", "probe")


def methods_table(runs: pd.DataFrame, data_dir: Any = None) -> pd.DataFrame:
    """One row per (task, method) measured, on one backbone (BERT-base where measured, else the most common)."""
    candidates = scored_runs(runs)
    candidates = candidates[candidates["method"].isin(list(METHOD_NAMES)) & ~candidates["task"].str.startswith("squad")]
    candidates, backbone = runs_for_backbone(candidates, BERT_BASE)
    if candidates.empty:
        return pd.DataFrame(columns=list(COLUMNS))
    assert backbone is not None  # runs_for_backbone names the backbone of any runs
    chosen = best_configuration(candidates, ["task", "method"])
    base = base_params(runs).get(backbone)
    order = {method: index for index, method in enumerate(METHOD_NAMES)}
    records = []
    for config in chosen.itertuples():
        seeds = candidates[candidates["run_id"].isin(config.run_ids.split(","))]
        first = seeds.iloc[0]
        rows = first["test_rows"] if config.reported_split == "test" else first["val_rows"]
        floor = run_floor(config.task, first, config.reported_split, data_dir)
        zero_shot = None if floor is None else floor.metrics.get(config.primary_metric)
        records.append({
            "task": config.task, "metric": config.primary_metric, "split": publisher_split(config.task, config.reported_split),
            "rows": None if pd.isna(rows) else int(rows),
            "majority": run_baseline(config.task, first, config.primary_metric, config.reported_split, data_dir),
            "zero_shot": None if zero_shot is None else 100.0 * float(zero_shot),
            "zero_shot_selected": None if floor is None else floor.selected(),
            "method": config.method, "method_name": METHOD_NAMES[config.method],
            "mean": float(to_percent(config.reported_mean)),
            "sem": None if pd.isna(config.reported_sem) else float(to_percent(config.reported_sem)),
            "n_seeds": int(config.n_seeds), "n_degenerate": int((seeds["status"] == "degenerate").sum()),
            "lr": float(config.lr), "epochs": int(config.epochs),
            "selected": f"{config.method_label} lr={config.lr:g} epochs={int(config.epochs)}",
            "trained_percent": 100.0 * config.trained_params / base if base else None,
            "backbone": backbone, "run_ids": config.run_ids,
            "probe": bool("probe" in seeds and seeds["probe"].fillna(False).astype(bool).all()),
        })
    table = pd.DataFrame.from_records(records, columns=list(COLUMNS))
    return table.sort_values(["task", "method"], key=lambda column: column.map(order) if column.name == "method" else column,
                             ignore_index=True)


def methods_markdown(table: pd.DataFrame) -> str:
    """Tasks as rows, methods as columns: 'mean ± s.e.m. (lr)'; the majority class beside each task, and the
    zero-shot similarity where it applies (what it selected said beneath; where the backbone is no sentence encoder,
    why there is none, once)."""
    if table.empty:
        return "(no classification runs with a score)"
    methods = [m for m in METHOD_NAMES if m in set(table["method"])]
    zero_shot = "zero_shot" in table and table["zero_shot"].notna().any()
    header = ["task", "metric (split, rows)", "majority class", *(["zero-shot similarity"] if zero_shot else []),
              *[METHOD_NAMES[m] for m in methods]]
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(["---"] * len(header)) + " |"]
    for task, rows in table.groupby("task", sort=True):
        first = rows.iloc[0]
        size = "" if first["rows"] is None or pd.isna(first["rows"]) else f", {int(first['rows'])}"
        cells = [task, f"{first['metric']} ({first['split']}{size})", _number(first["majority"])]
        if zero_shot:
            cells.append(_number(first["zero_shot"]))
        for method in methods:
            row = rows[rows["method"] == method]
            cells.append("—" if row.empty else _cell(row.iloc[0]))
        lines.append("| " + " | ".join(cells) + " |")
    percent = table.groupby("method")["trained_percent"].mean()
    lines.append("| trained % of the backbone | | |" + (" |" if zero_shot else "") + " "
                 + " | ".join(_percent(percent.get(m)) for m in methods) + " |")
    return "\n".join(lines + _probe_note(table) + _floor_notes(table) + _zero_shot_notes(table))


def _floor_notes(table: pd.DataFrame) -> list[str]:
    """Beneath the table: per task, the methods below each floor it shows (majority class, head alone, zero-shot), and
    a floor that beats every trained method."""
    sentences = []
    for task, rows in table.groupby("task", sort=True):
        first = rows.iloc[0]
        head = rows.loc[rows["method"] == "head", "mean"]
        trained = rows[rows["method"] != "head"]
        floors = [("the majority class", first["majority"])]
        if "zero_shot" in rows:
            floors.append(("the zero-shot similarity", first["zero_shot"]))
        sentences += floor_sentences(str(task), floors, list(zip(trained["method_name"], trained["mean"])),
                                     None if head.empty else float(head.iloc[0]))
    return floor_note(sentences)


def _probe_note(table: pd.DataFrame) -> list[str]:
    """Beneath the table: what the head alone used where it trained as a probe (adaptune.train.probe)."""
    probes = table[table["method"].eq("head") & table["probe"].fillna(False).astype(bool)] if "probe" in table else table.iloc[:0]
    if probes.empty:
        return []
    epochs = ", ".join(str(value) for value in sorted(set(probes["epochs"])))
    return ["", f"{METHOD_NAMES['head']}: the task head trained as a probe on the frozen backbone's pooled features, computed "
                f"once with no dropout in the backbone; {epochs} epochs, its rate selected on validation as every method's is."]


def _zero_shot_notes(table: pd.DataFrame) -> list[str]:
    """Beneath the table: per task with the zero-shot floor, what it selected on which split (the methods below it are
    in _floor_notes); where similarity tasks have none because the backbone is no sentence encoder, that reason once."""
    notes = []
    firsts = table.groupby("task", sort=True).first()
    for task, first in firsts.iterrows():
        if "zero_shot" not in first or first["zero_shot"] is None or pd.isna(first["zero_shot"]):
            continue
        notes.append(f"{task}: {ZERO_SHOT_NAME} {first['zero_shot']:.1f} on {first['split']}; {first['zero_shot_selected']}")
    similarity = [task for task in firsts.index if task in SIMILARITY_TASKS]
    reasons = {zero_shot_reason(task, firsts.loc[task, "backbone"]) for task in similarity
               if "zero_shot" not in firsts or pd.isna(firsts.loc[task, "zero_shot"])}
    lines = ["", "Zero-shot similarity floor (the frozen backbone as a sentence encoder, no training): " + "; ".join(notes) + "."] if notes else []
    backbone_reasons = sorted(reason for reason in reasons if reason and "not a sentence encoder" in reason)
    if backbone_reasons:
        lines += ["", f"No zero-shot similarity floor on {', '.join(similarity)}: {backbone_reasons[0]}."]
    elif None in reasons:
        lacking = [task for task in similarity if pd.isna(firsts.loc[task, "zero_shot"])]
        lines += ["", f"No zero-shot similarity floor on {', '.join(lacking)}: the data dir lacks its training or reported split."]
    return lines


def _cell(row: pd.Series) -> str:
    text = _number(row["mean"])
    if row["sem"] is not None and not pd.isna(row["sem"]):
        text += f" ± {row['sem']:.1f}"
    lr = f"{row['lr']:g}"
    degenerate = f", {int(row['n_degenerate'])} degenerate" if row["n_degenerate"] else ""
    seeds = int(row["n_seeds"])
    return f"{text} (lr {lr}, {seeds} seed{'s' if seeds != 1 else ''}{degenerate})"


def _percent(value: Any) -> str:
    """Two decimals; below 0.01 two significant digits (the head alone trains thousandths of a percent)."""
    if value is None or pd.isna(value) or value == 0 or value >= 0.01:
        return _number(value, digits=2)
    return f"{value:.2g}"


def _number(value: Any, digits: int = 1) -> str:
    return "—" if value is None or pd.isna(value) else f"{value:.{digits}f}"
