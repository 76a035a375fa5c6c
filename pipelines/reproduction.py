"""The one reproduction DAG, built for an experiment spec.

    prepare_data (CPU) -> plan_shards -> ParallelFor(shards, parallelism=spec.parallelism) train_shard
                       -> ablate_runs -> aggregate (Parquet) -> report

prepare_data reads every task the plan uses once, on a CPU node, checks, splits and tokenizes it into the run
store; the heavy steps read only that (their `data_dir` is its output): no accelerator node parses a file, asks
the hub for data, or tokenizes, and a data problem stops the pipeline before any accelerator is asked for.

The spec travels as a small pipeline parameter (`spec_json`, a few KB at any scale): a run cloned
in the Vertex AI console can change its grid there. Every component re-plans it; the fan-out
carries only shard ids, and the fan-in reads the run store (`runs_root`), so no input grows with
the number of runs. train_shard, ablate_runs and aggregate are never cached: the run store is the
cache (finished runs are reused, failed ones too unless `retry_failed`), so a resubmission trains
only what is missing and retries what failed transiently.

`target` picks how train_shard asks for its accelerator: "vertex" (Vertex AI accelerator type and
count) or "kfp" (a KFP cluster on GKE: Kubernetes resource limit, node selector and tolerations
through kfp-kubernetes, a pod timeout, and shards grown until the fan-out is at most
adaptune.sweep.plan.KFP_MAX_FANOUT iterations).

Every task is compiled with caching off: the run store is the cache, and a submission must not turn it
back on (pipelines/submit.py passes enable_caching=None). Accelerator tasks get $ADAPTUNE_DEVICE, so
a node without a working driver fails the task at once instead of training on its CPU.
"""

# No `from __future__ import annotations`: KFP reads the pipeline functions' annotations as types.

import json
from typing import Any, Callable, NamedTuple

from kfp import dsl, kubernetes

from adaptune.core.precision import CPU_BF16_ENV, cpu_bf16_env_value
from adaptune.sweep.plan import plan, within_fanout
from adaptune.sweep.retry import RetryPolicy
from adaptune.sweep.spec import Accelerator, ExperimentSpec
from adaptune.sweep.spec_file import spec_to_json
from components import make_components
from components.images import image_for
from pipelines.local_threads import CoreShare

TARGETS = ("vertex", "kfp")
# On a KFP cluster the accelerator is a Kubernetes extended resource.
KUBERNETES_RESOURCES = {"gpu": "nvidia.com/gpu", "tpu": "google.com/tpu"}
DEVICE_FOR_FAMILY = {"gpu": "cuda", "tpu": "xla"}  # $ADAPTUNE_DEVICE: adaptune.core.devices.pick_device refuses to fall back


def pipeline_name(spec: ExperimentSpec) -> str:
    return f"adaptune-{spec.name.replace('_', '-')}"


def configure_accelerator(task: Any, accelerator: Accelerator, retry: RetryPolicy, target: str, timeout_s: int) -> None:
    """Resources, placement, device, timeout and retries of a heavy task (train_shard, ablate_runs)."""
    task.set_cpu_limit(accelerator.cpu_limit).set_memory_limit(accelerator.memory_limit)
    task.set_env_variable("ADAPTUNE_IMAGE", image_for(accelerator.family))  # provenance of every record
    if accelerator.family == "cpu" and accelerator.cpu_precision != "auto":  # auto: the machine's (adaptune.core.devices)
        task.set_env_variable(CPU_BF16_ENV, cpu_bf16_env_value(accelerator.cpu_precision))
    for name, value in accelerator.step_settings:  # how the step runs there (adaptune.fused.settings)
        task.set_env_variable(name, value)
    if accelerator.family != "cpu":
        resource = accelerator.type if target == "vertex" else KUBERNETES_RESOURCES[accelerator.family]
        task.set_accelerator_type(resource).set_accelerator_limit(accelerator.count)
        task.set_env_variable("ADAPTUNE_DEVICE", DEVICE_FOR_FAMILY[accelerator.family])
    if target == "kfp":
        for key, value in accelerator.node_selector:
            kubernetes.add_node_selector(task, label_key=key, label_value=value)
        for key in accelerator.tolerations:
            kubernetes.add_toleration(task, key=key, operator="Exists", effect="NoSchedule")
        kubernetes.set_timeout(task, timeout_s)  # the pod's activeDeadlineSeconds
    if retry.pod_restarts:  # preempted (spot) nodes: the shard resumes from the run store (transient errors retry inside it)
        task.set_retry(num_retries=retry.pod_restarts, backoff_duration=retry.pod_backoff)


