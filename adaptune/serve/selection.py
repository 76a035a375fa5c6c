"""Which run of each task goes into a bundle: the report's own choice, read straight from a run store.

The rule is that of the table the task belongs to (adaptune.report.tables), among usable runs (status ok, a
validation score) of one backbone. Table 1 (GLUE, and any task not in Table 2): per task the single run best on
validation (`best_by_validation`), over every size, learning rate, epoch count and seed the store holds for the
method. Table 2 (the additional tasks): the configuration with the best mean validation score over seeds
(`best_configuration`), whose mean test score over those seeds is what Table 2 reports; a folder holds one model, so
that configuration's seed best on validation (`table`, `config_mean`, `config_sem`, `config_seeds` say so). So for
the adapters or full fine-tuning method, a bundle holds runs of exactly the cells the report's tables show.
"""

from __future__ import annotations

import os
from collections import Counter

import pandas as pd

from adaptune.core.errors import UserError
from adaptune.data.tasks import get_task
from adaptune.report.results import run_row
from adaptune.report.selection import BERT_LARGE, best_by_validation, best_configuration, runs_for_backbone, usable_runs
from adaptune.sweep.store import RECORD_FILE, RUNS_DIR, RunStore

SELECT_RULES = ("best",)  # the single run best on validation per task (Table 1)
DEFAULT_METHOD = "adapters"  # the paper's 1.3x is about adapters (best size per task, Table 1)


class SelectionError(UserError, ValueError):
    """No run (or not every named task) can be selected; the message says what the store holds."""


def store_runs(store: RunStore) -> pd.DataFrame:
    """Every current run record in the store as runs.parquet rows (stale records, made under another
    data scheme, left out as the report leaves them). MNLI-mm companion rows are not made: the MNLI
    run is its model."""
    from adaptune.sweep.fan_in import current_records

    records = current_records(store.require_existing())
    # None current: say "no records" only where there are none at all (a store of stale ones is reported by select_runs).
    if not records and not any(RECORD_FILE in names for names in store.run_files().values()):
        raise SelectionError(f"no run records under {store.files.url(RUNS_DIR)}: pass the run store root (the directory holding "
                             f"{RUNS_DIR}/<run_id>/{RECORD_FILE}), e.g. the --runs-root a sweep ran with")
    return pd.DataFrame.from_records([run_row(record) for record in records])


def select_runs(
    runs: pd.DataFrame, method: str = DEFAULT_METHOD, tasks: list[str] | None = None, backbone: str | None = None,
    where: str | os.PathLike[str] = "the run store",
) -> pd.DataFrame:
    """One run per task, Table 1's rule. `method` matches a method name (adapters: any size) or a
    method label (adapters64); `tasks` restricts (every named task must be found); `backbone` fixes the
    backbone (adding to a bundle), else Table 1's choice of one backbone (BERT-large where measured)."""
    wanted = [get_task(task).name for task in tasks] if tasks else None
    if runs.empty:
        raise SelectionError(_nothing_selected(runs, method, wanted, backbone, where))
    candidates = usable_runs(runs)
    candidates = candidates[(candidates["method"] == method) | (candidates["method_label"] == method)]
    if wanted:
        candidates = candidates[candidates["task"].isin(wanted)]
    if backbone is not None:
        candidates = candidates[candidates["backbone"] == backbone]
    candidates, _ = runs_for_backbone(candidates, BERT_LARGE)
    if candidates.empty:
        raise SelectionError(_nothing_selected(runs, method, wanted, backbone, where))
    chosen = _by_table(candidates)
    missing = sorted(set(wanted or ()) - set(chosen["task"]))
    if missing:
        raise SelectionError(f"no usable {method} run for task(s) {missing} in {where} (found for {sorted(chosen['task'])}); "
                             "leave them out of --tasks, or train them first")
    return chosen.reset_index(drop=True)


def table_of(task: str) -> str:
    """The report's table a task's cell is in: "Table 2" for the additional tasks, else "Table 1"."""
    return "Table 2" if get_task(task).family == "extra" else "Table 1"


def _by_table(candidates: pd.DataFrame) -> pd.DataFrame:
    """Per task, the run its table's rule selects (the module's docstring), with `table` and, for Table 2, the
    configuration's mean and s.e.m. of the reported score over its seeds."""
    in_table2 = candidates["task"].map(lambda task: table_of(task) == "Table 2").astype(bool)
    chosen = [best_by_validation(candidates[~in_table2], ["task"]).assign(table="Table 1")]
    for config in best_configuration(candidates[in_table2], ["task"]).itertuples() if in_table2.any() else ():
        seeds = candidates[candidates["run_id"].isin(config.run_ids.split(","))]
        chosen.append(best_by_validation(seeds, ["task"]).assign(table="Table 2", config_mean=config.reported_mean,
                                                                  config_sem=config.reported_sem, config_seeds=config.n_seeds))
    return pd.concat(chosen, ignore_index=True)


def _nothing_selected(runs: pd.DataFrame, method: str, tasks: list[str] | None, backbone: str | None, where: object) -> str:
    scope = f"{method!r}" + (f" for task(s) {tasks}" if tasks else "") + (f" on backbone {backbone!r}" if backbone else "")
    if runs.empty:
        return f"no usable run of method {scope} in {where}: it holds no current run records"
    statuses = dict(Counter(runs["status"]))
    methods = sorted(set(runs["method"]) | set(runs["method_label"].dropna()))
    return (f"no usable run (status ok, with a validation score) of method {scope} among the {len(runs)} runs in {where} "
            f"(statuses {statuses}; methods and labels {methods}; tasks {sorted(set(runs['task']))})")
