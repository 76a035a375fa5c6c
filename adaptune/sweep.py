"""Fan in through the run store: the Figure 6 ablation and the Parquet results of a whole sweep.

Both re-plan the spec (deterministic) and read what the shards left in the store, so nothing that
grows with the number of runs passes between pipeline tasks.
"""

from __future__ import annotations

import os
import traceback
from pathlib import Path
from typing import Any

from adaptune.experiments import ExperimentSpec
from adaptune.plan import plan, select_ablation_runs
from adaptune.records import is_stale
from adaptune.store import ABLATION_DIR, RUNS_DIR, RunStore
from adaptune.tasks import data_scheme


class IncompleteSweepError(RuntimeError):
    """Planned runs have no record in the store: some shard has not finished."""


def sweep_records(spec: ExperimentSpec, store: RunStore) -> list[dict[str, Any]]:
    """The record of every planned run, in plan order; raises when any is missing or stale (made under
    another data scheme: its numbers are not comparable with the others')."""
    planned = plan(spec)
    found = store.records(run.run_id for run in planned.runs)
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


def ablate_sweep(spec: ExperimentSpec, store: RunStore, data_dir: str | os.PathLike[str] | None = None) -> int:
    """Ablate each selected run once (ablation/<run_id>.json in the store); returns how many have rows."""
    if spec.ablation is None:
        return 0
    from adaptune.ablation import ablate
    from adaptune.shards import use_staged_backbones
    from adaptune.store import CHECKPOINT_DIR

    done = 0
    selected = select_ablation_runs(sweep_records(spec, store), spec.ablation)
    use_staged_backbones(store, {record["backbone"] for record in selected})
    for record in selected:
        run_id = record["run_id"]
        if store.read_json(ABLATION_DIR, f"{run_id}.json") is None:
            try:
                with store.local_copy(RUNS_DIR, run_id, CHECKPOINT_DIR) as checkpoint:
                    rows = ablate(checkpoint, data_dir=data_dir, cache_dir=store.cache_dir())
            except Exception:  # noqa: BLE001 -- the ablation table lacks this run; the sweep's results stand
                print(f"ablation of {run_id} failed:\n{traceback.format_exc()}", flush=True)
                continue
            store.write_json(rows, ABLATION_DIR, f"{run_id}.json")
        done += 1
    return done


def aggregate_sweep(spec: ExperimentSpec, store: RunStore, out_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """runs / curves / ablation Parquet for the planned runs; returns counts for the pipeline's metadata."""
    from adaptune.results import write_results

    records = sweep_records(spec, store)
    ablation: list[dict[str, Any]] = []
    if spec.ablation is not None:
        for record in select_ablation_runs(records, spec.ablation):
            ablation += store.read_json(ABLATION_DIR, f"{record['run_id']}.json") or []
    paths = write_results(records, Path(out_dir), ablation=ablation)
    statuses = {status: sum(r["status"] == status for r in records) for status in ("ok", "degenerate", "failed")}
    return {"runs": len(records), "ablation_rows": len(ablation), **statuses, "files": sorted(p.name for p in paths.values())}
