"""The one reproduction DAG, built for a named experiment.

    plan -> per task (ParallelFor): prepare_data once -> ParallelFor(runs, parallelism=N) train_eval
         -> Collected records -> ablate the selected adapter runs -> aggregate (Parquet) -> report

Records fan in as parameters (Vertex AI caps collected artifacts at 100); the ablation reads the
checkpoints through the records' checkpoint paths. Loop items are whole dicts (DESIGN.md).

`target` picks how train_eval asks for its accelerator: "vertex" (Vertex AI accelerator type and
count) or "kfp" (a KFP cluster on GKE: Kubernetes resource limit, node selector and tolerations
through kfp-kubernetes).
"""

# No `from __future__ import annotations`: KFP reads the pipeline functions' annotations as types.

from typing import Any, Callable, List, NamedTuple

from kfp import dsl, kubernetes

from adaptune.experiments import Accelerator, ExperimentSpec
from components import make_components

TARGETS = ("vertex", "kfp")
# On a KFP cluster the accelerator is a Kubernetes extended resource.
KUBERNETES_RESOURCES = {"gpu": "nvidia.com/gpu", "tpu": "google.com/tpu"}
RETRY_BACKOFF = "60s"


def pipeline_name(spec: ExperimentSpec) -> str:
    return f"adaptune-{spec.name.replace('_', '-')}"


def configure_accelerator(task: Any, accelerator: Accelerator, retries: int, target: str) -> None:
    """Resources, placement and retries of a heavy task (train_eval, ablate)."""
    task.set_cpu_limit(accelerator.cpu_limit).set_memory_limit(accelerator.memory_limit)
    if accelerator.family != "cpu":
        resource = accelerator.type if target == "vertex" else KUBERNETES_RESOURCES[accelerator.family]
        task.set_accelerator_type(resource).set_accelerator_limit(accelerator.count)
    if target == "kfp":
        for key, value in accelerator.node_selector:
            kubernetes.add_node_selector(task, label_key=key, label_value=value)
        for key in accelerator.tolerations:
            kubernetes.add_toleration(task, key=key, operator="Exists", effect="NoSchedule")
    if retries:  # preempted (spot) nodes: the run resumes from its saved state
        task.set_retry(num_retries=retries, backoff_duration=RETRY_BACKOFF)


def build_pipeline(spec: ExperimentSpec, target: str = "vertex") -> Callable[..., Any]:
    """The pipeline function for `spec` (compile it, or call it under kfp.local)."""
    if target not in TARGETS:
        raise ValueError(f"unknown target {target!r}; expected one of {TARGETS}")
    steps = make_components(spec.accelerator.family)

    @dsl.pipeline(name="task-runs", description="one task: prepare its data once, then train and evaluate every run")
    def task_runs(group: dict, data_dir: str) -> List[str]:
        prepare_task = steps.prepare_data(group=group, data_dir=data_dir)
        with dsl.ParallelFor(prepare_task.outputs["Output"], parallelism=spec.max_parallelism) as run:
            train_task = steps.train_eval(run=run, data_dir=data_dir, dataset=prepare_task.outputs["dataset"])
            configure_accelerator(train_task, spec.accelerator, spec.retries, target)
        return dsl.Collected(train_task.outputs["Output"])

    outputs = NamedTuple("Outputs", [("results", dsl.Dataset), ("report", dsl.Artifact)])

    @dsl.pipeline(name=pipeline_name(spec), description=spec.description)
    def reproduction(data_dir: str = "") -> outputs:  # type: ignore[valid-type]
        plan_task = steps.plan_runs(experiment=spec.name)
        plan_task.set_caching_options(False)  # cheap, and must follow the image's experiments.py
        with dsl.ParallelFor(plan_task.output, parallelism=spec.max_parallel_tasks) as group:
            task_runs_task = task_runs(group=group, data_dir=data_dir)
        ablation_rows: Any = "[]"
        if spec.ablation is not None:
            ablate_task = steps.ablate_runs(experiment=spec.name, records=dsl.Collected(task_runs_task.output), data_dir=data_dir)
            configure_accelerator(ablate_task, spec.accelerator, spec.retries, target)
            ablation_rows = ablate_task.output
        aggregate_task = steps.aggregate(records=dsl.Collected(task_runs_task.output), ablation=ablation_rows)
        report_task = steps.report(results=aggregate_task.outputs["results"])
        return outputs(results=aggregate_task.outputs["results"], report=report_task.outputs["report_dir"])

    return reproduction
