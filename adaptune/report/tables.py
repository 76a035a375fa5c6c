"""The paper's Tables 1 and 2 (and the adapter-size summary of Section 3.6), measured beside published.

Each table is a long DataFrame (one measured number per row, with `paper` and `difference`
columns) that is written as Parquet, every task and method of the paper's table in it; `*_markdown`
renders it for the report, leading with what was measured: only the tasks and methods with a run,
the others named on one line beneath (`not_run_line`). Scores are in percent.
Beside every task stand two floors: its majority-class baseline (`majority`, see baselines.py), so a score
that only predicts the most common class cannot pass as learning, and where measured the head alone (the
frozen backbone with only its task head trained, as a probe: a row of Table 1, a method of Table 2, none in the
paper), so a score reads as what its method adds to what the backbone gives untuned. In Table 1 a third where the
backbone is a sentence encoder and the task a similarity task: its zero-shot similarity (`zero_shot`, zero_shot.py)
on the same split and subsets as the row's run (Table 2's tasks are none of them).
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

import numpy as np
import pandas as pd

from adaptune.model.params import total_size_multiple
from adaptune.report.baselines import reported_split, run_baseline, task_baseline
from adaptune.report.floors import floor_note, floor_sentences
from adaptune.report.reference import extra_tasks, glue_tasks
from adaptune.report.selection import (
    BERT_BASE,
    BERT_LARGE,
    base_params,
    best_by_validation,
    best_configuration,
    reported_score,
    runs_for_backbone,
    scored_runs,
    to_percent,
    usable_runs,
    val_metric,
)
from adaptune.report.zero_shot import run_zero_shot

# Table 1's rows: which runs compete for each (paper row name -> filter on runs).
TABLE1_ROWS: dict[str, tuple[str, Any]] = {
    "head": ("Head only (frozen backbone)", lambda runs: runs["method"] == "head"),  # not in the paper: the floor
    "full": ("Full fine-tuning", lambda runs: runs["method"] == "full"),
    "adapters_best": ("Adapters (best size)", lambda runs: runs["method"] == "adapters"),
    "adapters_64": ("Adapters (64)", lambda runs: (runs["method"] == "adapters") & (runs["adapter_size"] == 64)),
}
TABLE2_METHODS = {"head": "Head only", "full": "Fine-tune", "top_k": "Variable FT (top-k)", "adapters": "Adapters",
                  "layernorm": "LayerNorm only"}
FLOOR_LABELS = {"majority": "majority class", "zero_shot": "zero-shot similarity"}
# Methods a table shows beside the paper's only where measured: not in the paper's table.
SHOWN_WHERE_MEASURED = ("head", "layernorm")
# glue_mean: the plain mean of the paper's nine columns, beside the same mean of the paper's own
# columns (82.0 / 81.5 / 81.1 over all nine). The paper's 'Total' (80.4 / 80.0 / 79.6) is the GLUE
# server's score (WNLI and the multi-metric averages in it), not comparable: kept as paper_server_score.
SUMMARY_COLUMNS = ("glue_mean", "trained_params_percent", "total_size_multiple")
# Table 2's rows that summarise a method over tasks (not tasks).
TABLE2_SUMMARY_ROWS = ("average", "trained_params_percent", "total_size_multiple")
# Columns (and their _a/_b variants) that simple_markdown shows to four significant digits, not as scores.
HYPERPARAMETER_COLUMNS = ("lr", "init_std")


def table1(runs: pd.DataFrame, reference: dict[str, Any], data_dir: Any = None) -> pd.DataFrame:
    """Per GLUE task and Table 1 row, the best run on validation and its majority-class baseline; then
    the mean over the nine columns (beside the paper's own column mean), trained %, total size.

    One backbone for the whole table (column `backbone`): BERT-large, the paper's, where measured.
    `data_dir`: the local data mirror the baselines read (default: found as data.resolve_data_dir does)."""
    usable, backbone = table1_candidates(runs, reference)
    tasks = glue_tasks(reference)
    score_tasks = reference["table1"]["tasks"]  # the paper's nine columns (WNLI omitted, its footnote 2)
    base = base_params(runs)
    records = []
    for row, (label, selects) in TABLE1_ROWS.items():
        paper_row = reference["table1"]["rows"].get(row, {})  # the head alone: no paper row
        candidates = usable[usable["task"].isin(tasks) & selects(usable)]
        if row not in reference["table1"]["rows"] and candidates.empty:
            continue
        chosen = best_by_validation(candidates, ["task"]).set_index("task")
        for task in tasks:
            paper = paper_row.get(task)
            run = chosen.loc[task] if task in chosen.index else None
            record = _table1_record(row, label, task, run, paper)
            metric = reference["table1"]["metrics"].get(task) if run is None else run["primary_metric"]
            record["majority"] = (
                run_baseline(task, run, metric, record["split"], data_dir) if run is not None
                else task_baseline(task, metric, "validation", data_dir) if metric else None
            )
            record["zero_shot"] = run_zero_shot(task, run, metric, record["split"], data_dir) if run is not None else None
            records.append(record)
        measured_tasks = [task for task in score_tasks if task in chosen.index]
        row_records = [r for r in records if r["row"] == row and r["task"] in measured_tasks]
        glue_mean = float(np.mean([r["measured"] for r in row_records])) if row_records else None
        paper_mean = _paper_mean_over(paper_row, measured_tasks, score_tasks, None)
        summary = _summary_record(row, label, "glue_mean", glue_mean, paper_mean, len(measured_tasks))
        majorities = [r["majority"] for r in row_records]
        summary["majority"] = float(np.mean(majorities)) if majorities and None not in majorities else None
        summary["paper_server_score"] = paper_row.get("glue_score")
        records.append(summary)
        trained_percent, multiple = _size_summary(chosen, base, backbone, shares_backbone=row != "full", n_tasks=len(score_tasks))
        records.append(
            _summary_record(row, label, "trained_params_percent", trained_percent, paper_row.get("trained_params_percent"), len(chosen))
        )
        records.append(_summary_record(row, label, "total_size_multiple", multiple, paper_row.get("total_size_multiple"), len(chosen)))
    frame = pd.DataFrame.from_records(records)
    frame["backbone"] = backbone
    return frame


def table1_candidates(runs: pd.DataFrame, reference: dict[str, Any]) -> tuple[pd.DataFrame, str | None]:
    """The runs Table 1 (and the GLUE claim) selects from: usable GLUE runs of full fine-tuning, adapters
    and the head alone beneath them, of one backbone (BERT-large, the paper's, where measured); and that backbone."""
    usable = usable_runs(runs)
    in_table = usable["task"].isin(glue_tasks(reference)) & usable["method"].isin(["full", "adapters", "head"])
    return runs_for_backbone(usable[in_table], BERT_LARGE)


def table2_candidates(runs: pd.DataFrame, reference: dict[str, Any]) -> tuple[pd.DataFrame, str | None]:
    """The runs Table 2 (and the additional-tasks claim) selects from: scored runs (degenerate seeds
    kept) of the additional tasks and Table 2's methods, of one backbone (BERT-base where measured)."""
    usable = scored_runs(runs)
    in_table = usable["task"].isin(extra_tasks(reference)) & usable["method"].isin(list(TABLE2_METHODS))
    return runs_for_backbone(usable[in_table], BERT_BASE)


def table2(runs: pd.DataFrame, reference: dict[str, Any], data_dir: Any = None) -> pd.DataFrame:
    """Per additional task and method, mean and s.e.m. across seeds of the configuration best on
    validation, with the task's majority-class baseline.

    Degenerate seeds (predictions collapsed to one class) stay in the mean and s.e.m., as the paper's
    seeds evidently did (its SMS spam adapters, 95.1 ± 2.2, sit below the 98.5 of its no-BERT baseline);
    `n_degenerate` says how many. Failed runs have no score and are left out.
    One backbone for the whole table (column `backbone`): BERT-base, the paper's, where measured."""
    paper_tasks = reference["table2"]["tasks"]
    tasks = extra_tasks(reference)
    candidates, backbone = table2_candidates(runs, reference)
    chosen = best_configuration(candidates, ["task", "method"]).set_index(["task", "method"])
    base = base_params(runs)
    records = []
    for method, label in TABLE2_METHODS.items():
        if method in SHOWN_WHERE_MEASURED and not any(m == method for _, m in chosen.index):
            continue  # not in the paper's Table 2; shown only when measured
        cells = [_table2_cell(task, method, label, paper_tasks, chosen, candidates, data_dir) for task in tasks]
        records += cells
        selected = chosen[chosen.index.get_level_values("method") == method]
        records.append(_table2_average(method, label, cells, tasks, paper_tasks, reference))
        trained_percent, multiple = _size_summary(
            selected.reset_index(), base, backbone, shares_backbone=method != "full", n_tasks=len(tasks)
        )
        for name, value in (("trained_params_percent", trained_percent), ("total_size_multiple", multiple)):
            records.append(
                {
                    "task": name,
                    "method": method,
                    "method_name": label,
                    "measured_mean": value,
                    "paper_mean": reference["table2"][name].get(method),
                    "selected": f"trained % over {len(selected)} measured task(s); size for all {len(tasks)} tasks",
                }
            )
    frame = pd.DataFrame.from_records(records)
    frame["difference"] = frame["measured_mean"] - frame["paper_mean"]
    frame["backbone"] = backbone
    return frame


def _table2_cell(task: str, method: str, label: str, paper_tasks: dict[str, Any], chosen: pd.DataFrame, candidates: pd.DataFrame,
                 data_dir: Any) -> dict[str, Any]:
    """One task's row of one method: the paper's value, the majority class, and the configuration chosen where measured."""
    paper_mean, paper_sem = (paper_tasks.get(task, {}).get(method) or [None, None])
    record = {"task": task, "method": method, "method_name": label, "paper_mean": paper_mean, "paper_sem": paper_sem}
    record["majority"] = task_baseline(task, "accuracy", reported_split(task), data_dir)
    if (task, method) in chosen.index:
        config = chosen.loc[(task, method)]
        seeds = candidates[candidates["run_id"].isin(config["run_ids"].split(","))]
        record.update(
            majority=run_baseline(task, seeds.iloc[0], config["primary_metric"], config["reported_split"], data_dir),
            n_degenerate=int((seeds["status"] == "degenerate").sum()),
            measured_mean=float(to_percent(config["reported_mean"])),
            measured_sem=_float_or_none(to_percent(config["reported_sem"])),
            n_seeds=int(config["n_seeds"]),
            split=config["reported_split"],
            selected=_describe(config),
            trained_params=config["trained_params"],
            run_ids=config["run_ids"],
        )
    return record


def _table2_average(method: str, label: str, cells: list[dict[str, Any]], tasks: list[str], paper_tasks: dict[str, Any],
                    reference: dict[str, Any]) -> dict[str, Any]:
    """A method's "average" row: over its measured tasks, and the paper's over the same tasks."""
    measured_tasks = [r["task"] for r in cells if "measured_mean" in r]
    measured = [r["measured_mean"] for r in cells if "measured_mean" in r]
    paper_means = {task: (paper_tasks.get(task, {}).get(method) or [None])[0] for task in tasks}
    return {
        "task": "average",
        "method": method,
        "method_name": label,
        "measured_mean": float(np.mean(measured)) if measured else None,
        "paper_mean": _paper_mean_over(paper_means, measured_tasks, tasks, reference["table2"]["average"].get(method)),
        "n_seeds": None,
        "selected": f"mean over {len(measured)} measured task(s); paper: mean over the same tasks",
        "majority": _mean_or_none([r.get("majority") for r in cells if "measured_mean" in r]),
    }


def adapter_size_table(runs: pd.DataFrame, reference: dict[str, Any]) -> pd.DataFrame:
    """Section 3.6: mean validation *accuracy* over the GLUE classification tasks per adapter size
    (best lr/epochs by accuracy), as the paper reports it, whatever each task's selection metric
    (CoLA's MCC, MRPC's and QQP's F1). Runs without a validation accuracy are left out.

    The paper's numbers are Table 1's BERT-large runs: BERT-large where measured (column `backbone`)."""
    paper = reference["figures"]["adapter_size_mean_validation"]
    usable = usable_runs(runs)
    usable["val_score"] = val_metric(usable, "accuracy")  # the paper's metric here, for choosing and scoring
    usable = usable[usable["val_score"].notna()]
    adapters = usable[(usable["method"] == "adapters") & usable["task"].isin(paper["tasks"])]
    adapters, backbone = runs_for_backbone(adapters, BERT_LARGE)
    chosen = best_configuration(adapters, ["task", "adapter_size"])
    records = []
    sizes = sorted({int(size) for size in paper["sizes"]} | {int(s) for s in chosen["adapter_size"].dropna()})
    for size in sizes:
        rows = chosen[chosen["adapter_size"] == size]
        measured = float(to_percent(rows["val_mean"].mean())) if not rows.empty else None
        paper_value = paper["sizes"].get(str(size))
        records.append(
            {
                "adapter_size": size,
                "measured": measured,
                "paper": paper_value,
                "difference": None if measured is None or paper_value is None else measured - paper_value,
                "n_tasks": len(rows),
                "tasks": ",".join(sorted(rows["task"])),
                "metric": "accuracy",
            }
        )
    frame = pd.DataFrame.from_records(records)
    frame["backbone"] = backbone
    return frame


def table1_markdown(table: pd.DataFrame, runs: pd.DataFrame | None = None, pending: Collection[str] = ()) -> str:
    """Wide Markdown: per Table 1 row, a measured, a majority-class, (where any task has one) a zero-shot similarity,
    a paper and a difference line.

    Only the task columns and method rows with a run are shown (see `table1_shown`); the rest are
    named on one line beneath (`not_run_line`; `pending`: tasks planned whose runs have not finished).
    table1.parquet keeps every task and row."""
    tasks, rows = table1_shown(table, runs)
    all_tasks = [task for task in dict.fromkeys(table["task"]) if task not in SUMMARY_COLUMNS]
    all_rows = dict(zip(table["row"], table["row_label"]))
    hidden = not_run_line(
        [t for t in all_tasks if t not in tasks], [all_rows[r] for r in all_rows if r not in rows], runs is not None,
        set(pending) & set(all_tasks),
    )
    if not rows:
        return "\n\n".join(filter(None, ["(no run of Table 1's tasks and methods)", hidden]))
    columns = tasks + list(SUMMARY_COLUMNS)
    means = table[(table["task"] == "glue_mean") & table["row"].isin(rows)]
    counts = {row: int(n) for row, n in zip(means["row"], means["n_tasks"]) if not pd.isna(n)}
    # One count in the header where every row's mean is over as many columns, else each cell says its own.
    same_count = len(set(counts.values())) <= 1
    mean_header = f"mean of {_count(next(iter(counts.values()), 0), 'column')}" if same_count else "mean (columns)"
    header = ["method", ""] + [mean_header if column == "glue_mean" else _short(column) for column in columns]
    lines = [_md_row(header), _md_row(["---"] * len(header))]
    for row, group in table.groupby("row", sort=False):
        if row not in rows:
            continue
        by_task = group.set_index("task")
        label = group["row_label"].iloc[0]
        floors = ("majority", "zero_shot") if "zero_shot" in group and group["zero_shot"].notna().any() else ("majority",)
        kinds = ("measured", *floors, "paper", "difference") if group["paper"].notna().any() else ("measured", *floors)
        for kind in kinds:
            cells = [label if kind == "measured" else "", FLOOR_LABELS.get(kind, kind)]
            for column in columns:
                value = by_task.loc[column, kind] if column in by_task.index and kind in by_task.columns else None
                cell = _fmt(value, signed=kind == "difference", multiple=column == "total_size_multiple")
                if column == "glue_mean" and not same_count and cell != "—":
                    cell += f" ({counts.get(row, 0)})"
                cells.append(cell)
            lines.append(_md_row(cells))
    return "\n\n".join(filter(None, ["\n".join(lines + _table1_floor_notes(table, tasks, rows)), hidden]))


def _table1_floor_notes(table: pd.DataFrame, tasks: list[str], rows: list[str]) -> list[str]:
    """Under Table 1: per task shown, the rows below each floor beside it, and a floor that beats every trained row."""
    sentences = []
    for task in tasks:
        cells = table[(table["task"] == task) & table["row"].isin(rows)]
        measured = cells[cells["measured"].notna()]
        head = measured.loc[measured["row"] == "head", "measured"]
        trained = measured[measured["row"] != "head"]
        floors = [(f"the {FLOOR_LABELS[kind]}", _first(cells, kind)) for kind in FLOOR_LABELS]
        sentences += floor_sentences(_short(task), floors, list(zip(trained["row_label"], trained["measured"])),
                                     None if head.empty else float(head.iloc[0]))
    return floor_note(sentences)


def _first(cells: pd.DataFrame, column: str) -> float | None:
    """A task's floor as its cells hold it (the same on every row of one backbone): the first known value."""
    values = cells[column].dropna() if column in cells else pd.Series(dtype=float)
    return None if values.empty else float(values.iloc[0])


def table2_markdown(
    table: pd.DataFrame, reference: dict[str, Any], runs: pd.DataFrame | None = None, pending: Collection[str] = ()
) -> str:
    """One line per task: each method's measured mean ± s.e.m. beside the paper's, and the difference.

    Only the tasks and methods with a run are shown (see `table2_shown`), then the summary rows for
    those methods; the rest are named on one line beneath (`not_run_line`; `pending`: tasks planned
    whose runs have not finished). table2.parquet keeps every task and method."""
    shown_tasks, methods = table2_shown(table, runs)
    all_tasks = [task for task in dict.fromkeys(table["task"]) if task not in TABLE2_SUMMARY_ROWS]
    all_methods = list(dict.fromkeys(table["method"]))
    hidden = not_run_line(
        [t for t in all_tasks if t not in shown_tasks], [TABLE2_METHODS[m] for m in all_methods if m not in methods], runs is not None,
        set(pending) & set(all_tasks),
    )
    if not methods:
        return "\n\n".join(filter(None, ["(no run of Table 2's tasks and methods)", hidden]))
    header = ["task", "majority class", "no BERT (paper)"]
    for method in methods:
        name = TABLE2_METHODS[method]
        header += [f"{name} measured", f"{name} paper", "Δ"]
    lines = [_md_row(header), _md_row(["---"] * len(header))]
    paper_tasks = reference["table2"]["tasks"]
    for task in [*shown_tasks, *(t for t in dict.fromkeys(table["task"]) if t in TABLE2_SUMMARY_ROWS)]:
        rows = table[table["task"] == task]
        majority = rows["majority"].dropna() if "majority" in rows else pd.Series(dtype=float)
        cells = [
            paper_tasks.get(task, {}).get("paper_name", task),
            _fmt(majority.iloc[0] if not majority.empty else None),
            _fmt(paper_tasks.get(task, {}).get("no_bert")),
        ]
        for method in methods:
            row = table[(table["task"] == task) & (table["method"] == method)]
            if row.empty:
                cells += ["—", "—", "—"]
                continue
            row = row.iloc[0]
            multiple = task == "total_size_multiple"
            degenerate = row.get("n_degenerate")
            flag = f" ({int(degenerate)} degenerate)" if degenerate is not None and not pd.isna(degenerate) and degenerate > 0 else ""
            cells += [
                _fmt_sem(row.get("measured_mean"), row.get("measured_sem"), multiple) + flag,
                _fmt_sem(row.get("paper_mean"), row.get("paper_sem"), multiple),
                _fmt(row.get("difference"), signed=True, multiple=multiple),
            ]
        lines.append(_md_row(cells))
    return "\n\n".join(filter(None, ["\n".join(lines + _table2_floor_notes(table, shown_tasks, methods, paper_tasks)), hidden]))


def _table2_floor_notes(table: pd.DataFrame, tasks: list[str], methods: list[str], paper_tasks: dict[str, Any]) -> list[str]:
    """Under Table 2: per task shown, the methods below its majority class and its head alone, and a floor that beats
    every trained method."""
    sentences = []
    for task in tasks:
        cells = table[(table["task"] == task) & table["method"].isin(methods) & table["measured_mean"].notna()]
        head = cells.loc[cells["method"] == "head", "measured_mean"]
        trained = cells[cells["method"] != "head"]
        sentences += floor_sentences(paper_tasks.get(task, {}).get("paper_name", task), [("the majority class", _first(cells, "majority"))],
                                     [(TABLE2_METHODS[m], v) for m, v in zip(trained["method"], trained["measured_mean"])],
                                     None if head.empty else float(head.iloc[0]))
    return floor_note(sentences)


def table1_shown(table: pd.DataFrame, runs: pd.DataFrame | None = None) -> tuple[list[str], list[str]]:
    """Table 1's task columns and rows (keys of TABLE1_ROWS) that have a run, in the table's order.

    With `runs` (the runs frame the table was built from): a task or row has a run when some finished
    run of the table's backbone (any status: ok, degenerate or failed) is of that GLUE task and passes
    that row's filter, or when a cell of it was measured. Without `runs`: only measured cells count."""
    cells = table[~table["task"].isin(SUMMARY_COLUMNS)]
    measured = cells[cells["measured"].notna()]
    tasks, rows = set(measured["task"]), set(measured["row"])
    all_tasks = list(dict.fromkeys(cells["task"]))
    if runs is not None and not runs.empty:
        attempted = _runs_of_table_backbone(runs, table)
        attempted = attempted[attempted["task"].isin(all_tasks)]
        for row in dict.fromkeys(table["row"]):
            selected = attempted[TABLE1_ROWS[row][1](attempted)] if row in TABLE1_ROWS else attempted.iloc[:0]
            if not selected.empty:
                rows.add(row)
                tasks |= set(selected["task"])
    return [t for t in all_tasks if t in tasks], [r for r in dict.fromkeys(table["row"]) if r in rows]


def table2_shown(table: pd.DataFrame, runs: pd.DataFrame | None = None) -> tuple[list[str], list[str]]:
    """Table 2's tasks and methods that have a run, in the table's order (see `table1_shown`: with
    `runs`, a finished run of any status of the table's backbone counts; without, a measured cell)."""
    cells = table[~table["task"].isin(TABLE2_SUMMARY_ROWS)]
    measured = cells[cells["measured_mean"].notna()] if "measured_mean" in cells else cells.iloc[:0]
    tasks, methods = set(measured["task"]), set(measured["method"])
    all_tasks, all_methods = list(dict.fromkeys(cells["task"])), list(dict.fromkeys(table["method"]))
    if runs is not None and not runs.empty:
        attempted = _runs_of_table_backbone(runs, table)
        attempted = attempted[attempted["task"].isin(all_tasks) & attempted["method"].isin(all_methods)]
        tasks |= set(attempted["task"])
        methods |= set(attempted["method"])
    return [t for t in all_tasks if t in tasks], [m for m in all_methods if m in methods]


def adapter_sizes_markdown(
    sizes: pd.DataFrame, runs: pd.DataFrame | None = None, tasks: list[str] | None = None, partial: bool = False
) -> str:
    """Section 3.6's table (simple_markdown, without `backbone`) for the adapter sizes with a run; the
    other sizes (the paper's, not run here) named on one line beneath. With `runs` and `tasks` (the
    table's tasks), a size has a run when some finished adapters run of it, of the table's backbone, is
    of one of those tasks; otherwise when it was measured. `partial`: the table's runs have not all
    finished, so a size may yet come. adapter_sizes.parquet keeps every size."""
    shown = set(sizes.loc[sizes["n_tasks"] > 0, "adapter_size"]) if "n_tasks" in sizes else set()
    if runs is not None and not runs.empty and tasks is not None:
        attempted = _runs_of_table_backbone(runs, sizes)
        attempted = attempted[(attempted["method"] == "adapters") & attempted["task"].isin(tasks)]
        shown |= {int(size) for size in attempted["adapter_size"].dropna()}
    kept = sizes[sizes["adapter_size"].isin(shown)].drop(columns="backbone", errors="ignore")
    hidden = [int(size) for size in sizes["adapter_size"] if size not in shown]
    line = ""
    if hidden:
        lead = ("No run finished so far" if partial else "Not run in this experiment") if runs is not None and tasks is not None \
            else "No usable run in this experiment"
        line = f"{lead}: {_count(len(hidden), 'adapter size')} ({', '.join(str(size) for size in hidden)})."
    table = simple_markdown(kept) if not kept.empty else "(no run of an adapter size on these tasks)"
    return "\n\n".join(filter(None, [table, line]))


def not_run_line(tasks: list[str], methods: list[str], from_runs: bool = True, pending: Collection[str] = ()) -> str:
    """The one line naming a table's tasks and methods left out of its Markdown for want of a run, e.g.
    "Not run in this experiment: 16 tasks (newsgroups_20, airline, …); 1 method (Variable FT (top-k))."
    ("" when none). `pending`: the tasks with planned runs not all finished (a sweep under way); those
    left out are named apart ("Planned, no run finished yet: 1 task (rte)."), and while any is pending
    the methods left out may yet come ("No run finished so far: 1 method (Adapters (64))."). `from_runs`
    False: the table was shown without the runs frame, so what is left out is what has no measured
    cell ("No usable run in this experiment: …")."""
    pending = set(pending)
    waiting = [task for task in tasks if task in pending]
    absent = [task for task in tasks if task not in pending]
    lead = "Not run in this experiment" if from_runs else "No usable run in this experiment"
    groups = [(lead, absent, "task"), ("Planned, no run finished yet", waiting, "task")]
    groups.insert(1 if not pending else 2, ("No run finished so far" if pending else lead, methods, "method"))
    sentences: dict[str, list[str]] = {}
    for sentence, names, noun in groups:
        if names:
            sentences.setdefault(sentence, []).append(f"{_count(len(names), noun)} ({', '.join(names)})")
    return " ".join(f"{sentence}: {'; '.join(parts)}." for sentence, parts in sentences.items())


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _runs_of_table_backbone(runs: pd.DataFrame, table: pd.DataFrame) -> pd.DataFrame:
    """The runs of the one backbone a table shows (all runs when it shows none)."""
    names = table["backbone"].dropna().unique() if "backbone" in table else []
    return runs[runs["backbone"].astype(str) == str(names[0])] if len(names) else runs


def simple_markdown(table: pd.DataFrame) -> str:
    """A plain Markdown rendering of a small table (scores to one decimal; learning rates and init
    stds to four significant digits)."""
    lines = [_md_row(list(table.columns)), _md_row(["---"] * len(table.columns))]
    for _, row in table.iterrows():
        cells = []
        for column, value in row.items():
            if isinstance(value, (float, np.floating)) and not np.isnan(value):
                hyperparameter = str(column).removesuffix("_a").removesuffix("_b") in HYPERPARAMETER_COLUMNS
                cells.append(f"{value:.4g}" if hyperparameter else _fmt(value))
            else:
                cells.append(_text(value))
        lines.append(_md_row(cells))
    return "\n".join(lines)


def _table1_record(row: str, label: str, task: str, run: pd.Series | None, paper: float | None) -> dict[str, Any]:
    record: dict[str, Any] = {"row": row, "row_label": label, "task": task, "paper": paper, "measured": None}
    if run is not None:
        score, split = reported_score(run.to_frame().T)
        record.update(
            measured=float(to_percent(score.iloc[0])),
            split=split.iloc[0],
            metric=run["primary_metric"],
            val_score=float(to_percent(run["val_score"])),
            run_id=run["run_id"],
            method_label=run["method_label"],
            lr=float(run["lr"]),
            epochs=int(run["epochs"]),
            seed=int(run["seed"]),
            trained_params=_float_or_none(run["trained_params"]),
        )
    record["difference"] = None if record["measured"] is None or paper is None else record["measured"] - paper
    return record


def _summary_record(row: str, label: str, name: str, measured: float | None, paper: float | None, n_tasks: int) -> dict[str, Any]:
    return {
        "row": row,
        "row_label": label,
        "task": name,
        "measured": measured,
        "paper": paper,
        "difference": None if measured is None or paper is None else measured - paper,
        "n_tasks": n_tasks,
    }


def _size_summary(
    chosen: pd.DataFrame, base: dict[str, int], backbone: str | None, shares_backbone: bool, n_tasks: int
) -> tuple[float | None, float | None]:
    """Mean trained-% of the table's backbone over the chosen runs (all of that backbone), and the
    total-size multiple for all `n_tasks` of the paper's table at that mean (so it compares with the
    paper's 9x / 1.3x / 17x / 1.19x even when a sweep measured only some tasks)."""
    chosen = chosen[chosen["trained_params"].notna() & (chosen["backbone"] == backbone)]
    if chosen.empty or backbone not in base:
        return None, None
    mean_trained = float(np.mean([int(value) for value in chosen["trained_params"]]))
    percent = 100.0 * mean_trained / base[backbone]
    return percent, total_size_multiple([round(mean_trained)] * n_tasks, base[backbone], shares_backbone=shares_backbone)


def _paper_mean_over(paper_by_task: dict[str, Any], measured: list[str], all_tasks: list[str], published: float | None) -> float | None:
    """The paper's figure to set beside a mean over `measured` tasks: the mean of its own per-task values
    over the same tasks (like with like); with `published` given and every task measured, that instead."""
    if published is not None and set(all_tasks) <= set(measured):
        return published
    given = [paper_by_task.get(task) for task in measured]
    values = [float(value) for value in given if value is not None]
    return float(np.mean(values)) if values and len(values) == len(measured) else None


def _describe(config: pd.Series) -> str:
    return f"{config['method_label']} lr={config['lr']:g} epochs={int(config['epochs'])}"


def _mean_or_none(values: list[Any]) -> float | None:
    """The mean, or None when any value is missing (a mean over fewer tasks would mislead)."""
    return float(np.mean(values)) if values and all(v is not None for v in values) else None


def _float_or_none(value: Any) -> float | None:
    return None if value is None or pd.isna(value) else float(value)


def _short(column: str) -> str:
    return {"glue_mean": "mean", "trained_params_percent": "trained %/task", "total_size_multiple": "total size"}.get(
        column, column
    )


def _fmt(value: Any, signed: bool = False, multiple: bool = False) -> str:
    if value is None or (isinstance(value, (float, np.floating)) and np.isnan(value)):
        return "—"
    if multiple:
        return f"{value:+.2f}×" if signed else f"{value:.2f}×"
    return f"{value:+.1f}" if signed else f"{value:.1f}"


def _fmt_sem(mean: Any, sem: Any, multiple: bool = False) -> str:
    text = _fmt(mean, multiple=multiple)
    if text != "—" and sem is not None and not pd.isna(sem):
        text += f" ± {sem:.1f}"
    return text


def _text(value: Any) -> str:
    return "—" if value is None or (not isinstance(value, str) and pd.isna(value)) else str(value)


def _md_row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"
