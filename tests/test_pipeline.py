"""The reproduction DAG: compiled accelerator, retry and image settings; smoke end to end on real data."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml
from kfp import compiler

from adaptune.sweep.experiments import get_experiment
from adaptune.sweep.plan import plan
from adaptune.sweep.spec import TPU_V5E
from pipelines.reproduction import build_pipeline


def _compiled(spec: Any, target: str, tmp_path: Path) -> list[dict]:
    path = tmp_path / f"{spec.name}-{target}.yaml"
    compiler.Compiler().compile(build_pipeline(spec, target=target), str(path))
    return list(yaml.safe_load_all(path.read_text()))


def _find(node: Any, key: str) -> list[Any]:
    """Every value stored under `key`, anywhere in a nested spec."""
    found = []
    if isinstance(node, dict):
        for k, v in node.items():
            found += [v] if k == key else []
            found += _find(v, key)
    elif isinstance(node, list):
        for item in node:
            found += _find(item, key)
    return found


@pytest.fixture(autouse=True)
def default_images(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ADAPTUNE_REGISTRY", raising=False)
    monkeypatch.delenv("ADAPTUNE_IMAGE_TAG", raising=False)


def test_vertex_spec_carries_gpu_accelerator_retries_and_images(tmp_path: Path) -> None:
    spec = get_experiment("glue_full")
    (pipeline,) = _compiled(spec, "vertex", tmp_path)
    executors = pipeline["deploymentSpec"]["executors"]
    train = executors["exec-train-shard"]["container"]
    assert train["image"].endswith("/adaptune-gpu:0.2.0")
    assert train["resources"]["accelerator"]["resourceType"] == "NVIDIA_H100_80GB"
    assert train["resources"]["accelerator"]["resourceCount"] == "1"
    for light in ("exec-prepare-data", "exec-plan-shards", "exec-aggregate", "exec-report"):
        assert executors[light]["container"]["image"].endswith("/adaptune-cpu:0.2.0"), light
        assert "resources" not in executors[light]["container"], light  # no accelerator: data work runs on a CPU node
    tasks = pipeline["root"]["dag"]["tasks"]
    assert "dependentTasks" not in tasks["prepare-data"], "the data is prepared first"
    loop_name = next(name for name in tasks if name.startswith("for-loop"))
    assert tasks["plan-shards"]["inputs"]["parameters"]["prepared"]["taskOutputParameter"]["producerTask"] == "prepare-data"
    # the shards read only what prepare-data wrote: their data_dir is the loop item's "data", never the pipeline's
    shard_inputs = pipeline["components"][f"comp-{loop_name}"]["dag"]["tasks"]["train-shard"]["inputs"]["parameters"]
    assert shard_inputs["data_dir"]["parameterExpressionSelector"] == 'parseJson(string_value)["data"]'
    assert tasks["report"]["inputs"]["parameters"]["data_dir"]["taskOutputParameter"]["producerTask"] == "prepare-data"
    # No run-time pip installs: the images already hold adaptune and kfp.
    assert not any("pip install" in " ".join(e["container"]["command"]) for e in executors.values())
    assert _find(pipeline, "retryPolicy") == [
        {"backoffDuration": "60s", "backoffFactor": 2.0, "backoffMaxDuration": "3600s", "maxRetryCount": spec.pod_retries}
    ]
    assert _find(pipeline, "parallelismLimit") == [spec.parallelism]
    assert "cachingOptions" in str(pipeline) and pipeline["pipelineInfo"]["name"] == "adaptune-glue-full"


def test_kfp_target_adds_node_selector_and_toleration(tmp_path: Path) -> None:
    pipeline, platform = _compiled(get_experiment("glue_full"), "kfp", tmp_path)
    train = pipeline["deploymentSpec"]["executors"]["exec-train-shard"]["container"]
    assert train["resources"]["accelerator"]["resourceType"] == "nvidia.com/gpu"
    kubernetes = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]["exec-train-shard"]
    assert kubernetes["nodeSelector"]["labels"] == {"cloud.google.com/gke-accelerator": "nvidia-h100-80gb"}
    assert kubernetes["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]


def test_tpu_experiment_uses_the_tpu_image_and_accelerator(tmp_path: Path) -> None:
    spec = dataclasses.replace(get_experiment("ablation"), accelerator=TPU_V5E)
    (pipeline,) = _compiled(spec, "vertex", tmp_path)
    executors = pipeline["deploymentSpec"]["executors"]
    for heavy in ("exec-train-shard", "exec-ablate-runs"):
        container = executors[heavy]["container"]
        assert container["image"].endswith("/adaptune-tpu:0.2.0"), heavy
        assert container["resources"]["accelerator"]["resourceType"] == "TPU_V5_LITEPOD"
        assert container["resources"]["accelerator"]["resourceCount"] == "1"  # one chip: devices.py uses one XLA device


def test_cpu_experiment_has_no_accelerator_and_two_shards_at_a_time(tmp_path: Path) -> None:
    (pipeline,) = _compiled(get_experiment("smoke"), "vertex", tmp_path)
    train = pipeline["deploymentSpec"]["executors"]["exec-train-shard"]["container"]
    assert train["image"].endswith("/adaptune-cpu:0.2.0") and "accelerator" not in train["resources"]
    assert _find(pipeline, "parallelismLimit") == [2]
    assert _find(pipeline, "retryPolicy") == []  # smoke declares pod_retries=0


def test_experiment_without_ablation_has_no_ablate_task(tmp_path: Path) -> None:
    (pipeline,) = _compiled(get_experiment("glue_full"), "vertex", tmp_path)
    assert "exec-ablate-runs" not in pipeline["deploymentSpec"]["executors"]
    (with_ablation,) = _compiled(get_experiment("ablation"), "vertex", tmp_path)
    assert "exec-ablate-runs" in with_ablation["deploymentSpec"]["executors"]


@pytest.mark.slow
@pytest.mark.xdist_group("containers")  # shares the smoke_run fixture with the container comparison
def test_smoke_runs_end_to_end_on_real_data(smoke_run: dict[str, Path]) -> None:
    planned = plan(get_experiment("smoke"))
    paths = smoke_run

    runs = pd.read_parquet(paths["runs.parquet"])
    assert sorted(runs["run_id"]) == sorted(run.run_id for run in planned.runs)  # one row per planned run
    assert set(runs["status"]) <= {"ok", "degenerate", "failed"}
    ok = runs[runs["status"] == "ok"]
    # Full fine-tuning and adapters learn SMS spam within 48 steps; the head alone, a probe at 4 rates, stands above the
    # majority class (0.87) at its best.
    sms = ok[ok["task"] == "sms_spam"].groupby("method_label")["val_score"].max()
    assert set(sms.index) >= {"full", "adapters16", "head"}
    assert (sms[["full", "adapters16"]] > 0.95).all() and sms["head"] > 0.87
    assert runs[runs["method"] == "head"]["probe"].all() and not runs[runs["method"] != "head"]["probe"].any()
    curves = pd.read_parquet(paths["curves.parquet"])
    assert set(curves["run_id"]) == set(runs["run_id"])
    # Figure 6 on the 6-layer MiniLM: every span (first <= last) of the selected adapter run.
    ablation = pd.read_parquet(paths["ablation.parquet"])
    assert ablation["run_id"].nunique() == 1 and ablation["task"].iloc[0] == "sms_spam"
    assert len(ablation[["first_layer", "last_layer"]].drop_duplicates()) == 6 * 7 // 2
    assert paths["report.md"].is_file() and paths["figures"].is_dir()
    assert f"Results: `{paths['runs.parquet'].parent}`" in paths["report.md"].read_text()  # the user's folder, not kfp.local's


@pytest.mark.slow
@pytest.mark.xdist_group("pipeline")
def test_a_local_run_leaves_print_as_it_found_it(stub: Path, tmp_path: Path) -> None:
    """kfp.local swaps builtins.print to indent task logs; with two ParallelFor tasks at once the swap can
    stick (every later print in the process indented). run_local puts the real one back."""
    import builtins

    from adaptune.sweep.spec import Sweep
    from adaptune.sweep.spec_file import spec_to_json
    from pipelines.local import run_local

    spec = dataclasses.replace(
        get_experiment("smoke"), name="print_check", ablation=None, shard_size=1,
        sweeps=(Sweep(tasks=("mrpc", "sms_spam"), methods=({"name": "full"},), learning_rates=(1e-4,), epochs=(1,),
                      seeds=(0, 1), max_length=32),),
    )
    sweep_file = tmp_path / "print_check.json"
    sweep_file.write_text(spec_to_json(spec))
    before = builtins.print
    run_local(str(sweep_file), tmp_path / "out", check_data=False)
    assert builtins.print is before
