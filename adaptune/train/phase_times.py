"""Where a run's wall time goes, by phase, for its record's `time_s`: so a slow shard says whether its hours
went to training steps or to what surrounds them (loading, evaluation, saving state), which a fused group's
step figures cannot show (a group's step gains far more over one run's than its shard does: bench/LOG.md).

- "setup": from the start of an attempt to its first step: data, tokenizer, model, grouping, resuming;
- "steps": the training steps, their finiteness checks included (Progress.train_time_s: on a GPU the checks
  wait for the device, so its queued work is counted here);
- "evaluation": scoring validation, test and companion splits;
- "saving": resume states and the final checkpoint.
A fused group's runs each record the group's times (as their wall_time_s is the group's). Kept in Progress,
so a resumed run adds its attempts' phases as it adds their wall time.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence
from typing import Any

from adaptune.train.record import group_size

PHASES = ("setup", "steps", "evaluation", "saving")
TIMED_PHASES = ("setup", "evaluation", "saving")  # "steps" is Progress.train_time_s


@contextlib.contextmanager
def timed(progresses: Sequence[Any], phase: str) -> Iterator[None]:
    """Add the block's wall time to `phase` of every Progress given (a group's runs share the block)."""
    if phase not in TIMED_PHASES:
        raise ValueError(f"unknown phase {phase!r}: one of {', '.join(TIMED_PHASES)}")
    started = time.perf_counter()
    try:
        yield
    finally:
        add(progresses, phase, time.perf_counter() - started)


def add(progresses: Sequence[Any], phase: str, seconds: float) -> None:
    for progress in progresses:
        progress.phase_s[phase] = progress.phase_s.get(phase, 0.0) + seconds


def recorded(progress: Any) -> dict[str, float]:
    """The record's `time_s`: seconds per phase (PHASES), over every attempt up to now."""
    return {phase: round(progress.train_time_s if phase == "steps" else progress.phase_s.get(phase, 0.0), 3) for phase in PHASES}


def summed(records: Sequence[dict[str, Any]], field: str = "time_s") -> dict[str, float]:
    """A group-shared record field's values ({name: number}: time_s, step_graphs) summed over these runs' records,
    each fused group's once: its k records each carry the group's, so each counts 1/k (a run that left its group
    early carries less: a slight undercount)."""
    totals: dict[str, float] = {}
    for record in records:
        for name, value in (record.get(field) or {}).items():
            totals[name] = totals.get(name, 0.0) + value / group_size(record)
    return {name: round(value, 1) for name, value in totals.items()}
