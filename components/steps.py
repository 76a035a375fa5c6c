"""The bodies of the pipeline's lightweight components: parse inputs, call adaptune, write artifacts.

KFP ships each function's source alone into its container, so every body imports what it needs
and calls no helper of this module. No `from __future__ import annotations` here: KFP reads the
annotations (Input[Dataset], List[dict]) as real types to build the component interface.

A run that goes wrong comes back as a record with status "failed", never as a failing task: a
failed task would stop the sweep (and crashes kfp.local's orchestrator, see DESIGN.md).
"""

from typing import List

from kfp.dsl import Artifact, Dataset, Input, Markdown, Metrics, Model, Output


def plan_runs(experiment: str) -> List[dict]:
    """Expand the named experiment into its runs, grouped per task (validated; raises on a bad grid)."""
    from adaptune.experiments import get_experiment
    from adaptune.plan import plan

    planned = plan(get_experiment(experiment))
    print(planned.summary())
    return planned.runs_by_task()


def prepare_data(group: dict, data_dir: str, dataset: Output[Dataset]) -> List[dict]:
    """Load, split and tokenize one task once for every (backbone, max_length) its runs use.

    The Dataset artifact is the tokenization cache that every train_eval of the task reads. Returns
    the task's runs for the fan-out. A data problem is logged and left for each run to report as
    a failed record, so one missing task does not stop the others.
    """
    import json
    import os
    import traceback

    from adaptune.data import prepare

    os.makedirs(dataset.path, exist_ok=True)
    summaries, errors = [], []
    for backbone in group["backbones"]:
        for max_length in group["max_lengths"]:
            try:
                summaries.append(
                    prepare(group["task"], data_dir=data_dir or None, tokenizer_name=backbone,
                            cache_dir=dataset.path, max_length=int(max_length))
                )
            except Exception:  # reported per run by train_eval, which meets the same error
                errors.append(traceback.format_exc())
                print(errors[-1])
    with open(os.path.join(dataset.path, "prepare.json"), "w") as handle:
        json.dump({"summaries": summaries, "errors": errors}, handle, indent=2, default=str)
    dataset.metadata.update({"task": group["task"], "runs": len(group["runs"]), "errors": len(errors)})
    return group["runs"]


def train_eval(run: dict, data_dir: str, dataset: Input[Dataset], model: Output[Model], metrics: Output[Metrics]) -> str:
    """Train and evaluate one run; the output is its record as JSON, the compact checkpoint the Model.

    JSON text rather than a dict parameter: records hold nulls (reason, best_epoch, non-finite
    metrics), which kfp.local cannot pass between tasks.
    """
    import json
    import traceback

    from adaptune.config import TrainConfig
    from adaptune.plan import failed_run_record

    config = TrainConfig.from_dict(run)
    try:
        from adaptune.train import train_and_evaluate

        record = train_and_evaluate(config, data_dir=data_dir or None, out_dir=model.path, cache_dir=dataset.path,
                                    progress=False)
    except Exception:
        record = failed_run_record(config, traceback.format_exc())
        print(record["reason"])
    model.metadata.update({"run_id": record["run_id"], "method": record.get("method_label"), "status": record["status"]})
    metrics.log_metric("status_ok", 1.0 if record["status"] == "ok" else 0.0)
    for split in ("val", "test"):
        for name, value in (record.get(f"{split}_metrics") or {}).items():
            if isinstance(value, (int, float)):
                metrics.log_metric(f"{split}_{name}", float(value))
    if record.get("trained_params"):
        metrics.log_metric("trained_params", float(record["trained_params"]))
    return json.dumps(record, default=str)


def ablate_runs(experiment: str, records: List[list], data_dir: str) -> str:
    """Figure 6: switch off the adapters of every span of layers in the selected runs, re-evaluate.

    Returns the ablation rows as JSON text (they may hold nulls; see train_eval).
    """
    import json
    import traceback

    from adaptune.experiments import get_experiment
    from adaptune.plan import select_ablation_runs

    spec = get_experiment(experiment)
    flat = [json.loads(record) for task_records in records for record in task_records]
    rows: list = []
    for record in select_ablation_runs(flat, spec.ablation):
        try:
            from adaptune.ablation import ablate

            rows.extend(ablate(record["checkpoint_dir"], data_dir=data_dir or None))
        except Exception:  # the ablation table just lacks this run; the sweep's results stand
            print(f"ablation of {record['run_id']} failed:\n{traceback.format_exc()}")
    return json.dumps(rows, default=str)


def aggregate(records: List[list], ablation: str, results: Output[Dataset]) -> None:
    """Every run record (JSON, per task) and the ablation rows (JSON) into runs / curves / ablation Parquet."""
    import json

    from adaptune.results import write_results

    flat = [json.loads(record) for task_records in records for record in task_records]
    ablation = json.loads(ablation)
    paths = write_results(flat, results.path, ablation=ablation)
    statuses = {status: sum(r["status"] == status for r in flat) for status in ("ok", "degenerate", "failed")}
    results.metadata.update({"runs": len(flat), "ablation_rows": len(ablation), **statuses,
                             "files": sorted(p.name for p in paths.values())})
    print(f"{len(flat)} runs {statuses}; wrote {sorted(str(p) for p in paths.values())}")


def report(results: Input[Dataset], report_dir: Output[Artifact], report_md: Output[Markdown]) -> None:
    """The paper's tables and figures beside its numbers: report.md, tables/, figures/."""
    import shutil

    from adaptune.report import build_report

    report_path = build_report(results.path, report_dir.path)
    shutil.copyfile(report_path, report_md.path)
