"""Where a sweep stands, from its run store alone: what finished and how, what is training now, what
it has cost, and when it should end (`python -m pipelines status`, `make status`).

One recursive listing of `runs/` tells which runs have a record, a lease or a saved state; then only
the current leases and the records not seen by an earlier status on this machine (record_summaries)
are read, concurrently, so a status of paper_full (8,556 runs) takes seconds, not a round trip per run.
"""

from __future__ import annotations

import dataclasses
import re
import time
from typing import Any

import pandas as pd

from adaptune.sweep.lease import lease_number, lease_owner, lease_seconds, renewed_within
from adaptune.sweep.plan import Plan, plan
from adaptune.sweep.spec import ExperimentSpec
from adaptune.sweep.status_cache import record_summaries
from adaptune.sweep.store import RECORD_FILE, RUNS_DIR, STATE_FILE, RunStore
from adaptune.sweep.throughput import accelerator_hours, measure_on
from adaptune.train import phase_times
from adaptune.train.config import method_label
from adaptune.train.record import is_stale

FINISHED = ("ok", "degenerate", "failed")
RUNNING, NOT_STARTED, STALE, UNREADABLE = "running", "not started", "stale", "unreadable"
STATES = (*FINISHED, RUNNING, NOT_STARTED, STALE, UNREADABLE)
# Numbers in a failure reason (a step, a size in GiB) vary from run to run; the reason does not.
_NUMBER = re.compile(r"(?<![\w.])[-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?(?![\w.])")


@dataclasses.dataclass(frozen=True)
class RunningRun:
    run_id: str
    owner: str
    held_s: float | None  # since the attempt took the lease (None: a lease of an older adaptune, or being written)
    renewed_s: float | None  # since its last renewal


@dataclasses.dataclass(frozen=True)
class FailureGroup:
    reason: str  # the one-line reason, its numbers written as "#"
    count: int
    example: str  # one run id with this reason


@dataclasses.dataclass(frozen=True)
class SweepStatus:
    experiment: str
    store: str
    runs: pd.DataFrame  # one row per planned run: run_id, task, method, state (STATES)
    running: list[RunningRun]  # longest held first
    interrupted: int  # not started, but left a saved state or an expired lease: they resume
    failures: list[FailureGroup]  # most common first
    spent_hours: float  # accelerator-hours the records took (wall time x accelerators per run)
    estimated_hours: float  # the plan's whole estimate, from the published table
    remaining_hours: float  # accelerator-hours of the runs not finished, at the observed throughput
    eta_hours: float  # wall-clock hours left with the spec's parallelism, at the observed throughput
    parallelism: int
    estimate_basis: str  # which throughputs remaining_hours and eta_hours used (Plan.estimate_source)
    unreadable: dict[str, str] = dataclasses.field(default_factory=dict)  # run_id -> why its record cannot be read
    # Seconds by phase (adaptune.train.phase_times) over the records that say, a fused group's counted once
    spent_by_phase: dict[str, float] = dataclasses.field(default_factory=dict)

    @property
    def planned(self) -> int:
        return len(self.runs)

    def count(self, *states: str) -> int:
        return int(self.runs["state"].isin(states).sum())

    def by(self, column: str) -> pd.DataFrame:
        """Runs per `column` (task or method) and state, every state a column, a total first."""
        table = pd.crosstab(self.runs[column], self.runs["state"]).reindex(columns=list(STATES), fill_value=0)
        table.insert(0, "planned", table.sum(axis=1))
        order = list(dict.fromkeys(self.runs[column]))  # plan order, not alphabetical
        return table.reindex(order).rename_axis(index=column, columns=None)


