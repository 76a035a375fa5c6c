"""The bodies of the pipeline's lightweight components: parse inputs, call adaptune, write artifacts.

KFP ships each function's source alone into its container, so every body imports what it needs
and calls no helper of this module. No `from __future__ import annotations` here: KFP reads the
annotations (Output[Dataset], List[str]) as real types to build the component interface.

Every input is small and bounded: the experiment spec as compact JSON (a few KB, whatever the
number of runs), a shard id, the run store's root. Components re-plan the spec (deterministic) to
find their runs, and fan in by reading the run store.
"""

from typing import List

from kfp.dsl import Artifact, Dataset, Input, Markdown, Metrics, Output


def plan_shards(spec_json: str, compiled_shape: str) -> List[str]:
    """Validate the spec and return its shard ids (what the DAG fans out over).

    `compiled_shape` is the accelerator and parallelism the DAG was compiled with: a spec edited in
    the console may change its grid, not the DAG's resources.
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
    return [shard.id for shard in planned.shards]


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

    return ablate_sweep(spec_from_dict(json.loads(spec_json)), RunStore(runs_root), data_dir=data_dir or None)


def aggregate(spec_json: str, runs_root: str, results: Output[Dataset], sweep_summary: Output[Metrics]) -> None:
    """Every planned run's record and the ablation rows, from the store into runs / curves / ablation Parquet;
    run counts, accelerator-hours and each method's GLUE mean logged as Metrics (the console shows them)."""
    import json

    from adaptune.sweep.fan_in import aggregate_sweep
    from adaptune.sweep.spec_file import spec_from_dict
    from adaptune.sweep.store import RunStore

    summary = aggregate_sweep(spec_from_dict(json.loads(spec_json)), RunStore(runs_root), results.path)
    results.metadata.update(summary)
    for name, value in summary["metrics"].items():
        sweep_summary.log_metric(name, value)
    print(summary)


def report(results: Input[Dataset], data_dir: str, report_dir: Output[Artifact], report_md: Output[Markdown]) -> None:
    """The paper's tables and figures beside its numbers: report.md, tables/, figures/.

    `data_dir` is for the majority-class baselines (the training labels of each task)."""
    import shutil

    from adaptune.report import build_report

    report_path = build_report(results.path, report_dir.path, data_dir=data_dir or None)
    shutil.copyfile(report_path, report_md.path)
