"""The verdict rule every claim shares (adaptune.report.claims' docstring says it in words): the outcomes, where an
interval lies against a threshold, how many seeds would settle an inconclusive one, and a claim's row with its verdict."""

from __future__ import annotations

import math
import operator
from collections.abc import Callable

from adaptune.report.bootstrap import seeds_needed, too_few
from adaptune.report.claim_scope import TaskScope

HOLDS, FAILS, INCONCLUSIVE, NOT_MEASURED = "holds", "does not hold", "inconclusive", "not measured"
SIDES: dict[str, Callable[[float, float], bool]] = {">=": operator.ge, ">": operator.gt, "<=": operator.le, "<": operator.lt}


def judge(low: float | None, high: float | None, side: str, threshold: float) -> str:
    """The verdict rule every claim shares: where the interval lies against the threshold."""
    if low is None or high is None:
        return INCONCLUSIVE
    on_side = SIDES[side]
    if on_side(low, threshold) and on_side(high, threshold):
        return HOLDS
    if not on_side(low, threshold) and not on_side(high, threshold):
        return FAILS
    return INCONCLUSIVE


def seeds_to_settle(estimate: float, low: float | None, high: float | None, threshold: float, n_seeds: int) -> int | None:
    """ceil(n * (half-width / |estimate - threshold|)^2), at least n + 1 (adaptune.report.claims' docstring); None when unsizeable."""
    distance = abs(estimate - threshold)
    if low is None or high is None or distance == 0:
        return None
    return max(n_seeds + 1, math.ceil(n_seeds * ((high - low) / 2 / distance) ** 2))


TASKS = "{tasks}"  # where a rule names the tasks it reads: filled in from the claim's TaskScope


def claim_row(claim_id: str, claim: str, section: str, unit: str, side: str, threshold: float, rule: str, scope: TaskScope) -> dict:
    """A claim's row, not yet measured; `rule` names the tasks it reads as TASKS, which `scope` (the same object that
    filters the claim's runs) fills in."""
    if TASKS not in rule:
        raise ValueError(f"claim {claim_id}'s rule must name the tasks it reads as {TASKS}")
    return {"claim_id": claim_id, "claim": claim, "section": section, "verdict": NOT_MEASURED, "measured": None, "unit": unit,
            "ci_low": None, "ci_high": None, "threshold": f"{side} {threshold:g}", "rule": rule.replace(TASKS, scope.words),
            "reads": scope.words, "n_tasks": 0, "n_runs": 0,
            "n_seeds": None, "seeds_to_settle": None, "backbone": None, "detail": "", "grid": None, "grid_lacks": None,
            "grid_smaller_than_paper": None}


UNIT = ("seed per task and method", "seeds per task and method")


def verdict_row(row: dict, estimate: float, low: float | None, high: float | None, n_seeds: int, sizes: list[int],
                 unit: tuple[str, str] = UNIT, **counts: int) -> dict:
    """The row with its measurement and the shared verdict; `detail` ends with why an inconclusive row is one
    (`sizes`: the seeds of each unit the bootstrap resampled, held to bootstrap.too_few; `unit`: what it
    resamples, one and many, for that sentence)."""
    side, threshold = row["threshold"].split()
    threshold = float(threshold)
    verdict = judge(low, high, side, threshold)
    settle = seeds_to_settle(estimate, low, high, threshold, n_seeds) if verdict == INCONCLUSIVE else None
    why = ""
    if low is not None and too_few(sizes):  # an interval that is only its extreme resamples decides nothing
        needed = seeds_needed(sizes)
        where = {HOLDS: "lies wholly on the claim's side (direction consistent)", FAILS: "lies wholly on the other side",
                 INCONCLUSIVE: f"straddles {threshold:+g}"}[verdict]
        why = (f"; {n_seeds} {unit[1] if n_seeds != 1 else unit[0]}: too few to judge (a verdict needs {needed}; {n_seeds} give "
               f"{math.comb(2 * n_seeds - 1, n_seeds)} distinct resamples, each extreme one with probability 1/{n_seeds ** n_seeds}); "
               f"the interval {where}")
        verdict, settle = INCONCLUSIVE, max(needed, settle or 0)
    elif verdict == INCONCLUSIVE:
        why = (f"; one {unit[0]}: no interval, so no verdict (2 or more needed)" if low is None
               else f"; the interval straddles {threshold:+g}" + (f": about {settle} would settle it (now {n_seeds})" if settle else
                                                                  ": the estimate sits on the threshold"))
    return {**row, **counts, "verdict": verdict, "measured": estimate, "ci_low": low, "ci_high": high, "n_seeds": n_seeds,
            "seeds_to_settle": settle, "detail": why}