def sweep_status(spec: ExperimentSpec, store: RunStore, now: float | None = None) -> SweepStatus:
    """The status of every run `spec` plans, as the store holds it now."""
    now = time.time() if now is None else now
    planned = plan(spec)
    files = store.run_files()
    unreadable: dict[str, str] = {}
    records = record_summaries(store, {run.run_id: files[run.run_id][RECORD_FILE] for run in planned.runs
                                       if RECORD_FILE in files.get(run.run_id, {})}, unreadable)
    lease_files = {run.run_id: number for run in planned.runs if run.run_id not in records and run.run_id not in unreadable
                   and (number := lease_number(files.get(run.run_id, ()))) is not None}
    bad_leases: dict[tuple[str, ...], str] = {}
    leases = {parts[1]: lease for parts, lease in store.files.read_json_many(
        ((RUNS_DIR, run_id, f"lease-{number}.json") for run_id, number in lease_files.items()), bad_leases).items()}
    leases.update({parts[1]: {"unreadable": reason} for parts, reason in bad_leases.items()})
    leases = {run_id: lease if isinstance(lease, dict) else {"unreadable": "not an object"} for run_id, lease in leases.items()}
    written = {parts[1]: stamp for parts, stamp in store.files.modified_times(
        (RUNS_DIR, run_id, f"lease-{number}.json") for run_id, number in lease_files.items() if run_id in leases).items()}

    states, running, interrupted = {}, [], 0
    for run in planned.runs:
        record = records.get(run.run_id)
        if record is not None:
            states[run.run_id] = STALE if is_stale(record) else record.get("status", "failed")
        elif run.run_id in unreadable:
            states[run.run_id] = UNREADABLE
        elif run.run_id in lease_files and (run.run_id not in leases  # vanished meanwhile: being taken or released
                                            or renewed_within(written.get(run.run_id), now, lease_seconds())):
            states[run.run_id] = RUNNING
            running.append(_running(run.run_id, leases.get(run.run_id), written.get(run.run_id), now))
        else:
            states[run.run_id] = NOT_STARTED
            interrupted += run.run_id in lease_files or STATE_FILE in files.get(run.run_id, ())
    runs = pd.DataFrame({"run_id": [run.run_id for run in planned.runs], "task": [run.task for run in planned.runs],
                         "method": [method_label(run.method) for run in planned.runs],
                         "state": [states[run.run_id] for run in planned.runs]})
    return SweepStatus(
        experiment=spec.name, store=store.root, runs=runs,
        running=sorted(running, key=lambda r: -(r.held_s or 0.0)), interrupted=interrupted,
        failures=failure_groups({run_id: record for run_id, record in records.items() if states[run_id] == "failed"}),
        parallelism=spec.parallelism, unreadable=unreadable, **_costs(planned, records, states),
    )


def failure_groups(failed: dict[str, dict[str, Any]]) -> list[FailureGroup]:
    """Failed records grouped by their one-line reason (numbers masked), most common first."""
    groups: dict[str, list[str]] = {}
    for run_id, record in failed.items():
        reason = _NUMBER.sub("#", " ".join(str(record.get("reason") or "(no reason recorded)").split()))
        groups.setdefault(reason, []).append(run_id)
    return [FailureGroup(reason, len(ids), ids[0]) for reason, ids in sorted(groups.items(), key=lambda item: (-len(item[1]), item[0]))]


def _running(run_id: str, lease: dict[str, Any] | None, written: float | None, now: float) -> RunningRun:
    """Renewed: by the store's timestamp of the lease's last write. Held: since the holder's own `acquired_at`,
    the one time only it knows, kept within what its renewals allow (never negative, never before its
    renewal where its clock runs ahead)."""
    lease = lease or {}
    acquired = lease.get("acquired_at")
    acquired = acquired if isinstance(acquired, int | float) and not isinstance(acquired, bool) else None
    renewed = None if written is None else max(now - written, 0.0)
    held = None if acquired is None else max(now - acquired, renewed or 0.0)
    return RunningRun(run_id, lease_owner(lease), held, renewed)


def _costs(planned: Plan, records: dict[str, dict[str, Any]], states: dict[str, str]) -> dict[str, Any]:
    """Spent, estimated and remaining accelerator-hours, and the ETA at the throughput the records show."""
    per_run = max(planned.spec.accelerator.count, 1)
    current = [record for run_id, record in records.items() if states[run_id] != STALE]
    spent = accelerator_hours(current, per_run)
    by_phase = phase_times.summed(current)
    calibrated = planned.calibrated(measure_on(current, planned.spec.accelerator))
    left = {run_id for run_id, state in states.items() if state in (RUNNING, NOT_STARTED, UNREADABLE)}
    return {
        "spent_hours": spent,
        "spent_by_phase": by_phase if sum(by_phase.values()) > 0 else {},
        "estimated_hours": planned.accelerator_hours,
        "remaining_hours": sum(calibrated.run_hours[run_id] for run_id in left) * per_run,
        "eta_hours": calibrated.wall_clock_hours(left) if left else 0.0,
        "estimate_basis": calibrated.estimate_source(),
    }
