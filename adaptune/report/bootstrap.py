"""The seed bootstrap of a claim's estimator: the runs behind each value (`Cell`), resampled by seed.

A cell's value is read from its runs by the tables' own selection (BEST_RUN: Table 1's single run best on
validation; BEST_CONFIGURATION: Table 2's and the figures' configuration best on mean validation score);
`bootstrap_cells` redraws the seeds of each (task, method) N_RESAMPLES times, re-applying that selection
inside each resample, and gives the CI_LEVEL percentile interval of a statistic over the cells.

How much an interval can say depends on how many seeds each resampling unit has. n seeds drawn n times with
replacement give C(2n - 1, n) distinct resamples (multisets): 3 at n = 2, 10 at 3, 35 at 4, 126 at 5; a
best-run cell (Table 1) reads only the n seeds' own scores. The resample that draws one seed n times, the
most extreme, has probability n^-n: 1/4 at n = 2, 1/27 (3.7%) at 3, 1/256 (0.4%) at 4. A percentile bound sits
on that extreme whenever its probability, across all the units a statistic reads, exceeds the tail
(1 - CI_LEVEL) / 2 = 2.5%: with 2 seeds in each of two units (one method minus another on one task) the
extreme pairing has 1/16 = 6.25%, so the "95% interval" is exactly (a's worst - b's best, a's best - b's
worst), the range, not an interval. `too_few` is the rule a verdict is held to (MIN_SEEDS per unit, and
the extreme resample rarer than the tail); `seeds_needed` the seeds per unit that meet it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import numpy as np
import pandas as pd

from adaptune.report.selection import (
    best_by_validation,
    best_configuration,
    validation_order,
    with_config_key,
)

N_RESAMPLES = 2000
CI_LEVEL = 0.95
MIN_SEEDS = 3  # per resampling unit: 2 give 3 distinct resamples, whose extremes (1/4 each) are the percentile bounds
BEST_RUN, BEST_CONFIGURATION = "best run", "best configuration"


@dataclasses.dataclass
class Cell:
    """The candidate runs behind one value of a claim (configurations x seeds of one task and method,
    or of one level of a sweep), in validation order, and how that value is read from them."""

    key: tuple
    unit: tuple  # the resampling unit: (task, method); its seeds are drawn once for all its cells
    runs: pd.DataFrame  # columns seed, val_score, score (points), config_key; validation_order
    rule: str  # BEST_RUN (Table 1) or BEST_CONFIGURATION (Table 2, the figures)
    estimate: float = math.nan  # the value on the runs as they are (set by bootstrap_cells)

    def chosen(self) -> pd.DataFrame:
        """The runs the value reads as measured, picked by the tables' own selection functions."""
        if self.rule == BEST_RUN:
            return best_by_validation(self.runs, ["task"])
        return self.runs[self.runs["run_id"].isin(best_configuration(self.runs, ["task"])["run_ids"].iloc[0].split(","))]

    def values(self, seeds: np.ndarray, counts: np.ndarray) -> np.ndarray:
        """The cell's value for each row of `counts` (resamples x seeds: how often each seed was drawn)."""
        drawn = counts[:, np.searchsorted(seeds, self.runs["seed"].to_numpy())]  # resamples x runs
        score = self.runs["score"].to_numpy(float)
        if self.rule == BEST_RUN:  # runs are in validation order: the first drawn one is best_by_validation's pick
            first = (drawn > 0).argmax(axis=1)
            return np.where((drawn > 0).any(axis=1), score[first], np.nan)
        codes, _ = pd.factorize(self.runs["config_key"], sort=True)  # ties go to the smallest config_key, as best_configuration's
        onehot = np.eye(codes.max() + 1)[codes]
        total = drawn @ onehot
        with np.errstate(invalid="ignore", divide="ignore"):
            val_mean = np.where(total > 0, (drawn * self.runs["val_score"].to_numpy(float)) @ onehot / total, -np.inf)
            score_mean = (drawn * score) @ onehot / total
        picked = score_mean[np.arange(len(counts)), val_mean.argmax(axis=1)]
        return np.where(total.any(axis=1), picked, np.nan)


def cells_of(candidates: pd.DataFrame, keys: list[str], rule: str) -> dict[tuple, Cell]:
    """One Cell per group of `keys` (which start with task and method, the resampling unit)."""
    if candidates.empty:
        return {}
    ordered = validation_order(with_config_key(candidates) if rule == BEST_CONFIGURATION else candidates)
    return {key: Cell(key, key[:2], runs, rule) for key, runs in ordered.groupby(keys, sort=True)}


