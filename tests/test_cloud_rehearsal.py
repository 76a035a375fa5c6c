"""The first real submission, rehearsed on this machine against the platforms' documented behaviour:
a store with Cloud Storage FUSE's refusals, the smoke DAG on a bucket served by a real GCS API
emulator with the pods offline, a resubmission with --retry-failed, and the job payloads that
aiplatform.PipelineJob and kfp.Client send. Every test compares results, not exit codes."""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from adaptune.sweep.experiments import get_experiment
from adaptune.sweep.plan import KFP_MAX_FANOUT, plan
from adaptune.sweep.retrain import RetrainPolicy
from adaptune.sweep.shard_runner import run_shard
from adaptune.sweep.spec import Sweep
from adaptune.sweep.spec_file import spec_to_json
from adaptune.sweep.store import RunStore
from bench.rehearsal_timing import comparable_results as _results
from bench.stand_ins import stub_trainer
from tests.fuse_semantics import fuse_semantics
from tests.gcs_emulator import gcs  # noqa: F401  (the fixture)

# --- Cloud Storage FUSE -----------------------------------------------------------------------------


@pytest.mark.slow
def test_a_store_with_fuse_semantics_trains_and_ablates_without_renaming_a_directory(
    tmp_path: Path, shared_data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store (and its tokenization cache) on a filesystem that refuses directory renames and hard
    links, as the /gcs mount does: a real run trains, its record and checkpoint land, and the cache is
    published by its marker file. Before, tokenize_task's rename was refused and every run failed."""
    from adaptune.sweep.fan_in import ablate_sweep
    from adaptune.sweep.spec import Ablation

    adapters = {"name": "adapters", "size": 8, "init_std": 1e-2}
    spec = dataclasses.replace(
        get_experiment("smoke"), name="fuse", shard_size=4, retries=0, max_train_examples=48, max_eval_examples=32,
        sweeps=(Sweep(tasks=("sst2",), methods=(adapters,), learning_rates=(1e-3,), epochs=(1,), max_length=32, batch_size=8),),
        ablation=Ablation(tasks=("sst2",), method=adapters),
    )
    root = tmp_path / "mounted-bucket"
    root.mkdir()
    with fuse_semantics(root, monkeypatch) as refused:
        with pytest.raises(OSError, match="Function not implemented"):  # the emulation refuses as gcsfuse does
            (root / "a").mkdir(), (root / "a").rename(root / "b")
        refused.clear()
        store = RunStore(root)
        (shard,) = plan(spec).shards
        outcomes = run_shard(spec, shard.id, store, data_dir=shared_data_dir)
        assert ablate_sweep(spec, store, data_dir=shared_data_dir) == 1
    assert refused == []  # nothing in a run's life renames a directory or links a file
    assert sum(outcomes.values()) == 1 and set(outcomes) <= {"ok", "degenerate"}
    run_id = shard.runs[0].run_id
    record = store.record(run_id)
    assert record["status"] in ("ok", "degenerate") and record["split_sizes"]["train"] == 48
    assert (root / "runs" / run_id / "checkpoint" / "task.safetensors").is_file()
    markers = list((root / "cache" / "tokenized").glob("sst2-*.json"))  # the run's, and the ablation's splits
    assert markers and all((root / "cache/tokenized" / json.loads(m.read_text())["dir"] / "dataset_dict.json").is_file()
                           for m in markers)
    assert store.files.read_json("ablation", f"{run_id}.json")


# --- a resubmission with --retry-failed ---------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.xdist_group("pipeline")
def test_a_resubmission_with_retry_failed_trains_only_that_run_and_refreshes_the_report(stub: Path, tmp_path: Path) -> None:
    """kfp.local, stub trainer: one run diverges; resubmitted with retry_failed (and the cause gone), only
    it trains again, and aggregate and report are recomputed (no task is served from a cache)."""
    from pipelines.local import run_local

    control = stub
    (control / "nan").mkdir()
    spec = dataclasses.replace(
        get_experiment("smoke"), name="resubmit", ablation=None, shard_size=4,
        sweeps=(Sweep(tasks=("mrpc", "sms_spam"), methods=({"name": "full"}, {"name": "layernorm"}), learning_rates=(1e-4,),
                      epochs=(1,), max_length=32),),
    )
    sweep_file = tmp_path / "resubmit.json"
    sweep_file.write_text(spec_to_json(spec))
    runs = plan(spec).runs
    diverging = runs[1].run_id
    (control / "nan" / diverging).write_text("")
    store = tmp_path / "store"

    first = run_local(str(sweep_file), tmp_path / "first", runs_root=str(store), check_data=False)
    before = pd.read_parquet(first["runs.parquet"]).set_index("run_id")
    assert before.loc[diverging, "status"] == "failed" and (before["status"] == "ok").sum() == len(runs) - 1
    report_before = first["report.md"].read_text()

    (control / "nan" / diverging).unlink()
    again = run_local(str(sweep_file), tmp_path / "again", runs_root=str(store), policy=RetrainPolicy(failed=True), check_data=False)
    after = pd.read_parquet(again["runs.parquet"]).set_index("run_id")
    assert {run.run_id: stub_trainer.calls(run.run_id) for run in runs} == {run.run_id: 2 if run.run_id == diverging else 1
                                                                          for run in runs}
    assert after.loc[diverging, "status"] == "ok" and (after["status"] == "ok").all()
    assert after.drop(index=diverging)["val_score"].equals(before.drop(index=diverging)["val_score"])
    report_after = again["report.md"].read_text()
    assert report_after != report_before and "failed" in report_before.lower()


# --- the payloads a submission sends ----------------------------------------------------------------------


def _tasks(pipeline_spec: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Every task of the root DAG and of its sub-DAGs (a ParallelFor is a sub-DAG), by name."""
    found = dict(pipeline_spec["root"]["dag"]["tasks"])
    for component in pipeline_spec["components"].values():
        found.update(component.get("dag", {}).get("tasks", {}))
    return found


def test_the_vertex_payload_has_caching_off_everywhere_and_retries_on_train_shard(tmp_path: Path,
                                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """What aiplatform.PipelineJob sends (built offline): with enable_caching=None the compiled choice
    stands, so no task, aggregate and report included, is ever served from Vertex's cache."""
    from google.cloud import aiplatform

    from pipelines.compile import compile_experiment
    from pipelines.submit import SubmitSettings, pipeline_arguments

    monkeypatch.setenv("ADAPTUNE_REGISTRY", "us-docker.pkg.dev/p/r")
    settings = SubmitSettings(project="p", region="us-central1", pipeline_root="gs://b/root", service_account="sa@p.iam")
    def payload(name: str, enable_caching: bool | None) -> dict[str, Any]:
        package = compile_experiment(name, tmp_path / f"{name}.yaml")
        job = aiplatform.PipelineJob(display_name=name, template_path=str(package), pipeline_root=settings.pipeline_root,
                                     parameter_values=pipeline_arguments(settings), enable_caching=enable_caching, project="p",
                                     location="us-central1", credentials=_anonymous())
        resource = job._gca_resource  # the request body PipelineJob.submit() sends (tests/test_submit.py sends one)
        return json.loads(type(resource).to_json(resource))

    for name in ("smoke", "glue_full"):
        sent = payload(name, enable_caching=None)  # what pipelines.submit passes
        tasks = _tasks(sent["pipelineSpec"])
        assert {"plan-shards", "train-shard", "aggregate", "report"} <= set(tasks)
        assert not any(task.get("cachingOptions", {}).get("enableCache") for task in tasks.values()), name
        retries = tasks["train-shard"].get("retryPolicy", {}).get("maxRetryCount", 0)
        assert retries == get_experiment(name).pod_retries
        assert sent["runtimeConfig"]["parameterValues"]["retrain_stale"] is False
    # What the submission used to pass: True switches the cache on for every task, aggregate and report too.
    forced = _tasks(payload("smoke", enable_caching=True)["pipelineSpec"])
    assert all(task["cachingOptions"]["enableCache"] for task in forced.values())


def test_the_kfp_payload_at_paper_full_carries_device_timeout_and_a_bounded_fan_out(tmp_path: Path,
                                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """What kfp.Client uploads (the compiled package) for a GKE cluster: the GPU request and node pool,
    $ADAPTUNE_DEVICE, a pod timeout, retries, caching off, and at most KFP_MAX_FANOUT shards."""
    import kfp
    import yaml

    from adaptune.sweep.spec_file import spec_from_dict
    from pipelines.submit import submit

    sent: dict[str, Any] = {}

    class RecordingClient:
        def __init__(self, host: str) -> None:
            sent["host"] = host

        def create_run_from_pipeline_package(self, package: str, **kwargs: Any) -> Any:
            sent["documents"] = list(yaml.safe_load_all(Path(package).read_text()))
            sent.update(kwargs)
            return type("Run", (), {"run_id": "run-1"})()

    monkeypatch.setattr(kfp, "Client", RecordingClient)
    monkeypatch.chdir(tmp_path)
    submit("paper_full", env={"KFP_HOST": "http://127.0.0.1:1", "ADAPTUNE_RUNS_ROOT": "gs://b/runs",
                              "ADAPTUNE_REGISTRY": "us-docker.pkg.dev/p/r"})
    assert sent["enable_caching"] is None
    pipeline_spec, platform = sent["documents"]
    tasks = _tasks(pipeline_spec)
    assert all(task.get("cachingOptions", {}).get("enableCache", False) is False for task in tasks.values())
    assert tasks["train-shard"]["retryPolicy"]["maxRetryCount"] == 3
    executor = pipeline_spec["deploymentSpec"]["executors"]["exec-train-shard"]["container"]
    assert executor["resources"]["accelerator"]["resourceType"] == "nvidia.com/gpu"
    assert {"name": "ADAPTUNE_DEVICE", "value": "cuda"} in executor["env"]
    kubernetes = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]["exec-train-shard"]
    assert int(kubernetes["activeDeadlineSeconds"]) > 3600 and kubernetes["nodeSelector"]["labels"]
    compiled_spec = spec_from_dict(json.loads(pipeline_spec["root"]["inputDefinitions"]["parameters"]["spec_json"]["defaultValue"]))
    assert len(plan(compiled_spec).shards) <= KFP_MAX_FANOUT < len(plan(get_experiment("paper_full")).shards)
    assert Counter(r.run_id for r in plan(compiled_spec).runs) == Counter(r.run_id for r in plan(get_experiment("paper_full")).runs)


def _anonymous() -> Any:
    from google.auth.credentials import AnonymousCredentials

    return AnonymousCredentials()


# --- a bucket, served by a real GCS API emulator on loopback ---------------------------------------------


def test_leases_and_records_are_create_only_on_the_emulated_bucket(gcs: Any) -> None:
    """GCS's ifGenerationMatch=0 precondition (gcsfs pipe_file(mode="create")): of 16 racing attempts
    exactly one takes the lease, and a record is written once."""
    from adaptune.sweep.lease import Lease
    from tests.test_run_store_safety import race_for_a_lease

    store = RunStore(gcs.url("store"))
    results = race_for_a_lease(store)
    assert sum(isinstance(result, Lease) for result in results) == 1
    assert store.publish_record({"run_id": "run-a", "writer": 1}) and not store.publish_record({"run_id": "run-a", "writer": 2})
    assert store.record("run-a")["writer"] == 1


@pytest.mark.slow
@pytest.mark.xdist_group("containers")  # shares the local smoke run (smoke_run) with test_pipeline
def test_the_smoke_dag_on_an_emulated_bucket_offline_with_staged_weights_equals_the_local_run(
    gcs: Any, tmp_path: Path, shared_data_dir: Path, backbone_path: str, smoke_run: dict[str, Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The run store at gs://<bucket>/..., the pods offline (HF_HUB_OFFLINE=1, as conftest sets for every
    process here), the backbone staged once in the bucket under a hub name (all-MiniLM-L6-v2's files as
    "bert-base-uncased", so nothing could come from a hub cache): the same numbers as the local smoke run
    gives for that task."""
    import fsspec

    from adaptune.sweep.staging import stage_models
    from pipelines.local import run_local

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    smoke = get_experiment("smoke")
    task = smoke.ablation.tasks[0]  # the smoke DAG whole (shards, ablation, aggregate, report), on its ablated task only
    spec = dataclasses.replace(smoke, name="smoke_bucket", backbone="bert-base-uncased",
                               sweeps=tuple(dataclasses.replace(sweep, tasks=(task,)) for sweep in smoke.sweeps))
    sweep_file = tmp_path / "smoke_bucket.json"
    sweep_file.write_text(spec_to_json(spec))
    root = gcs.url("adaptune-runs")
    (staged,) = stage_models(spec, RunStore(root), sources={"bert-base-uncased": backbone_path})
    assert staged["bytes"] > 80e6

    paths = run_local(str(sweep_file), tmp_path / "out", data_dir=shared_data_dir, runs_root=root)
    bucket_runs = pd.read_parquet(paths["runs.parquet"])
    local_runs = pd.read_parquet(smoke_run["runs.parquet"]).query("task == @task")
    assert len(bucket_runs) == len(local_runs) == len(plan(spec).runs) > 0
    pd.testing.assert_frame_equal(_results(bucket_runs), _results(local_runs))
    assert (bucket_runs["backbone"] == "bert-base-uncased").all()
    assert bucket_runs["checkpoint_dir"].str.startswith(f"gs://{gcs.bucket}/adaptune-runs/runs/").all()
    local_ablation = pd.read_parquet(smoke_run["ablation.parquet"])
    assert len(pd.read_parquet(paths["ablation.parquet"])) == len(local_ablation) > 0
    # What the bucket holds: each run's record and checkpoint; no training state, no lease left behind.
    fs, _ = fsspec.core.url_to_fs(root)
    names = [path.rsplit("/", 1)[-1] for path in fs.find(f"{gcs.bucket}/adaptune-runs/runs")]
    assert names.count("record.json") == len(bucket_runs) and "train_state.pt" not in names
    assert not [name for name in names if name.startswith("lease-")]
    provenance = json.loads(bucket_runs["provenance_json"].iloc[0])
    assert provenance["data"]["source"] == "mirror" and provenance["code_version"] != "unknown"
    assert provenance["image"].endswith("/adaptune-cpu:0.2.0")  # the task's image, set on it at compile time
