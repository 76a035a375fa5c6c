"""Which of Table 2's tasks separate the methods from what an untrained backbone already gets.

A task whose floor, the higher of its majority class and the head alone (the frozen backbone with a trained head, as a
probe), stands within SEPARATION_POINTS of every trained method's score cannot tell the methods apart: whatever the
claim reads there is the floor's ceiling, not a method's doing (SMS spam on MiniLM: every method near 98.6, its
majority class 86.9, the head alone about as high as the others). `table2_separation` reads Table 2's own cells (each
method's configuration best on mean validation, its mean test score over seeds), so it says this of the same numbers
the table and the claim show.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from adaptune.report.tables import TABLE2_SUMMARY_ROWS

SEPARATION_POINTS = 1.0
# The trained methods of Table 2 (the head alone is a floor, not one of them), with the names the line gives them.
TRAINED_METHODS = {"full": "full fine-tuning", "top_k": "variable fine-tuning", "adapters": "adapters", "layernorm": "LayerNorm-only"}
COLUMNS = ("task", "floor", "floor_name", "majority", "head", "methods", "largest_margin", "separates")


def table2_separation(table: pd.DataFrame) -> pd.DataFrame:
    """Per task of `table` (tables.table2) with a trained method and a floor measured: the floor (`floor_name`: "the
    majority class" or "the head alone"), each trained method's margin above it (`methods`, text), the largest margin in
    absolute value, and `separates`: whether some trained method stands more than SEPARATION_POINTS from the floor."""
    cells = _task_cells(table)
    records = []
    for task, rows in cells.groupby("task", sort=False):
        by_method = rows.set_index("method")["measured_mean"]
        trained = {method: float(by_method[method]) for method in TRAINED_METHODS if method in by_method.index}
        majority = _first(rows["majority"]) if "majority" in rows else None  # on the measured runs' own subsets
        head = float(by_method["head"]) if "head" in by_method.index else None
        floors = [(value, name) for value, name in ((majority, "the majority class"), (head, "the head alone")) if value is not None]
        if not trained or not floors:
            continue
        floor, floor_name = max(floors)
        margins = {method: score - floor for method, score in trained.items()}
        largest = max(margins.values(), key=abs)
        records.append({"task": task, "floor": floor, "floor_name": floor_name, "majority": majority, "head": head,
                        "methods": ", ".join(f"{TRAINED_METHODS[m]} {margin:+.1f}" for m, margin in margins.items()),
                        "largest_margin": largest, "separates": abs(largest) > SEPARATION_POINTS})
    return pd.DataFrame.from_records(records, columns=list(COLUMNS))


def separation_line(separation: pd.DataFrame) -> str:
    """One sentence under Table 2: the tasks that do not separate the methods, each with its floor and margins
    ("" when no task has both a floor and a trained method)."""
    if separation.empty:
        return ""
    flat = separation[~separation["separates"].astype(bool)]
    if flat.empty:
        return (f"Every task shown separates the methods: on each, some trained method stands more than "
                f"{SEPARATION_POINTS:g} point from its floor (the higher of the majority class and the head alone).")
    named = "; ".join(f"{row.task} ({row.floor_name} {row.floor:.1f}: {row.methods})" for row in flat.itertuples())
    return (f"**Does not separate the methods** ({len(flat)} of {len(separation)} tasks: the floor, the higher of the majority "
            f"class and the head alone, within {SEPARATION_POINTS:g} point of every trained method, so the methods' difference "
            f"there is not the methods'): {named}.")


def flat_tasks(separation: pd.DataFrame, tasks: list[str] | None = None) -> list[str]:
    """The tasks (of `tasks`, where given) that do not separate the methods."""
    flat = separation.loc[~separation["separates"].astype(bool), "task"].tolist() if not separation.empty else []
    return [task for task in flat if tasks is None or task in tasks]


def _task_cells(table: pd.DataFrame) -> pd.DataFrame:
    """Table 2's measured cells of tasks (not its summary rows)."""
    if "measured_mean" not in table:
        return table.iloc[:0]
    return table[table["measured_mean"].notna() & ~table["task"].isin(TABLE2_SUMMARY_ROWS)]


def _first(values: pd.Series) -> Any:
    present = values.dropna()
    return float(present.iloc[0]) if not present.empty else None


def claim_note(table: pd.DataFrame, separation: pd.DataFrame) -> str:
    """For the additional-tasks claim: the tasks it was decided on (both adapters and full fine-tuning measured in
    Table 2), by name, and those of them that do not separate the methods ("" when there are none)."""
    cells = _task_cells(table)
    both = [task for task, rows in cells.groupby("task", sort=False) if {"adapters", "full"} <= set(rows["method"])]
    if not both:
        return ""
    flat = flat_tasks(separation, both)
    return (f"decided on {len(both)} task(s): {', '.join(both)}"
            + (f"; of them, {', '.join(flat)} do(es) not separate the methods (the floor within {SEPARATION_POINTS:g} point of "
               "every trained method)" if flat else ""))