def bootstrap_cells(cells: list[Cell], statistic: Callable[[np.ndarray], np.ndarray], seed: int = 0
                    ) -> tuple[float, float | None, float | None, int]:
    """statistic over the cells' values, on the runs as they are and on N_RESAMPLES seed resamples:
    (estimate, interval low, interval high, fewest seeds in a resampling unit). No interval when
    every unit has a single seed. Sets each cell's `estimate`."""
    rng = np.random.default_rng(seed)
    draws = {}
    for unit, seeds in _unit_seeds(cells).items():
        picked = rng.integers(0, len(seeds), size=(N_RESAMPLES, len(seeds)))
        counts = np.vstack([np.ones(len(seeds)), (picked[..., None] == np.arange(len(seeds))).sum(axis=1)])  # row 0: as measured
        draws[unit] = (seeds, counts)
    values = np.stack([cell.values(*draws[cell.unit]) for cell in cells], axis=-1)
    for cell, value in zip(cells, values[0]):
        cell.estimate = float(value)
    statistics = statistic(values)
    n_seeds = min(len(seeds) for seeds, _ in draws.values())
    if all(len(seeds) < 2 for seeds, _ in draws.values()):
        return float(statistics[0]), None, None, n_seeds
    low, high = _percentiles(statistics[1:])
    return float(statistics[0]), low, high, n_seeds


def unit_sizes(cells: list[Cell]) -> list[int]:
    """The seeds of each resampling unit the cells read (one entry per unit), as bootstrap_cells draws them."""
    return [len(seeds) for seeds in _unit_seeds(cells).values()]


def _unit_seeds(cells: list[Cell]) -> dict[tuple, np.ndarray]:
    return {unit: np.array(sorted(set().union(*(cell.runs["seed"] for cell in cells if cell.unit == unit))))
            for unit in dict.fromkeys(cell.unit for cell in cells)}


def extreme_share(sizes: list[int]) -> float:
    """The probability of the most extreme resample: every unit (of `sizes` seeds) drawing one seed each time."""
    return math.prod(float(n) ** -n for n in sizes)


def too_few(sizes: list[int]) -> bool:
    """Whether units of these sizes are too few for a percentile interval to carry a verdict: a unit with
    fewer than MIN_SEEDS seeds, or an extreme resample (extreme_share) at least as likely as the tail, so that a
    bound is that extreme (one unit alone at 3 seeds: 1/27 = 3.7% > 2.5%)."""
    return bool(sizes) and (min(sizes) < MIN_SEEDS or extreme_share(sizes) >= (1 - CI_LEVEL) / 2)


def seeds_needed(sizes: list[int]) -> int:
    """The fewest seeds per unit, with as many units, that too_few accepts (3; 4 for a single unit)."""
    n = MIN_SEEDS
    while too_few([n] * max(len(sizes), 1)):
        n += 1
    return n


def rule_text() -> str:
    """The rule too_few applies, in a sentence (the report states it once)."""
    return (f"at least {MIN_SEEDS} seeds per resampled task and method (ablated runs, for the ablation claims), and the "
            f"most extreme resample (every unit drawing one seed n times: probability n^-n per unit) rarer than the "
            f"{100 * (1 - CI_LEVEL) / 2:g}% tail, so that a single unit needs {seeds_needed([MIN_SEEDS])}: below that the "
            "percentile bounds are at or near the extreme resamples (2 seeds give 3 distinct resamples, the extremes 1/4 each: "
            "one method minus another on one task then has exactly the extreme pairings as its bounds)")


def bootstrap_ci(samples: list[np.ndarray], statistic: Callable[[np.ndarray], np.ndarray], seed: int = 0) -> tuple[float | None, float | None]:
    """Percentile bootstrap interval (CI_LEVEL) of statistic(group means), each group's values
    resampled with replacement independently; (None, None) when no group has two values.

    `statistic` takes an array (..., n_groups) of group means and reduces the last axis."""
    if not samples or all(len(s) < 2 for s in samples):
        return None, None
    rng = np.random.default_rng(seed)
    means = np.stack([s[rng.integers(0, len(s), size=(N_RESAMPLES, len(s)))].mean(axis=1) for s in samples], axis=-1)
    return _percentiles(statistic(means))


def _percentiles(values: np.ndarray) -> tuple[float | None, float | None]:
    values = values[~np.isnan(values)]  # a resample that drew no seed of some cell has no value
    if not len(values):
        return None, None
    tail = 100.0 * (1 - CI_LEVEL) / 2
    return float(np.percentile(values, tail)), float(np.percentile(values, 100 - tail))
