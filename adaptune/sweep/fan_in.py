"""Fan in through the run store: the Figure 6 ablation and the Parquet results of a whole sweep, or of
the part of it that has finished (a partial report while it runs).

Both re-plan the spec (deterministic) and read what the shards left in the store, so nothing that
grows with the number of runs passes between pipeline tasks.
"""

from __future__ import annotations

import os
import traceback
from collections import Counter
from pathlib import Path
from typing import Any

from adaptune.core.errors import UserError
from adaptune.data.tasks import data_scheme, get_task
from adaptune.sweep.console_metrics import sweep_metrics
from adaptune.sweep.lease import remove_litter
from adaptune.sweep.plan import Plan, plan
from adaptune.sweep.spec import Ablation, ExperimentSpec
from adaptune.sweep.store import ABLATION_DIR, RUNS_DIR, RunStore
from adaptune.train.record import is_stale


class IncompleteSweepError(UserError, RuntimeError):
    """Planned runs have no record in the store: some shard has not finished."""


def sweep_records(spec: ExperimentSpec, store: RunStore, planned: Plan | None = None) -> list[dict[str, Any]]:
    """The record of every planned run, in plan order; raises when any is missing or stale (made under
    another data scheme: its numbers are not comparable with the others'). `planned`: plan(spec), if at hand."""
    planned = planned or plan(spec)
    unreadable: dict[str, str] = {}
    found = store.records([run.run_id for run in planned.runs], unreadable=unreadable)
    if unreadable:
        run_id, reason = next(iter(unreadable.items()))
        raise IncompleteSweepError(f"{len(unreadable)} of {len(planned.runs)} planned runs have a record that cannot be read "
                                   f"(e.g. {reason}): retrain them with --retry-unreadable (RETRY_UNREADABLE=1), which keeps the file aside")
    missing = [run.run_id for run in planned.runs if run.run_id not in found]
    if missing:
        raise IncompleteSweepError(
            f"{len(missing)} of {len(planned.runs)} planned runs have no record in {store.root} (e.g. {missing[0]}): "
            "resubmit the experiment; finished runs are reused"
        )
    stale = [run.run_id for run in planned.runs if is_stale(found[run.run_id])]
    if stale:
        example = found[stale[0]]
        raise IncompleteSweepError(
            f"{len(stale)} of {len(planned.runs)} planned runs hold records from another data scheme in {store.root} "
            f"(e.g. {stale[0]}: {example.get('data_scheme') or 'none recorded'}, now {data_scheme(example['task'])}): "
            "retrain them with --retrain-stale (make run|submit ... RETRAIN_STALE=1)"
        )
    return [found[run.run_id] for run in planned.runs]


def finished_records(spec: ExperimentSpec, store: RunStore, planned: Plan | None = None) -> list[dict[str, Any]]:
    """The records of the planned runs that have finished so far, in plan order; stale ones (another
    data scheme) are left out. One listing of the store, then only the records that exist are read."""
    planned = planned or plan(spec)
    return current_records(store, [run.run_id for run in planned.runs])


def current_records(store: RunStore, run_ids: list[str] | None = None) -> list[dict[str, Any]]:
    """The records of these runs (None: every run in the store) that exist, in that order, stale ones
    (another data scheme) left out."""
    return [record for record in store.records(run_ids).values() if not is_stale(record)]


def select_ablation_runs(records: list[dict[str, Any]], ablation: Ablation) -> list[dict[str, Any]]:
    """Per ablation task (in the ablation's order), the finished run of its method (and backbone, where
    it names one) that Table 1's rule picks: report.selection.best_by_validation, ties to the smallest
    run id, the same rule the tables, the claims and the bundle read."""
    import pandas as pd

    from adaptune.model.methods import method_from_dict
    from adaptune.report.results import run_row
    from adaptune.report.selection import best_by_validation, usable_runs

    method = method_from_dict(dict(ablation.method)).to_dict()
    tasks = [get_task(name).name for name in ablation.tasks]
    candidates = {
        record["run_id"]: record for record in records
        if record["task"] in tasks and method_from_dict(dict(record["method"])).to_dict() == method
        and (ablation.backbone is None or record.get("backbone") == ablation.backbone)
    }
    if not candidates:
        return []
    best = best_by_validation(usable_runs(pd.DataFrame.from_records([run_row(record) for record in candidates.values()])), ["task"])
    chosen = dict(zip(best["task"], best["run_id"]))
    return [candidates[chosen[task]] for task in tasks if task in chosen]


def ablate_sweep(spec: ExperimentSpec, store: RunStore, data_dir: str | os.PathLike[str] | None = None) -> int:
    """Ablate each selected run once (ablation/<run_id>.json in the store); returns how many have rows."""
    if spec.ablation is None:
        return 0
    from adaptune.sweep.data_prep import readable_data_dir
    from adaptune.sweep.machine import use_staged_backbones
    from adaptune.sweep.store import CHECKPOINT_DIR
    from adaptune.train.ablation import ablate

    done = 0
    selected = select_ablation_runs(sweep_records(spec, store), spec.ablation)
    use_staged_backbones(store, {record["backbone"] for record in selected})
    data_dir = readable_data_dir(store, data_dir, {record["task"] for record in selected}) if selected else None
    for record in selected:
        run_id = record["run_id"]
        if store.files.read_json(ABLATION_DIR, f"{run_id}.json") is None:
            try:
                with store.files.local_copy(RUNS_DIR, run_id, CHECKPOINT_DIR) as checkpoint:
                    rows = ablate(checkpoint, data_dir=data_dir, cache_dir=store.cache_dir())
            except Exception:  # noqa: BLE001 -- the ablation table lacks this run; the sweep's results stand
                print(f"ablation of {run_id} failed:\n{traceback.format_exc()}", flush=True)
                continue
            store.files.write_json(rows, ABLATION_DIR, f"{run_id}.json")
        done += 1
    return done


def aggregate_sweep(spec: ExperimentSpec, store: RunStore, out_dir: str | os.PathLike[str], partial: bool = False) -> dict[str, Any]:
    """runs / curves / ablation Parquet, coverage.json and grid_left_out.json for the planned runs; returns counts for the
    pipeline's metadata. With `partial`, whatever has finished so far (the report says what is missing);
    without, every planned run must have its record (IncompleteSweepError)."""
    from adaptune.report.claims import write_grid_left_out
    from adaptune.report.partial import write_coverage
    from adaptune.report.results import write_results

    planned = plan(spec)
    store.require_existing()
    records = (finished_records if partial else sweep_records)(spec, store, planned)
    remove_litter(store, store.run_files(), records)
    if not records:
        raise IncompleteSweepError(f"no planned run of {spec.name!r} has finished yet in {store.root}: nothing to report")
    ablation: list[dict[str, Any]] = []
    if spec.ablation is not None:
        for record in select_ablation_runs(records, spec.ablation):
            ablation += store.files.read_json(ABLATION_DIR, f"{record['run_id']}.json") or []
    paths = write_results(records, Path(out_dir), ablation=ablation)
    write_coverage(Path(out_dir), Counter(run.task for run in planned.runs), Counter(record["task"] for record in records))
    write_grid_left_out(Path(out_dir), spec.name, spec.grid_left_out)  # the report prints it beside the claims
    statuses = {status: sum(r["status"] == status for r in records) for status in ("ok", "degenerate", "failed")}
    return {"planned": len(planned.runs), "runs": len(records), "ablation_rows": len(ablation), **statuses,
            "files": sorted(p.name for p in paths.values()),
            "metrics": sweep_metrics(records, len(planned.runs), spec.accelerator.count)}
