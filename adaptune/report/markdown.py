"""`build_report`: every table and figure from a results directory, linked from one report.md."""

from __future__ import annotations

import dataclasses
import json
import warnings
from pathlib import Path
from typing import Any

import pandas as pd

from adaptune.report import figures as figure_module
from adaptune.report.bootstrap import rule_text
from adaptune.report.claims import claims_markdown, claims_table, read_grid_left_out
from adaptune.report.figures import SQUAD_BACKBONE_NOTE, FigureOutput, all_figures
from adaptune.report.methods_table import methods_markdown, methods_table
from adaptune.report.partial import Coverage, claims_for_markdown, mark_claims, read_coverage, table_scopes
from adaptune.report.reference import load_reference, reference_path
from adaptune.report.results import ResultsWarning, read_results
from adaptune.report.selection import problem_runs
from adaptune.report.separation import SEPARATION_POINTS, separation_line, table2_separation
from adaptune.report.tables import (
    SUMMARY_COLUMNS,
    TABLE2_SUMMARY_ROWS,
    adapter_size_table,
    adapter_sizes_markdown,
    simple_markdown,
    table1,
    table1_markdown,
    table1_shown,
    table2,
    table2_markdown,
    table2_shown,
)

RESULTS_LINE_START = "Results: `"  # the report's first line after its title: the folder its results are in


def name_results_folder(report: str | Path, results_dir: str | Path) -> None:
    """Rewrite a report's results line to name `results_dir`: for a report copied out of a pipeline's internal
    folders (kfp.local's pipeline root) into the folder its user asked for, beside the copied results."""
    path = Path(report)
    lines = path.read_text(encoding="utf-8").split("\n")
    for index, line in enumerate(lines):
        if line.startswith(RESULTS_LINE_START):
            rest = line[len(RESULTS_LINE_START):].split("`", 1)[1]
            lines[index] = f"{RESULTS_LINE_START}{results_dir}`{rest}"
            break
    else:
        raise ValueError(f"{path} has no results line (starting {RESULTS_LINE_START!r}): not a report build_report wrote")
    path.write_text("\n".join(lines), encoding="utf-8")


def build_report(
    results_dir: str | Path, out_dir: str | Path, reference: str | Path | None = None, data_dir: str | Path | None = None
) -> Path:
    """Write tables/ (Parquet + Markdown), figures/ (PNG + PDF) and report.md into out_dir; return report.md.

    `data_dir`: the local data mirror the majority-class baselines read (default: found as
    data.resolve_data_dir does; without one, baselines are "—")."""
    results_dir, out_dir = Path(results_dir), Path(out_dir)
    frames, unreadable = _read_frames(results_dir)
    paper = load_reference(reference)
    runs = frames["runs"]
    tables_dir, figures_dir = out_dir / "tables", out_dir / "figures"
    tables_dir.mkdir(parents=True, exist_ok=True)

    t1, t2, sizes = table1(runs, paper, data_dir), table2(runs, paper, data_dir), adapter_size_table(runs, paper)
    coverage = read_coverage(results_dir)  # None: a complete results set
    claims = mark_claims(claims_table(frames, paper, data_dir), coverage, paper)
    methods = methods_table(runs, data_dir)
    problems = problem_runs(runs)
    notes = _partial_notes(coverage, paper, runs)
    # Tables name the tasks and methods with no run on one line; a task planned whose runs have not finished is named apart.
    pending = coverage.pending(set(t1["task"]) | set(t2["task"])) if coverage is not None else set()
    size_tasks = paper["figures"]["adapter_size_mean_validation"]["tasks"]
    separation = table2_separation(t2)
    for name, frame in (("table1", t1), ("table2", t2), ("table2_separation", separation), ("adapter_sizes", sizes), ("claims", claims),
                        ("methods", methods), ("excluded_runs", problems)):
        frame.to_parquet(tables_dir / f"{name}.parquet", index=False)
    markdown = {
        "table1": table1_markdown(t1, runs, pending),
        "table2": "\n\n".join(filter(None, [table2_markdown(t2, paper, runs, pending), separation_line(separation)])),
        "claims": claims_markdown(claims_for_markdown(claims), read_grid_left_out(results_dir)),
        "methods": methods_markdown(methods),
        "adapter_sizes": adapter_sizes_markdown(sizes, runs, size_tasks, partial=bool(notes.get("adapter_sizes"))),
        "excluded_runs": simple_markdown(markdown_safe(problems)) if not problems.empty else "(none)",
    }
    markdown = {name: (f"*{notes[name]}*\n\n{text}" if name in notes else text) for name, text in markdown.items()}
    for name, text in markdown.items():
        (tables_dir / f"{name}.md").write_text(text + "\n", encoding="utf-8")
    with figure_module.notes(notes):
        figures = all_figures(frames, paper, figures_dir)

    report = out_dir / "report.md"
    parts = ReportParts(results_dir, runs, frames, markdown, t1, t2, sizes, methods, figures, problems, out_dir,
                        reference or reference_path(), unreadable, coverage, notes)
    report.write_text(_render(parts), encoding="utf-8")
    return report


