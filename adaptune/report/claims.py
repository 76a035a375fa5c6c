"""A verdict on each of the paper's claims, from a results set.

Every claim is one row of `claims_table` (written as claims.parquet, rendered into report.md): the
measured value, its 95% interval, the threshold and the paper's sentence it comes from (`rule`), and
the one backbone it was measured on (the paper's for that claim where measured, else the most
common; see selection.runs_for_backbone). Scores are in points (percent x 100 of a fraction).

Estimators are the paper's own, shared with the tables that report them (no second copy):

- GLUE (Table 1): per task and method, the single run best on validation over the configuration grid
  x seeds ("re-run 5 times with different random seeds and select the best model on the validation
  set"), scored as Table 1 reports it (test where labelled, else validation): `tables.table1_candidates`
  and `selection.validation_order`, the order `best_by_validation` reads.
- The additional tasks (Table 2: "the model with the best validation set accuracy is chosen. We report
  the mean test accuracy ... across runs with different random seeds") and every figure-based claim
  (Figures 4, 6, 7: points are means over seeds of the best hyperparameters): per task and method (or
  level), the configuration with the best mean validation score, its mean over seeds
  (`selection.best_configuration`'s rule).

One verdict rule for every claim, from the 95% percentile-bootstrap interval of that same estimator
(seeds resampled with replacement per task and method, N_RESAMPLES times, the selection re-applied
inside each resample; the ablation claims resample their ablated runs instead):

- `holds`: the whole interval lies on the claim's side of the threshold;
- `does not hold`: the whole interval lies on the other side;
- `inconclusive`: it straddles the threshold, or there is no interval (one seed), or the runs are too few for the
  interval to be one (bootstrap.too_few: fewer than MIN_SEEDS = 3 seeds in some resampled task and method, or
  ablated runs for the ablation claims, or a single unit with fewer than 4): below that the percentile bounds are
  only the extreme resamples (bootstrap.py counts them), so the row says how many it has, how many a verdict needs,
  and on which side its interval lies;
- `not measured`: no runs to read.

Tasks are not resampled: an interval, and so a verdict, speaks for the tasks a row names (`n_tasks`). Each claim
declares once, in `SCOPES`, the kinds of task it reads (claim_scope.TaskScope): its runs are filtered by that
declaration and its rule names it (`reads`), so a claim over classification tasks never averages a correlation with an
accuracy; only the GLUE claim mixes kinds, as the paper's GLUE score does.

An inconclusive row with an interval gives `seeds_to_settle`, the seeds per task and method that would
shrink the interval clear of the threshold if its width falls as 1/sqrt(seeds):
    seeds_to_settle = ceil(n * (half_width / |estimate - threshold|)^2), at least n + 1,
and, where the runs are too few, at least the seeds the rule needs (bootstrap.seeds_needed),
with n = `n_seeds` (the fewest seeds behind any one task and method) and half_width = (ci_high -
ci_low) / 2. None where the estimate sits on the threshold (no number of seeds settles it) or there
is a single seed (no spread to size it from).

Each row also says what grid it was decided on (`grid`): per method label, the learning rates and epochs of
the finished runs that entered it, and seeds; and what of the paper's grid for that method those runs lack
(`grid_lacks`, `grid_smaller_than_paper`): on GLUE (and the figures' tasks) §3.2's lr {3e-5, 3e-4, 3e-3} x
epochs {3, 20} for every method but full fine-tuning, which follows Devlin et al. (lr {2e-5 .. 5e-5} x 3
epochs); on the additional tasks §3.3's rates at Table 4's epochs; Figure 7's claim only §3.2's epochs at each
rate measured (the paper gives a range of rates). The ablation claims read the runs each ablated run was
picked from. What an experiment itself says it leaves out (ExperimentSpec.grid_left_out, written by the
fan-in as grid_left_out.json) is printed under the claims table.

Every figure in a row's detail names its split (as the data's publisher names it: GLUE's reported split is
its dev set), and the detail ends with how far each method the claim reads stands above the head alone (the
frozen backbone with only its task head trained: `head`), per task, by the claim's own selection and split:
what each method adds to what the backbone gives untuned. Where the head alone learned nothing (at or below the
majority class on a classification task, a correlation <= 0 on a regression task) it is no floor: the detail
says what it scored and how far each method stands above the majority class (or no correlation) instead. Where the
backbone is a sentence encoder and the task a similarity task (zero_shot.py), its zero-shot similarity (mean-pooled
cosine, no training) is a floor too: where it is the highest, the detail names it, what it selected on which split,
and each method's margin from it. A method below the floor it is measured from is said to be below it.

Degenerate runs (one predicted class) are real outcomes and stay in where their table keeps them
(Table 2, the figures); Table 1 and the GLUE claim select among `usable_runs` as the table does.
Failed runs have no score.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from adaptune.data.tasks import UnknownTaskError, get_task
from adaptune.report.baselines import run_baseline
from adaptune.report.bootstrap import (
    BEST_CONFIGURATION,
    BEST_RUN,
    Cell,
    bootstrap_cells,
    bootstrap_ci,
    cells_of,
    unit_sizes,
)
from adaptune.report.claim_grid import figure7_grid, grid_columns, paper_grid
from adaptune.report.claim_scope import TaskScope
from adaptune.report.figures import ablation_metric
from adaptune.report.reference import glue_tasks
from adaptune.report.selection import (
    BERT_BASE,
    base_params,
    publisher_split,
    reported_score,
    runs_for_backbone,
    scored_runs,
    usable_runs,
)
from adaptune.report.separation import claim_note, table2_separation
from adaptune.report.tables import table1_candidates, table2, table2_candidates
from adaptune.report.verdicts import FAILS, HOLDS, INCONCLUSIVE, NOT_MEASURED, TASKS, claim_row, verdict_row
from adaptune.report.zero_shot import run_floor

GLUE_THRESHOLD = 0.4  # "On GLUE, we attain within 0.4% of the performance of full fine-tuning" (abstract)
EXTRA_THRESHOLD = 0.4  # "The performance of adapter-tuning is close to full fine-tuning (0.4% behind)" (§3.3)
FEW_PERCENT = 5.0  # "adding only 3.6% parameters per task" (GLUE); 1.14% (Table 2): a few percent at most
LAYERNORM_GAP = 1.0  # "performs poorly": at least this many points worse (the paper measured ~3.5 on CoLA, ~4 on MNLI)
NEAR_MAJORITY_POINTS = 5.0  # all adapters removed: within this many points of the majority class
LEARNED_POINTS = 5.0  # ...provided the trained model is this far above it (else nothing was there to lose)
SINGLE_LAYER_DROP_PERCENT = 2.0  # the paper: removing one layer's adapters costs at most ~2% (relative)
INIT_STD_LIMIT = 1e-2
INIT_STD_SIZE = 64  # Figure 6 (right): BERT-base, adapter size 64
INIT_STD_TOLERANCE = 1.0  # points between the best and the worst init std <= 1e-2
LR_RANGE = (2e-5, 1e-3)  # Appendix B: "learning rates in the range [2e-5, 1e-3]"
COLUMNS = (
    "claim_id", "claim", "section", "verdict", "measured", "unit", "ci_low", "ci_high", "threshold", "rule", "reads",
    "n_tasks", "n_runs", "n_seeds", "seeds_to_settle", "backbone", "detail", "grid", "grid_lacks", "grid_smaller_than_paper",
)
GRID_LEFT_OUT_FILE = "grid_left_out.json"  # beside runs.parquet: {"experiment": name, "grid_left_out": text}
_CLASSIFICATION = TaskScope(("classification",))  # accuracies, F1 and MCC: never averaged with a correlation
# The tasks each claim reads, by kind: its runs are filtered by it and its rule names it (claim_scope.py).
SCOPES: dict[str, TaskScope] = {
    # Table 1's mean, as the paper's GLUE score: each task's own metric, STS-B's Spearman among the accuracies
    "adapters_glue_within_0.4pt": TaskScope(("classification", "regression"), "glue"),
    "adapters_extra_within_0.4pt": TaskScope(("classification",), "extra"),
    "layernorm_clearly_worse": _CLASSIFICATION,
    "layernorm_worse_than_adapters": _CLASSIFICATION,
    "remove_all_adapters_near_majority": _CLASSIFICATION,
    "remove_one_layer_costs_little": _CLASSIFICATION,
    "lower_layers_matter_less": _CLASSIFICATION,
    "init_std_robust_to_1e-2": _CLASSIFICATION,
    "adapters_robust_to_lr": _CLASSIFICATION,
}


def claims_table(frames: dict[str, pd.DataFrame], reference: dict[str, Any], data_dir: Any = None) -> pd.DataFrame:
    """One row per claim (COLUMNS); `frames` as results.read_results gives them."""
    runs = frames["runs"]
    ablation = frames.get("ablation", pd.DataFrame())
    rows = [
        _glue_within_full(runs, reference, data_dir),
        _extra_within_full(runs, reference, data_dir),
        _layernorm_worse(runs, "full", "layernorm_clearly_worse", "Tuning only the LayerNorm parameters is clearly worse than full fine-tuning",
                         data_dir),
        _layernorm_worse(runs, "adapters", "layernorm_worse_than_adapters", "Tuning only the LayerNorm parameters is clearly worse than adapters",
                         data_dir),
        *_ablation_claims(ablation, runs, data_dir),
        _init_std_robust(runs, data_dir),
        _lr_robust(runs, data_dir),
    ]
    table = pd.DataFrame.from_records(rows, columns=list(COLUMNS))
    return table.astype({"n_seeds": "Int64", "seeds_to_settle": "Int64", "grid_smaller_than_paper": "boolean"})


def claims_markdown(table: pd.DataFrame, grid_left_out: tuple[str, str] | None = None) -> str:
    """The claims table; beneath it, what the experiment says it leaves out of the paper's grid
    (`grid_left_out`: (experiment, text), as read_grid_left_out gives it)."""
    lines = [
        "| claim | verdict | measured | 95% CI | threshold | seeds to settle | backbone | tasks / runs | grid | detail |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in table.itertuples():
        ci = "—" if _missing(row.ci_low) else f"[{row.ci_low:+.2f}, {row.ci_high:+.2f}]"
        measured = "—" if _missing(row.measured) else f"{row.measured:+.2f} {row.unit}"
        counts = "—" if row.verdict == NOT_MEASURED else f"{row.n_tasks} / {row.n_runs}"
        cells = [f"{row.claim} ({row.section}; reads {row.reads})", f"**{row.verdict}**", measured, ci, str(row.threshold), _settle_text(row),
                 "—" if _missing(row.backbone) else str(row.backbone), counts, _grid_cell(row),
                 " ".join(str(row.detail).split()).replace("|", "\\|")]
        lines.append("| " + " | ".join(cells) + " |")
    if grid_left_out and grid_left_out[1]:
        experiment, text = grid_left_out
        lines += ["", f"Left out of the paper's grid, as experiment `{experiment}` says: {' '.join(text.split())}"]
    return "\n".join(lines)


def write_grid_left_out(out_dir: str | Path, experiment: str, text: str) -> Path:
    path = Path(out_dir) / GRID_LEFT_OUT_FILE
    path.write_text(json.dumps({"experiment": experiment, "grid_left_out": text}, indent=2) + "\n", encoding="utf-8")
    return path


def read_grid_left_out(results_dir: str | Path) -> tuple[str, str] | None:
    """(experiment, what it leaves out of the paper's grid), or None where the results set has no such file."""
    path = Path(results_dir) / GRID_LEFT_OUT_FILE
    if not path.is_file():
        return None
    data = json.loads(path.read_text(encoding="utf-8"))
    return data["experiment"], data["grid_left_out"]


def _glue_within_full(runs: pd.DataFrame, reference: dict[str, Any], data_dir: Any = None) -> dict:
    scope = SCOPES["adapters_glue_within_0.4pt"]
    runs = scope.keep(runs)
    row = claim_row("adapters_glue_within_0.4pt", "Adapters come within 0.4 points of full fine-tuning on GLUE, at a few percent of the parameters",
               "abstract, §3.2, Table 1", "points", ">=", -GLUE_THRESHOLD,
               '"On GLUE, we attain within 0.4% of the performance of full fine-tuning, adding only 3.6% parameters per task" '
               f"(abstract; §3.2, Table 1: 80.0 vs 80.4). Measured: mean over {TASKS} of (adapters - full fine-tuning) in each task's "
               "own metric, as the paper's GLUE score averages them, each "
               "Table 1's cell: the single run best on validation over the configuration grid x seeds (\"re-run 5 times with "
               "different random seeds and select the best model on the validation set\"), scored as Table 1 reports it (test "
               f"where labelled, else validation); the adapters must also train <= {FEW_PERCENT:g}% of the backbone's parameters",
               scope)
    candidates, backbone = table1_candidates(runs, reference)
    return _versus_full(row, runs, candidates, backbone, BEST_RUN, glue_tasks(reference), data_dir)


def _extra_within_full(runs: pd.DataFrame, reference: dict[str, Any], data_dir: Any = None) -> dict:
    scope = SCOPES["adapters_extra_within_0.4pt"]
    runs = scope.keep(runs)
    row = claim_row("adapters_extra_within_0.4pt",
               "Adapters come within 0.4 points of full fine-tuning on the additional tasks, at a few percent of the parameters",
               "§3.3, Table 2", "points", ">=", -EXTRA_THRESHOLD,
               '"The performance of adapter-tuning is close to full fine-tuning (0.4% behind)" (§3.3). Measured: mean over the '
               f"{TASKS} of (adapters - full fine-tuning), each Table 2's cell: the configuration best on mean validation "
               "score, its mean test score over seeds (\"the model with the best validation set accuracy is chosen. We report the "
               f"mean test accuracy ... across runs with different random seeds\"); the adapters must also train <= {FEW_PERCENT:g}% "
               "of the backbone's parameters", scope)
    candidates, backbone = table2_candidates(runs, reference)
    result = _versus_full(row, runs, candidates, backbone, BEST_CONFIGURATION, None, data_dir)
    return _named_tasks(result, runs, reference, data_dir)


def _named_tasks(result: dict, runs: pd.DataFrame, reference: dict[str, Any], data_dir: Any) -> dict:
    """The additional-tasks row with the tasks it speaks for named, and those that do not separate the methods (separation.py)."""
    if result["verdict"] == NOT_MEASURED:
        return result
    cells = table2(runs, reference, data_dir)
    note = claim_note(cells, table2_separation(cells))
    return {**result, "detail": f"{note}; {result['detail']}" if note else result["detail"]}


def _versus_full(row: dict, runs: pd.DataFrame, candidates: pd.DataFrame, backbone: str | None, rule: str, tasks: list[str] | None,
                 data_dir: Any = None) -> dict:
    score, split = reported_score(candidates)
    candidates = candidates.assign(score=100.0 * score, split=split)
    pairs = _pairs(candidates, "adapters", "full", rule)
    if not pairs:
        return {**row, "detail": "needs, on some task, both a full fine-tuning and an adapters run with a score"}
    if tasks is not None:  # Table 1's task order
        pairs = sorted(pairs, key=lambda pair: tasks.index(pair[0].key[0]))
    result = _judged(row, pairs, _mean_difference)
    base = base_params(runs).get(backbone) if backbone is not None else None
    trained = pd.concat([cell.chosen() for cell, _ in pairs])["trained_params"]  # as the table's trained % reads them
    percent = 100.0 * float(trained.mean()) / base if base and trained.notna().any() else None
    share = f"adapters train {percent:.2f}% of the backbone" if percent is not None else "adapters' trained share unknown"
    why = result["detail"]
    if percent is not None and percent > FEW_PERCENT:  # the other half of the claim: no number of seeds changes it
        result.update(verdict=FAILS, seeds_to_settle=None)
        why = f"; more than {FEW_PERCENT:g}% is not a few percent, whatever the scores"
    elif percent is None and result["verdict"] == HOLDS:
        result["verdict"], why = INCONCLUSIVE, "; without the adapters' trained share there is no verdict"
    head = _above_head(candidates, [cell.key[0] for cell, _ in pairs], ["adapters", "full"], rule, data_dir)
    return {**result, **grid_columns(_pair_runs(pairs), paper_grid), "backbone": backbone,
            "detail": f"{_per_task(pairs, 'adapters', 'full')}; {share}{why}; {head}"}


def _layernorm_worse(runs: pd.DataFrame, other: str, claim_id: str, claim: str, data_dir: Any = None) -> dict:
    scope = SCOPES[claim_id]
    row = claim_row(claim_id, claim, "§2.1, §3.4, Figure 4", "points", "<", -LAYERNORM_GAP,
               '"training the layer normalization parameters alone is insufficient for good performance" (§2.1); "this strategy '
               'performs poorly: performance decreases by approximately 3.5% on CoLA and 4% on MNLI" (§3.4). Measured: mean over '
               f"{TASKS} of (LayerNorm-only - {_NAMES[other]}), each the configuration best on mean validation score, "
               f"its mean validation score over seeds (Figure 4's points); the paper gives no threshold: clearly worse is read as more "
               f"than {LAYERNORM_GAP:g} point below", scope)
    classification = scope.keep(scored_runs(runs))
    candidates, backbone = runs_for_backbone(classification[classification["method"].isin([other, "layernorm"])], BERT_BASE)
    pairs = _pairs(_on_validation(candidates), "layernorm", other, BEST_CONFIGURATION)
    if not pairs:
        return {**row, "detail": f"needs, on some task, both {_NAMES[other]} and LayerNorm-only runs with a score"}
    result = _judged(row, pairs, _mean_difference)
    degenerate = sum(int((cell.chosen()["status"] == "degenerate").sum()) for cell, _ in pairs)
    kept = f"; {degenerate} LayerNorm-only run(s) degenerate (kept)" if degenerate else ""
    head = _above_head(_on_validation(_of_backbone(classification, backbone)), [cell.key[0] for cell, _ in pairs],
                       ["layernorm", other], BEST_CONFIGURATION, data_dir)
    return {**result, **grid_columns(_pair_runs(pairs), paper_grid), "backbone": backbone,
            "detail": f"{_per_task(pairs, 'LayerNorm-only', _NAMES[other])}{kept}{result['detail']}; {head}"}


_NAMES = {"full": "full fine-tuning", "adapters": "adapters", "layernorm": "LayerNorm-only", "head": "the head alone"}


def _on_validation(runs: pd.DataFrame) -> pd.DataFrame:
    """Runs scored, for a claim that reads validation, in points: `score` and its `split`."""
    return runs.assign(score=100.0 * runs["val_score"], split="validation")


def _of_backbone(runs: pd.DataFrame, backbone: str | None) -> pd.DataFrame:
    return runs[runs["backbone"].astype(str) == str(backbone)]


def _above_head(pool: pd.DataFrame, tasks: list[str], methods: list[str], rule: str, data_dir: Any = None) -> str:
    """How far each method stands above the highest floor on each of `tasks`, its cells chosen by `rule` from `pool`
    (runs with `score` in points and its `split`: the claim's own selection and split). The floors: the head alone
    (where measured), the majority class (a correlation of 0 on a regression task) and, for a sentence encoder on a
    similarity task, the backbone's zero-shot similarity (zero_shot.py). Where the head alone is the highest, each
    method's margin above it; where it learned nothing (_head_floor) it is named as no floor, with what it scored and
    each method's margin above the majority class instead; where the zero-shot similarity is the highest, it is named,
    with each method's margin from it. A method below the floor it is measured from is said to be below it."""
    pool = pool[pool["task"].isin(tasks) & pool["method"].isin([*methods, "head"])]
    cells = cells_of(pool, ["task", "method"], rule)
    above, no_floor, zero_shot = [], [], []
    for task in sorted(dict.fromkeys(tasks)):
        present = [method for method in ("head", *methods) if (task, method) in cells]
        if not present:
            continue
        any_cell = cells[(task, present[0])]
        split = _cell_split(any_cell)
        scores = [(_NAMES.get(method, method), _measured(cells[(task, method)])) for method in methods if (task, method) in cells]
        floor, floor_name = _head_floor(any_cell, data_dir)
        head = cells.get((task, "head"))
        head_score = _measured(head) if head is not None else None
        similarity = _zero_shot(any_cell, data_dir)
        if similarity is not None and similarity[0] >= max(value for value in (head_score, floor, -np.inf) if value is not None):
            value, selected = similarity
            beneath = [f"{name} {score:.2f}" for name, score in (("the head alone (frozen backbone, trained head)", head_score),
                                                               (floor_name, floor)) if score is not None]
            zero_shot.append(f"on {task} ({split}) the highest floor is {ZERO_SHOT_NAME} ({value:.2f}; {selected})"
                             + (f", higher than {' and '.join(beneath)}" if beneath else "")
                             + f"; from it: {_margins(scores, value, ZERO_SHOT_NAME)}")
        elif head is None or head_score is None:
            continue
        elif floor is not None and head_score <= floor:
            no_floor.append(f"on {task} ({split}) the head alone (frozen backbone, trained head) scored {head_score:.2f}, at or below "
                            f"{floor_name} ({floor:.2f}): it learned nothing and is no floor; from {floor_name}: "
                            f"{_margins(scores, floor, floor_name)}")
        else:
            above.append(f"{task} ({split}; head alone {head_score:.2f}): {_margins(scores, head_score, 'the head alone')}")
    if not (above or no_floor or zero_shot):
        return "the head alone (frozen backbone, trained head) not measured on these tasks"
    lead = ["each method's margin over the head alone (frozen backbone, trained head), by the same selection: " + "; ".join(above)] if above else []
    return "; ".join(lead + no_floor + zero_shot)


ZERO_SHOT_NAME = "the zero-shot similarity floor (frozen backbone, mean-pooled cosine)"


def _margins(scores: list[tuple[str, float]], floor: float, floor_name: str) -> str:
    """'name +m, ...' from `floor`; the methods below it named as such after them."""
    margins = ", ".join(f"{name} {score - floor:+.2f}" for name, score in scores)
    below = [name for name, score in scores if score < floor]
    return margins + (f" ({', '.join(below)} below {floor_name})" if below else "")


def _zero_shot(cell: Cell, data_dir: Any) -> tuple[float, str] | None:
    """The backbone's zero-shot similarity floor on the cell's task, split and subsets, in points, and what it selected
    on which split; None where it does not apply or cannot be computed (zero_shot.py)."""
    run = cell.chosen().iloc[0]
    floor = run_floor(str(cell.key[0]), run, str(run["split"]), data_dir)
    value = None if floor is None else floor.metrics.get(str(run["primary_metric"]))
    return None if floor is None or value is None else (100.0 * float(value), floor.selected())


def _head_floor(head: Cell, data_dir: Any) -> tuple[float | None, str]:
    """What the head alone must beat to have learned anything, in points: a correlation of 0 on a regression task,
    the majority class (on the head's runs' split and rows) on a classification task; (None, "") where unknown
    (no local data for the baseline, or a task not in the registry)."""
    try:
        kind = get_task(str(head.key[0])).kind
    except UnknownTaskError:
        return None, ""
    if kind == "regression":
        return 0.0, "no correlation"
    if kind != "classification":
        return None, ""
    run = head.chosen().iloc[0]
    majority = run_baseline(str(head.key[0]), run, str(run["primary_metric"]), str(run["split"]), data_dir)
    return majority, "the majority class"


def _measured(cell: Cell) -> float:
    """A cell's value on its runs as they are (every seed drawn once)."""
    seeds = np.array(sorted(set(cell.runs["seed"])))
    return float(cell.values(seeds, np.ones((1, len(seeds))))[0])


def _pairs(candidates: pd.DataFrame, a: str, b: str, rule: str) -> list[tuple[Cell, Cell]]:
    """Per task with both methods: (method a's cell, method b's cell)."""
    cells = cells_of(candidates, ["task", "method"], rule)
    return [(cells[(task, a)], cells[(task, b)]) for task in sorted({key[0] for key in cells}) if (task, a) in cells and (task, b) in cells]


def _pair_runs(pairs: list[tuple[Cell, Cell]]) -> pd.DataFrame:
    """The candidate runs behind the pairs' cells (method a's first)."""
    return pd.concat([cell.runs for cell, _ in pairs] + [cell.runs for _, cell in pairs])


def _mean_difference(values: np.ndarray) -> np.ndarray:
    """Columns: a's cells then b's, one pair per task: the mean over tasks of a - b."""
    n = values.shape[-1] // 2
    return (values[..., :n] - values[..., n:]).mean(axis=-1)


def _per_task(pairs: list[tuple[Cell, Cell]], a: str, b: str) -> str:
    """Per task, a - b with both values, each task's split named (the runs' own: test where labelled, or validation)."""
    text = ", ".join(f"{cell_a.key[0]} ({_cell_split(cell_a)}) {cell_a.estimate - cell_b.estimate:+.2f} "
                     f"({cell_a.estimate:.2f} vs {cell_b.estimate:.2f})" for cell_a, cell_b in pairs)
    return f"per task, {a} - {b}: {text}"


def _cell_split(cell: Cell) -> str:
    return publisher_split(str(cell.key[0]), str(cell.chosen()["split"].iloc[0]))


def _judged(row: dict, pairs: list[tuple[Cell, Cell]], statistic: Callable[[np.ndarray], np.ndarray]) -> dict:
    cells = [cell for cell, _ in pairs] + [cell for _, cell in pairs]
    estimate, low, high, n_seeds = bootstrap_cells(cells, statistic)
    return verdict_row(row, estimate, low, high, n_seeds, unit_sizes(cells), n_tasks=len(pairs),
                        n_runs=sum(len(cell.runs) for cell in cells))


def _ablation_claims(ablation: pd.DataFrame, runs: pd.DataFrame, data_dir: Any) -> list[dict]:
    near, single, lower = _ablation_rows()
    scope = SCOPES["remove_all_adapters_near_majority"]  # the three read the same ablated runs
    ablation, runs = scope.keep(ablation), scope.keep(runs)
    if ablation.empty:
        why = "no ablation rows in this results set"
        return [{**near, "detail": why}, {**single, "detail": why}, {**lower, "detail": why}]
    known = runs.drop_duplicates("run_id").set_index("run_id")
    ablation = ablation.assign(backbone=ablation["run_id"].map(known["backbone"]).fillna("(run not in results)"))
    ablation, backbone = runs_for_backbone(ablation, BERT_BASE)
    readings = _AblationReadings()
    for run_id, rows in ablation.groupby("run_id"):
        readings.read(run_id, rows, known, data_dir)
    common = {"backbone": backbone, "n_runs": ablation["run_id"].nunique(), "n_tasks": ablation["task"].nunique()}
    head = _above_head(_on_validation(_of_backbone(scored_runs(runs), backbone)), sorted(set(ablation["task"])), ["adapters"],
                       BEST_CONFIGURATION, data_dir)
    spans = "no single-layer or half-depth spans in the ablation"
    return [_ablation_verdict(row, values, notes, readings, runs, run_ids, common, head, missing) for row, values, notes, run_ids, missing in (
        (near, [g for g, _ in readings.gaps], [text for _, text in readings.gaps], readings.run_ids["near"], "no span with every layer's adapters off"),
        (single, readings.largest, [], readings.run_ids["single"], spans), (lower, readings.halves, [], readings.run_ids["lower"], spans))]


def _ablation_rows() -> tuple[dict, dict, dict]:
    """The three Figure 6 claims, unmeasured: all adapters off, one layer's off, the lower half's against the upper's."""
    paper = "(§3.6, Figure 6; the interval resamples the ablated runs, so `seeds_to_settle` counts ablated runs)"
    scope = SCOPES["remove_all_adapters_near_majority"]
    assert scope == SCOPES["remove_one_layer_costs_little"] == SCOPES["lower_layers_matter_less"], "one ablation, one scope"
    near = claim_row("remove_all_adapters_near_majority", "Removing every layer's adapters drops the trained model to near the majority class",
                "§3.6, Figure 6", "points", "<=", NEAR_MAJORITY_POINTS,
                '"when all of the adapters are removed from the network, the performance drops substantially: to 37% on MNLI and '
                f'69% on CoLA - scores attained by predicting the majority class" {paper}. Measured: mean over ablated runs on '
                f"{TASKS} of (validation score with all adapters off - majority-class baseline); runs whose trained model is within "
                f"{LEARNED_POINTS:g} points of the majority class are left out: they had nothing to lose", scope)
    single = claim_row("remove_one_layer_costs_little", "Removing one layer's adapters costs little", "§3.6, Figure 6", "% (relative)",
                  "<=", SINGLE_LAYER_DROP_PERCENT,
                  '"removing any single layer\'s adapters has only a small impact on performance ... largest performance drop is 2%" '
                  f"{paper}. Measured: mean over ablated runs on {TASKS} of the largest relative drop from switching off a single "
                  f"layer's adapters; runs that learned nothing (within {LEARNED_POINTS:g} points of the majority class) are left out",
                  scope)
    lower = claim_row("lower_layers_matter_less", "Adapters in lower layers matter less than in higher layers", "§3.6, Figure 6",
                 "% (relative)", ">", 0.0,
                 '"adapters on the lower layers have a smaller impact than the higher-layers" '
                 f"{paper}. Measured: mean over ablated runs on {TASKS} of (relative drop with the upper half's adapters off - drop "
                 f"with the lower half's off); runs that learned nothing (within {LEARNED_POINTS:g} points of the majority class) are "
                 "left out", scope)
    return near, single, lower


@dataclasses.dataclass
class _AblationReadings:
    """What the ablated runs give each Figure 6 claim, run by run, and the runs each claim reads."""

    gaps: list[tuple[float, str]] = dataclasses.field(default_factory=list)  # all off - majority, and its note
    skipped: list[str] = dataclasses.field(default_factory=list)
    largest: list[float] = dataclasses.field(default_factory=list)  # the largest single-layer drop
    halves: list[float] = dataclasses.field(default_factory=list)  # upper half's drop - lower half's
    metrics: set[str] = dataclasses.field(default_factory=set)
    run_ids: dict[str, list[str]] = dataclasses.field(default_factory=lambda: {"near": [], "single": [], "lower": []})

    def read(self, run_id: str, rows: pd.DataFrame, known: pd.DataFrame, data_dir: Any) -> None:
        metric = ablation_metric(rows)
        self.metrics.add(metric)
        rows = rows[rows["metric"] == metric].set_index(["first_layer", "last_layer"])
        layers = int(max(rows.index.get_level_values(0).max(), rows.index.get_level_values(1).max())) + 1
        if (0, layers - 1) in rows.index and run_id in known.index:
            majority = run_baseline(rows["task"].iloc[0], known.loc[run_id], metric, "validation", data_dir)
            all_off, trained = rows.loc[(0, layers - 1), "value"], rows.loc[(0, layers - 1), "baseline_value"]
            if majority is None or pd.isna(all_off) or pd.isna(trained):
                self.skipped.append(f"{run_id}: no majority baseline (data not in the local mirror)")
            elif 100.0 * trained - majority < LEARNED_POINTS:
                # A model that learned nothing has nothing for its adapters to carry: no claim about them reads it.
                self.skipped.append(f"{run_id}: trained model {100 * trained:.1f} is within {LEARNED_POINTS:g} points of the majority {majority:.1f}")
                return
            else:
                self.gaps.append((100.0 * all_off - majority, f"{rows['task'].iloc[0]}: all off "
                                  f"{100 * all_off:.1f}, trained {100 * trained:.1f}, majority {majority:.1f}"))
                self.run_ids["near"].append(run_id)
        drop = lambda first, last: -100.0 * rows.loc[(first, last), "relative_change"]  # noqa: E731  (relative %, positive = worse)
        single_drops = [drop(i, i) for i in range(layers) if (i, i) in rows.index and pd.notna(rows.loc[(i, i), "relative_change"])]
        if single_drops:
            self.largest.append(max(single_drops))
            self.run_ids["single"].append(run_id)
        half = layers // 2
        if half and (0, half - 1) in rows.index and (half, layers - 1) in rows.index:
            self.halves.append(drop(half, layers - 1) - drop(0, half - 1))
            self.run_ids["lower"].append(run_id)


def _ablation_verdict(row: dict, values: list[float], notes: list[str], readings: _AblationReadings, runs: pd.DataFrame,
                      run_ids: list[str], common: dict, head: str, missing: str) -> dict:
    """One Figure 6 claim over the ablated runs' values (bootstrapped over runs), or why it has none."""
    if not values:
        return {**row, **common, "detail": "; ".join(readings.skipped) or missing}
    ablated = np.array(values, dtype=float)
    low, high = bootstrap_ci([ablated], lambda m: m[..., 0])
    judged = verdict_row(row, float(ablated.mean()), low, high, len(ablated), [len(ablated)], unit=("ablated run", "ablated runs"),
                          n_tasks=common["n_tasks"], n_runs=len(values))
    per_run = notes if notes else ["per run: " + ", ".join(f"{v:+.2f}" for v in values)]
    metric_note = f"metric: {', '.join(sorted(readings.metrics))}, on validation"
    return {**judged, **grid_columns(_ablation_pool(runs, run_ids), paper_grid), "backbone": common["backbone"],
            "detail": "; ".join([metric_note, *per_run, *readings.skipped]) + judged["detail"] + f"; {head}"}


def _ablation_pool(runs: pd.DataFrame, run_ids: list[str]) -> pd.DataFrame:
    """The runs each ablated run was picked from: its task, method and backbone (fan_in.select_ablation_runs)."""
    usable = usable_runs(runs)
    keys = usable.loc[usable["run_id"].isin(run_ids), ["task", "method_json", "backbone"]].drop_duplicates()
    return usable.merge(keys, on=["task", "method_json", "backbone"])


def _init_std_robust(runs: pd.DataFrame, data_dir: Any = None) -> dict:
    scope = SCOPES["init_std_robust_to_1e-2"]
    runs = scope.keep(runs)
    row = claim_row("init_std_robust_to_1e-2", "Adapters are robust to the init std up to 1e-2", "§3.6, Figure 6", "points",
               ">=", -INIT_STD_TOLERANCE,
               '"on both datasets, the performance of adapters is robust for standard deviations below 10^-2" (§3.6; Figure 6: '
               f"BERT-base, adapter size 64). Measured on adapters of size {INIT_STD_SIZE} only: mean over {TASKS} of (worst - best) "
               f"among init stds <= {INIT_STD_LIMIT:g} of the mean validation score over seeds, each std at its best configuration "
               f"(learning rate, epochs); the paper gives no tolerance: robust is read as within {INIT_STD_TOLERANCE:g} point", scope)
    candidates = scored_runs(runs)
    candidates = candidates[(candidates["method"] == "adapters") & (candidates["adapter_size"] == INIT_STD_SIZE) & candidates["init_std"].notna()]
    candidates, backbone = runs_for_backbone(candidates, BERT_BASE)
    small = candidates[candidates["init_std"] <= INIT_STD_LIMIT * (1 + 1e-9)]
    groups = _levels(small, "init_std")
    if not groups:
        stds = sorted(candidates["init_std"].unique()) if not candidates.empty else []
        return {**row, "detail": f"needs a task with size-{INIT_STD_SIZE} adapter runs at two or more init stds <= {INIT_STD_LIMIT:g} "
                f"(measured stds: {', '.join(f'{s:g}' for s in stds) or 'none'})"}
    cells = [cell for levels in groups.values() for cell in levels]
    sizes = [len(levels) for levels in groups.values()]
    estimate, low, high, n_seeds = bootstrap_cells(cells, lambda values: _block_spreads(values, sizes).mean(axis=-1))
    judged = verdict_row(row, estimate, low, high, n_seeds, unit_sizes(cells), n_tasks=len(groups),
                          n_runs=sum(len(cell.runs) for cell in cells))
    detail = "on validation, " + "; ".join(f"{task}: " + ", ".join(f"std {cell.key[2]:g} {cell.estimate:.2f}" for cell in levels)
                                             for task, levels in groups.items())
    heads = _of_backbone(scored_runs(runs), backbone)
    head = _above_head(_on_validation(pd.concat([small, heads[heads["method"] == "head"]])), list(groups), ["adapters"], BEST_CONFIGURATION,
                       data_dir)
    return {**judged, **grid_columns(pd.concat([cell.runs for cell in cells]), paper_grid), "backbone": backbone,
            "detail": detail + judged["detail"] + f"; {head}"}


def _lr_robust(runs: pd.DataFrame, data_dir: Any = None) -> dict:
    low_lr, high_lr = LR_RANGE
    scope = SCOPES["adapters_robust_to_lr"]
    runs = scope.keep(runs)
    row = claim_row("adapters_robust_to_lr", "Adapters are at least as robust to the learning rate as full fine-tuning", "Appendix B, Figure 7",
               "points", ">=", 0.0,
               '"We test the robustness of adapters and fine-tuning to the learning rate. We ran experiments with learning rates in '
               'the range [2e-5, 1e-3], and selected the best hyperparameters for each method at each learning rate" (Appendix B). '
               f"Measured on runs at learning rates in [{low_lr:g}, {high_lr:g}] only: mean over {TASKS} of (adapters' worst - best) - "
               "(full fine-tuning's worst - best) mean validation score over seeds, across the learning rates both methods were run "
               "at, each at its best other hyperparameters (adapter size, epochs)", scope)
    candidates = scored_runs(runs)
    in_range = candidates["lr"].between(low_lr * (1 - 1e-9), high_lr * (1 + 1e-9))
    candidates, backbone = runs_for_backbone(candidates[candidates["method"].isin(["adapters", "full"]) & in_range], BERT_BASE)
    adapters = _levels(candidates[candidates["method"] == "adapters"], "lr")
    full = _levels(candidates[candidates["method"] == "full"], "lr")
    tasks = []
    for task in sorted(set(adapters) & set(full)):
        common = sorted({cell.key[2] for cell in adapters[task]} & {cell.key[2] for cell in full[task]})
        if len(common) >= 2:
            tasks.append((task, [c for c in adapters[task] if c.key[2] in common], [c for c in full[task] if c.key[2] in common], common))
    if not tasks:
        return {**row, "detail": f"needs a task with adapters and full fine-tuning runs at the same two or more learning rates in "
                f"[{low_lr:g}, {high_lr:g}]"}
    cells = [cell for _, a, f, _ in tasks for cell in (*a, *f)]
    sizes = [len(levels) for _, a, f, _ in tasks for levels in (a, f)]

    def statistic(values: np.ndarray) -> np.ndarray:  # per task: adapters' spread - full fine-tuning's
        spreads = _block_spreads(values, sizes)
        return (spreads[..., 0::2] - spreads[..., 1::2]).mean(axis=-1)

    estimate, low, high, n_seeds = bootstrap_cells(cells, statistic)
    judged = verdict_row(row, estimate, low, high, n_seeds, unit_sizes(cells), n_tasks=len(tasks),
                          n_runs=sum(len(cell.runs) for cell in cells))
    detail = "; ".join(f"{task}: lrs {', '.join(f'{lr:g}' for lr in lrs)}" for task, _, _, lrs in tasks)
    heads = _of_backbone(scored_runs(runs), backbone)
    head = _above_head(_on_validation(pd.concat([candidates, heads[heads["method"] == "head"]])), [task for task, *_ in tasks],
                       ["adapters", "full"], BEST_CONFIGURATION, data_dir)
    return {**judged, **grid_columns(pd.concat([cell.runs for cell in cells]), figure7_grid), "backbone": backbone,
            "detail": detail + judged["detail"] + f"; {head}"}


def _levels(runs: pd.DataFrame, column: str) -> dict[str, list[Cell]]:
    """Per task with >= 2 values of `column`: one best-configuration cell (validation, points) per value."""
    cells = cells_of(runs.assign(score=100.0 * runs["val_score"]), ["task", "method", column], BEST_CONFIGURATION)
    by_task: dict[str, list[Cell]] = {}
    for key, cell in cells.items():
        by_task.setdefault(key[0], []).append(cell)
    return {task: levels for task, levels in by_task.items() if len(levels) >= 2}


def _block_spreads(values: np.ndarray, sizes: list[int]) -> np.ndarray:
    """Per consecutive block of cells (`sizes` cells each): worst - best value."""
    starts = np.cumsum([0, *sizes])
    return np.stack([values[..., a:b].min(axis=-1) - values[..., a:b].max(axis=-1) for a, b in zip(starts, starts[1:])], axis=-1)


def _grid_cell(row: Any) -> str:
    if _missing(row.grid):
        return "—"
    mark = f" — **smaller than the paper's**: {row.grid_lacks}" if row.grid_lacks else ""
    return f"{row.grid}{mark}".replace("|", "\\|")


def _settle_text(row: Any) -> str:
    if row.verdict != INCONCLUSIVE:
        return "—"
    if not _missing(row.seeds_to_settle):
        return f"{int(row.seeds_to_settle)} (now {int(row.n_seeds)})"
    return "≥ 2 (one seed: no interval)" if _missing(row.ci_low) else "— (estimate on the threshold)"


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and np.isnan(value)) or value is pd.NA