def task_timeout_s(spec: ExperimentSpec) -> int:
    """The longest shard's deadline (adaptune.sweep.plan.Plan.deadline_hours), in seconds: the pod timeout."""
    planned = plan(spec)
    return int(max(planned.deadline_hours(shard) for shard in planned.shards) * 3600)


def compiled_shape(spec: ExperimentSpec) -> str:
    """What the compiled DAG fixes (plan_shards refuses a spec that asks for something else)."""
    return json.dumps({"accelerator": spec.accelerator.label, "count": spec.accelerator.count, "parallelism": spec.parallelism},
                      sort_keys=True)


def build_pipeline(spec: ExperimentSpec, target: str = "vertex", threads: CoreShare | None = None) -> Callable[..., Any]:
    """The pipeline function for `spec` (compile it, or call it under kfp.local). `threads`: a local run's share of
    the machine's cores, each task's thread count set in its environment (None: the node's, as compiled)."""
    if target not in TARGETS:
        raise ValueError(f"unknown target {target!r}; expected one of {TARGETS}")
    if target == "kfp":
        spec = within_fanout(spec)  # Argo keeps the whole fan-out in one etcd object
    timeout_s = task_timeout_s(spec)
    retry = RetryPolicy.for_spec(spec)
    steps = make_components(spec.accelerator.family)

    def local_threads(task: Any, shard: bool = False) -> Any:
        for name, value in (threads.environment(shard) if threads is not None else {}).items():
            task.set_env_variable(name, value)
        return task

    Outputs = NamedTuple("Outputs", [("results", dsl.Dataset), ("report", dsl.Artifact)])

    @dsl.pipeline(name=pipeline_name(spec), description=spec.description)
    def reproduction(
        runs_root: str,
        spec_json: str = spec_to_json(spec),
        data_dir: str = "",
        retry_failed: bool = False,
        retrain_stale: bool = False,
        retry_unreadable: bool = False,
    ) -> Outputs:
        data_task = local_threads(steps.prepare_data(spec_json=spec_json, runs_root=runs_root, data_dir=data_dir))
        data_task.set_caching_options(False)  # the run store is its cache: prepared data is reused by its content
        prepared = data_task.outputs["prepared"]
        plan_task = local_threads(steps.plan_shards(spec_json=spec_json, compiled_shape=compiled_shape(spec), prepared=prepared))
        plan_task.set_caching_options(False)  # cheap, and must follow the image's adaptune
        with dsl.ParallelFor(plan_task.output, parallelism=spec.parallelism) as shard:
            train_task = steps.train_shard(spec_json=spec_json, shard_id=shard.shard, runs_root=runs_root,
                                           data_dir=shard.data, retry_failed=retry_failed, retrain_stale=retrain_stale,
                                           retry_unreadable=retry_unreadable)
            train_task.set_caching_options(False)  # the run store decides what to reuse
            configure_accelerator(train_task, spec.accelerator, retry, target, timeout_s)
            local_threads(train_task, shard=True)
        last: Any = train_task
        if spec.ablation is not None:
            ablate_task = steps.ablate_runs(spec_json=spec_json, runs_root=runs_root, data_dir=prepared).after(train_task)
            ablate_task.set_caching_options(False)
            configure_accelerator(ablate_task, spec.accelerator, retry, target, timeout_s)
            local_threads(ablate_task)
            last = ablate_task
        aggregate_task = local_threads(steps.aggregate(spec_json=spec_json, runs_root=runs_root).after(last))
        aggregate_task.set_caching_options(False)
        report_task = local_threads(steps.report(results=aggregate_task.outputs["results"], runs_root=runs_root, data_dir=prepared))
        report_task.set_caching_options(False)  # its input is always a new artifact; never a stale report
        return Outputs(results=aggregate_task.outputs["results"], report=report_task.outputs["report_dir"])

    return reproduction