def _read_frames(results_dir: Path) -> tuple[dict[str, pd.DataFrame], tuple[str, ...]]:
    """The results set's frames, and one line per file left out as unreadable (each also warned as usual)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResultsWarning)
        frames = read_results(results_dir)
    for warning in caught:  # shown to the caller as usual, and listed in the report
        warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)
    return frames, tuple(str(warning.message) for warning in caught if issubclass(warning.category, ResultsWarning))


@dataclasses.dataclass(frozen=True)
class ReportParts:
    """What report.md is written from: the results read, the tables and figures made from them, and where they went."""

    results_dir: Path
    runs: pd.DataFrame
    frames: dict[str, pd.DataFrame]
    markdown: dict[str, str]  # table name -> its Markdown
    t1: pd.DataFrame
    t2: pd.DataFrame
    sizes: pd.DataFrame
    methods: pd.DataFrame
    figures: list[FigureOutput]
    problems: pd.DataFrame
    out_dir: Path
    reference: Any
    unreadable: tuple[str, ...] = ()
    coverage: Coverage | None = None
    notes: dict[str, str] | None = None


def _render(parts: ReportParts) -> str:
    lines = [*_header(parts), *_methods_section(parts), *_table1_section(parts), *_table2_section(parts),
             *_adapter_size_section(parts), *_claims_section(parts), *_figures_section(parts), *_excluded_section(parts)]
    return "\n".join(lines)


def _header(parts: ReportParts) -> list[str]:
    """The title, what the results are, where the paper's values come from, and what the report leaves out."""
    counts = parts.runs["status"].value_counts()
    status_line = ", ".join(f"{counts.get(status, 0)} {status}" for status in ("ok", "failed", "degenerate"))
    return [
        "# adaptune report",
        "",
        f"{RESULTS_LINE_START}{parts.results_dir}` — {len(parts.runs)} run(s): {status_line}; "
        f"{len(parts.problems)} excluded from selection (listed under 'Excluded runs'). "
        f"{parts.frames['curves']['run_id'].nunique()} run(s) with learning curves, {len(parts.frames['ablation'])} ablation row(s).",
        "",
        f"Paper values: `{parts.reference}` (Houlsby et al. 2019). Scores are percent. Selection is always on "
        "validation, never on the reported split: GLUE's validation is a seeded, stratified slice held out of "
        "train.tsv (10%, at most 10,000 rows; runs.parquet `val_rows`) and its reported score is the dev set "
        "(the GLUE test labels are not public, so the paper's GLUE *test-server* numbers are only a reference); "
        "the additional tasks report their test split; SQuAD reports validation (dev-v1.1).",
        "",
        *[f"**Left out, unreadable:** {' '.join(problem.split())}\n" for problem in parts.unreadable],
        *_partial_header(parts.coverage),
        *_precision_header(parts.runs),
    ]


