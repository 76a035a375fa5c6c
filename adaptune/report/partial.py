"""A report over a sweep still under way: which tables, figures and claims read runs not all finished.

`aggregate` writes coverage.json beside runs.parquet: per trained task, the runs planned and the runs
finished (ok, degenerate or failed, in the current data scheme). Each table, figure and claim reads
a set of tasks (its scope); where some of their planned runs have not finished, it says
"partial: N of M runs". A results directory without coverage.json (written by hand, or by an older
adaptune) is reported as complete.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from adaptune.data.tasks import UnknownTaskError, get_task
from adaptune.report.reference import extra_tasks, glue_tasks

COVERAGE_FILE = "coverage.json"
COMPLETE = "complete"


@dataclasses.dataclass(frozen=True)
class Coverage:
    planned: dict[str, int]  # trained task -> runs planned
    finished: dict[str, int]  # trained task -> runs finished

    def counts(self, tasks: Iterable[str] | None = None) -> tuple[int, int]:
        """(finished, planned) over the planned runs of `tasks` (None: every task)."""
        scope = set(self.planned) if tasks is None else {_trained_as(task) for task in tasks}
        return (sum(self.finished.get(task, 0) for task in scope & set(self.planned)),
                sum(self.planned[task] for task in scope & set(self.planned)))

    def pending(self, tasks: Iterable[str]) -> set[str]:
        """Those of `tasks` with planned runs not all finished (runs of theirs are still to come)."""
        return {task for task in tasks if self.finished.get(_trained_as(task), 0) < self.planned.get(_trained_as(task), 0)}

    def note(self, tasks: Iterable[str] | None = None) -> str | None:
        """"partial: N of M runs" where some planned run of `tasks` has not finished, else None."""
        finished, planned = self.counts(tasks)
        return f"partial: {finished:,} of {planned:,} runs" if finished < planned else None


def write_coverage(out_dir: str | Path, planned: Mapping[str, int], finished: Mapping[str, int]) -> Path:
    path = Path(out_dir) / COVERAGE_FILE
    path.write_text(json.dumps({"planned": dict(planned), "finished": dict(finished)}, indent=2, sort_keys=True) + "\n")
    return path


def read_coverage(results_dir: str | Path) -> Coverage | None:
    path = Path(results_dir) / COVERAGE_FILE
    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    return Coverage(planned=dict(data["planned"]), finished=dict(data["finished"]))


def _trained_as(task: str) -> str:
    """mnli_mm is scored by mnli_m's runs: its coverage is theirs."""
    try:
        found = get_task(task)
    except UnknownTaskError:
        return task
    return found.trained_as or found.name


def table_scopes(reference: dict[str, Any], tasks: Iterable[str]) -> dict[str, list[str] | None]:
    """The tasks each table and figure reads (None: the whole sweep)."""
    glue, extra = glue_tasks(reference), extra_tasks(reference)
    classification = [task for task in tasks if not task.startswith("squad")]
    return {
        "table1": glue, "table2": extra, "adapter_sizes": glue, "methods": classification, "excluded_runs": None,
        "figure3_tradeoff": glue + extra, "figure4_per_task": classification, "figure5_squad": ["squad"],
    }


# Claims whose tasks are known by their id (adaptune/report/claims.py); any other claim is held to the
# whole sweep, so a claim added or renamed there is marked partial rather than wrongly complete.
CLAIM_SUITES = {"adapters_glue_within_0.4pt": "glue", "adapters_extra_within_0.4pt": "extra"}


def mark_claims(claims: pd.DataFrame, coverage: Coverage | None, reference: dict[str, Any]) -> pd.DataFrame:
    """The claims table with a `coverage` column: "complete", or "partial: N of M runs" for a claim
    whose runs have not all finished."""
    suites = {"glue": glue_tasks(reference), "extra": extra_tasks(reference)}
    notes = [None if coverage is None else coverage.note(suites.get(CLAIM_SUITES.get(claim_id, ""))) for claim_id in claims["claim_id"]]
    return claims.assign(coverage=[note or COMPLETE for note in notes])


def claims_for_markdown(marked: pd.DataFrame) -> pd.DataFrame:
    """A copy whose claim text ends in its partial note, so the rendered claims table shows it."""
    partial = marked["coverage"] != COMPLETE
    claims = marked["claim"].where(~partial, marked["claim"] + " — *" + marked["coverage"] + "*")
    return marked.assign(claim=claims)
