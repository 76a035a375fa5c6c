"""The bodies of the pipeline's lightweight components: parse inputs, call adaptune, write artifacts.

KFP ships each function's source alone into its container, so every body imports what it needs
and calls no helper of this module. No `from __future__ import annotations` here: KFP reads the
annotations (Output[Dataset], List[str]) as real types to build the component interface.

Every input is small and bounded: the experiment spec as compact JSON (a few KB, whatever the
number of runs), a shard id, the run store's root. Components re-plan the spec (deterministic) to
find their runs, and fan in by reading the run store.
"""

from typing import Dict, List, NamedTuple

from kfp.dsl import Artifact, Dataset, Input, Markdown, Metrics, Output


def plan_shards(spec_json: str, compiled_shape: str, prepared: str) -> List[Dict[str, str]]:
    """Validate the spec and return its shards (what the DAG fans out over): each shard's id and the prepared data.

    `compiled_shape` is the accelerator and parallelism the DAG was compiled with: a spec edited in
    the console may change its grid, not the DAG's resources. `prepared` (prepare_data's output) travels in each
    item because kfp.local gives a task in a ParallelFor the loop's item for any other task's output it takes
    (kfp 2.17, local/orchestrator/task_spec_utils.create_parameter_loop_iteration_task_spec).
    """
    import json

    from adaptune.sweep.plan import plan
    from adaptune.sweep.spec_file import spec_from_dict

    spec = spec_from_dict(json.loads(spec_json))
    shape = json.loads(compiled_shape)
    actual = {"accelerator": spec.accelerator.label, "count": spec.accelerator.count, "parallelism": spec.parallelism}
    if actual != shape:
        raise ValueError(f"the spec asks for {actual} but this pipeline was compiled for {shape}: "
                         "compile and submit the edited spec (make submit PIPELINE=path/to/sweep.yaml)")
    planned = plan(spec)
    print(planned.summary())
    return [{"shard": shard.id, "data": prepared} for shard in planned.shards]


def prepare_data(spec_json: str, runs_root: str, data_dir: str, data_summary: Output[Metrics],
                 data_table: Output[Markdown]) -> NamedTuple("Outputs", [("prepared", str)]):  # type: ignore[valid-type]
    """Every task the plan reads, read once from `data_dir` (a mirror; empty: the one staged in the run store, else the
    hub), checked, split and tokenized into the run store; returns the prepared folder, the heavy steps' data dir.
    A task that cannot be prepared stops the pipeline here, before any accelerator is asked for: one line per task.
    The output has a name of its own, not "Output" as plan_shards'."""
    import json

    from adaptune.sweep.data_prep import data_needs, prepare_plan_data, source_data_dir
    from adaptune.sweep.plan import plan
    from adaptune.sweep.spec_file import spec_from_dict
    from adaptune.sweep.store import RunStore

    store = RunStore(runs_root)
    planned = plan(spec_from_dict(json.loads(spec_json)))
    prepared = prepare_plan_data(planned, store, source_data_dir(store, data_dir, set(data_needs(planned))))
    for entry in prepared.tasks:  # rows per split per task, where the console shows the step's metrics
        for split, rows in entry.rows.items():
            data_summary.log_metric(f"{entry.task}.{split}", rows)
    with open(data_table.path, "w") as handle:
        handle.write(prepared.markdown())
    print(f"prepared data: {prepared.url}")
    return (prepared.url,)


def train_shard(spec_json: str, shard_id: str, runs_root: str, data_dir: str, retry_failed: bool, retrain_stale: bool,
                retry_unreadable: bool, shard_summary: Output[Metrics]) -> str:
    """Train the shard's runs that the run store has no record of; returns a one-line summary, and logs
    its counts (reused, ok, degenerate, failed, stale, unreadable, superseded, lost) as Metrics the console shows per task.

    Transient failures (out of memory, network, storage) are retried inside, with backoff; every other
    failure is a failed record and the shard goes on. The task ends itself past its deadline
    (adaptune.sweep.plan.Plan.deadline_hours), so that a hung shard stops holding an accelerator.
    """
    import json

    from adaptune.sweep.retrain import RetrainPolicy
    from adaptune.sweep.shard_runner import run_shard
    from adaptune.sweep.spec_file import spec_from_dict
    from adaptune.sweep.store import RunStore

    policy = RetrainPolicy.from_flags(retry_failed, retrain_stale, retry_unreadable)  # the pipeline's parameters, as one policy
    outcomes = run_shard(spec_from_dict(json.loads(spec_json)), shard_id, RunStore(runs_root), data_dir=data_dir or None,
                         policy=policy, enforce_deadline=True)
    summary = ", ".join(f"{count} {outcome}" for outcome, count in sorted(outcomes.items()))
    print(f"shard {shard_id}: {summary}")
    for outcome in ("reused", "ok", "degenerate", "failed", "stale", "unreadable", "superseded", "lost"):  # every one, so tasks compare
        shard_summary.log_metric(outcome, outcomes.get(outcome, 0))
    return summary


def ablate_runs(spec_json: str, runs_root: str, data_dir: str) -> int:
    """Figure 6: switch off the adapters of every span of layers in the selected runs (rows in the store)."""
    import json

    from adaptune.sweep.fan_in import ablate_sweep
    from adaptune.sweep.spec_file import spec_from_dict
    from adaptune.sweep.store import RunStore

    return ablate_sweep(spec_from_dict(json.loads(spec_json)), RunStore(runs_root), data_dir=data_dir or None)  # localized there


def aggregate(spec_json: str, runs_root: str, results: Output[Dataset], sweep_summary: Output[Metrics]) -> None:
    """Every planned run's record and the ablation rows, from the store into runs / curves / ablation Parquet;
    run counts, accelerator-hours and each method's mean per task family (glue_mean_<method> over all nine GLUE
    columns) logged as Metrics (the console shows them)."""
    import json

    from adaptune.sweep.fan_in import aggregate_sweep
    from adaptune.sweep.spec_file import spec_from_dict
    from adaptune.sweep.store import RunStore

    summary = aggregate_sweep(spec_from_dict(json.loads(spec_json)), RunStore(runs_root), results.path)
    results.metadata.update(summary)
    for name, value in summary["metrics"].items():
        sweep_summary.log_metric(name, value)
    print(summary)


def report(results: Input[Dataset], runs_root: str, data_dir: str, report_dir: Output[Artifact], report_md: Output[Markdown]) -> None:
    """The paper's tables and figures beside its numbers: report.md, tables/, figures/.

    `data_dir` (the prepared data in the run store) is for the majority-class baselines (the training labels of each task)."""
    import shutil

    from adaptune.report import build_report
    from adaptune.sweep.data_prep import readable_data_dir
    from adaptune.sweep.store import RunStore

    report_path = build_report(results.path, report_dir.path, data_dir=readable_data_dir(RunStore(runs_root), data_dir))
    shutil.copyfile(report_path, report_md.path)