def _methods_section(parts: ReportParts) -> list[str]:
    """Every method side by side, per classification or regression task measured."""
    return [
        "## Methods side by side",
        "",
        "Every classification and regression task measured (SQuAD, a span task, is not here): per method, the "
        "configuration with the best mean "
        "validation score across seeds, and its reported score as mean ± s.e.m. across those seeds (degenerate seeds "
        "kept), with the learning rate selected and, beside each task, the majority-class baseline on the same split and "
        "rows (for a regression task, a constant prediction: correlation 0); 'Head only' (where measured) is the frozen "
        "backbone with only its task head trained, a floor where it scores above that baseline (else it learned nothing). "
        "Where the backbone is a sentence encoder (the embedded all-MiniLM-L6-v2; BERT is not) and the task "
        "compares two sentences for similarity (MRPC, QQP, STS-B; not the inference tasks), 'zero-shot similarity' is a "
        "third floor on the same split and rows: the frozen backbone used as the sentence encoder it was trained to be "
        "(each sentence's mean-pooled embedding, the cosine between the two) with no training; a classification task's "
        "threshold on the cosine is chosen on the training split, as the note under the table says. The notes under the "
        "table name, for every floor it shows, each method below it, and say so where a floor beats every trained method. "
        "Splits are named as their publisher names them: GLUE's reported split is its dev set.",
        "",
        _backbone_line(parts.methods, "BERT-base / BERT-large"),
        "",
        parts.markdown["methods"],
        "",
        "Files: [methods.parquet](tables/methods.parquet), [methods.md](tables/methods.md)",
        "",
    ]


def _table1_section(parts: ReportParts) -> list[str]:
    """Table 1 (GLUE), beside the paper's."""
    return [
        "## Table 1: GLUE",
        "",
        "Per task and row, the single run best on validation (the paper also picks the best seed), and beneath it "
        "the majority-class baseline: the training labels' most common class predicted for every example of the "
        "reported split, scored with the task's metric (F1 of that constant prediction; MCC and correlations 0). "
        "'Mean of N columns': the plain mean over the N of the paper's nine columns measured, beside the "
        "mean of the paper's own columns over the same tasks (82.0 / 81.5 / 81.1 over all nine). The paper's "
        "'Total' (80.4 / 80.0 / 79.6) is the GLUE server's score, which counts WNLI and averages multi-metric tasks: "
        "not comparable, kept in table1.parquet as `paper_server_score`. "
        "Trained % is relative to the backbone of these runs; total size is for all nine tasks at that trained %. "
        "'Head only', where measured, is the frozen backbone with only its task head trained (not in the paper): the "
        "floor where it scores above the majority-class baseline. The note under the table names, for every floor it "
        "shows, each row below it, and says so where a floor beats every trained row.",
        "",
        _backbone_line(parts.t1, "BERT-large"),
        "",
        parts.markdown["table1"],
        "",
        _missing_line(_shown_cells(parts.t1, parts.runs), "task", "row_label"),
        "",
        "Files: [table1.parquet](tables/table1.parquet), [table1.md](tables/table1.md)",
        "",
    ]


def _table2_section(parts: ReportParts) -> list[str]:
    """Table 2 (the additional tasks), beside the paper's."""
    return [
        "## Table 2: additional tasks",
        "",
        "Per task and method, the configuration with the best mean validation score across seeds; "
        "mean ± s.e.m. across its seeds. Degenerate seeds (predictions collapsed to one class) are kept in the mean "
        "and s.e.m., as the paper's evidently were (its SMS spam adapters, 95.1 ± 2.2, sit below its own no-BERT "
        "98.5); a cell says how many it holds. 'Majority class': the test accuracy of predicting the training "
        "labels' most common class. 'Head only', where measured, is the frozen backbone with only its task head trained "
        "(as a probe; not in the paper). 'Average': the mean over the tasks measured, beside the paper's own mean over the "
        "same tasks. A task whose floor (the higher of the majority class and the head alone) stands within "
        f"{SEPARATION_POINTS:g} point of every trained method is named beneath the table as one that does not separate "
        "the methods ([table2_separation.parquet](tables/table2_separation.parquet)).",
        *_tasks_line(parts.t2),
        "",
        _backbone_line(parts.t2, "BERT-base"),
        "",
        parts.markdown["table2"],
        "",
        _missing_line(_shown_cells(parts.t2, parts.runs), "task", "method_name", column="measured_mean"),
        "",
        "Files: [table2.parquet](tables/table2.parquet), [table2.md](tables/table2.md)",
        "",
    ]


def _tasks_line(table: pd.DataFrame) -> list[str]:
    """Which additional tasks Table 2 measured, by name: its mean and the claim speak for these, not for all 17."""
    measured = table[table["measured_mean"].notna() & ~table["task"].isin(TABLE2_SUMMARY_ROWS)] if "measured_mean" in table else table.iloc[:0]
    tasks = list(dict.fromkeys(measured["task"]))
    if not tasks:
        return []
    return ["", f"Measured on {len(tasks)} of the paper's 17 additional tasks: {', '.join(tasks)}; the averages and the claim "
                "speak for these tasks only."]


def _adapter_size_section(parts: ReportParts) -> list[str]:
    """Section 3.6's mean validation accuracy per adapter size."""
    return [
        "## Adapter size (Section 3.6): mean validation accuracy over the GLUE classification tasks",
        "",
        "Accuracy, as the paper reports it here, for every task (CoLA's MCC and MRPC's/QQP's F1 select elsewhere); "
        "the best learning rate and epochs per size are chosen by accuracy too.",
        "",
        _backbone_line(parts.sizes, "BERT-large (Table 1's runs)"),
        "",
        parts.markdown["adapter_sizes"],
        "",
    ]


def _claims_section(parts: ReportParts) -> list[str]:
    """The verdict on each of the paper's claims."""
    return [
        "## The paper's claims",
        "",
        "Each claim's verdict from this results set, by one rule: **holds** when the 95% interval lies wholly on the "
        "claim's side of the threshold, **does not hold** when it lies wholly on the other side, **inconclusive** when "
        "it straddles the threshold, one seed gives no interval, or the runs are too few for the interval to be one, "
        "**not measured** without runs. Enough runs to judge: " + rule_text() + "; a row with fewer says how many it "
        "has, how many a verdict needs, and on which side its interval lies. Tasks are not resampled: a verdict "
        "speaks for the tasks its row names. The value is the "
        "paper's own estimator, as its table reports it (Table 1's single best run on validation; Table 2's and the "
        "figures' best configuration, mean over seeds); the interval is a percentile bootstrap of that same estimator, "
        "seeds resampled per task and method and the selection redone in each resample. 'Seeds to settle': for an "
        "inconclusive row, ceil(n × (half-width / |measured − threshold|)²) seeds per task and method. Each rule quotes "
        "the paper's sentence: [claims.parquet](tables/claims.parquet) (`rule`) and `adaptune/report/claims.py`. 'Grid': "
        "the learning rates, epochs and seeds of the runs each claim read, marked where smaller than the paper's (§3.2's "
        "for parameter-efficient methods, Devlin et al.'s for full fine-tuning on GLUE, §3.3's on the additional tasks). "
        "Each claim reads only the kinds of task it names (`reads`: classification, regression, span), declared once "
        "with the code that filters its runs. Each figure in a detail names its split, and each detail gives each "
        "method's margin over the head alone (same selection, same split; negative: below it) where the head alone was "
        "measured; where the head alone learned nothing "
        "(at or below the majority class, or a correlation at or below 0) the detail says what it scored and measures "
        "each method from the majority class (or 0) instead; where the backbone's zero-shot similarity (see the methods "
        "table) is the highest floor, the detail names it and measures each method from it. A method below the floor "
        "it is measured from is said to be below it.",
        "",
        parts.markdown["claims"],
        "",
    ]


def _figures_section(parts: ReportParts) -> list[str]:
    """Each figure, or why it was skipped, with its backbone and the paper's."""
    lines = ["## Figures", ""]
    for figure in parts.figures:
        paper_backbone = SQUAD_BACKBONE_NOTE if figure.name == "figure5_squad" else "BERT-base"
        if figure.skipped:
            lines += [f"- **{figure.title}**: skipped — {figure.skipped}."
                      + (f" The paper's backbone for it: {paper_backbone}." if figure.name == "figure5_squad" else ""), ""]
        else:
            png, pdf = (path.relative_to(parts.out_dir).as_posix() for path in figure.paths)
            lines += [f"### {figure.title}", ""]
            note = (parts.notes or {}).get(figure.name)
            if note:
                lines += [f"*{note}*", ""]
            lines += [f"Backbone: `{figure.backbone or 'unknown'}` (the paper's: {paper_backbone}).", ""]
            lines += [f"![{figure.name}]({png})", "", f"[PDF]({pdf})", ""]
    return lines


def _excluded_section(parts: ReportParts) -> list[str]:
    """The runs no selection reads."""
    return [
        "## Excluded runs (failed, degenerate, or without a validation score)",
        "",
        "Never selected for Table 1 or the per-method points of the figures; Table 2, the robustness figures and the "
        "claims keep degenerate seeds as results (failed runs have no score).",
        "",
        parts.markdown["excluded_runs"],
        "",
    ]


def _partial_notes(coverage: Coverage | None, reference: dict[str, Any], runs: pd.DataFrame) -> dict[str, str]:
    """Table or figure name -> "partial: N of M runs", for those whose tasks' runs have not all finished."""
    if coverage is None:
        return {}
    scopes = table_scopes(reference, coverage.planned)
    names = [*scopes, "claims", "figure6_ablation", "figure6_init_std", "figure7_learning_rate"]
    return {name: note for name in names if (note := coverage.note(scopes.get(name)))}


def _partial_header(coverage: Coverage | None) -> list[str]:
    if coverage is None or coverage.note() is None:
        return []
    finished, planned = coverage.counts()
    return [f"**Partial report: {finished:,} of {planned:,} planned runs have finished.** Every table and figure "
            "below that reads unfinished runs says so (\"partial: N of M runs\", counted over the tasks it shows), "
            "and so does each claim whose runs are incomplete (claims.parquet `coverage`).", ""]


def _precision_header(runs: pd.DataFrame) -> list[str]:
    """A line where the runs that score were trained in more than one precision: their residual stream
    (runs.parquet `step_settings_json`) or their CPU's (`device` "cpu" or "cpu:bf16"). A run's id does not carry
    them, so a resubmission under another preset reuses the finished runs and trains the rest the new way."""
    scored = runs[runs["status"] != "failed"]
    residual = scored["step_settings_json"].dropna().map(lambda settings: json.loads(settings).get("residual")).dropna()
    cpu = scored["device"].dropna()
    precisions = {"residual stream": residual, "CPU precision": cpu[cpu.str.startswith("cpu")]}
    mixed = [(what, values.value_counts()) for what, values in precisions.items() if values.nunique() > 1]
    if not mixed:
        return []
    described = "; ".join(f"{what}: " + ", ".join(f"{value} ({count} runs)" for value, count in counts.items()) for what, counts in mixed)
    return [f"**Trained in more than one precision:** {described}. The tables below set such runs side by side; "
            "`python -m pipelines compare` pairs runs trained both ways (runs.parquet `step_settings_json`, `device`).", ""]


def markdown_safe(table: pd.DataFrame) -> pd.DataFrame:
    """A copy whose text cells cannot break a Markdown table row: newlines become spaces, `|` is escaped."""

    def cell(value: Any) -> Any:
        return " ".join(value.split()).replace("|", "\\|") if isinstance(value, str) else value

    return table.map(cell)


def _backbone_line(table: pd.DataFrame, paper_backbone: str) -> str:
    """Which backbone's runs a table shows (tables never mix backbones; see selection.runs_for_backbone)."""
    names = table["backbone"].dropna().unique() if "backbone" in table else []
    shown = f"`{names[0]}`" if len(names) else "none (no usable run)"
    return f"Backbone: {shown}; the paper's: {paper_backbone}. Runs of other backbones are not in this table."


def _shown_cells(table: pd.DataFrame, runs: pd.DataFrame) -> pd.DataFrame:
    """The task cells of Table 1 or Table 2 that its Markdown shows (tasks and methods with a run)."""
    if "row" in table:  # Table 1
        tasks, rows = table1_shown(table, runs)
        return table[~table["task"].isin(SUMMARY_COLUMNS) & table["task"].isin(tasks) & table["row"].isin(rows)]
    tasks, methods = table2_shown(table, runs)
    return table[~table["task"].isin(TABLE2_SUMMARY_ROWS) & table["task"].isin(tasks) & table["method"].isin(methods)]


def _missing_line(table: pd.DataFrame, task_column: str, row_column: str, column: str = "measured") -> str:
    """Which shown cells have no usable run (tasks and methods with no run at all are named under the table)."""
    if table.empty:
        return ""
    missing = table[table[column].isna()] if column in table else table
    if missing.empty:
        return "Every cell shown was measured."
    by_row = missing.groupby(row_column, sort=False)[task_column].apply(lambda tasks: ", ".join(tasks))
    return "Not measured (no usable run): " + "; ".join(f"{row}: {tasks}" for row, tasks in by_row.items()) + "."
