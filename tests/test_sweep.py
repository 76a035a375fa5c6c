"""The paper-scale DAG: experiments as data, shards, the run store, resubmission, failures, quota."""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest
import yaml

from adaptune.sweep.experiments import EXPERIMENTS, get_experiment
from adaptune.sweep.fan_in import IncompleteSweepError, aggregate_sweep, sweep_records
from adaptune.sweep.plan import PlanError, plan
from adaptune.sweep.retrain import RetrainPolicy
from adaptune.sweep.shard_runner import is_transient, run_shard
from adaptune.sweep.spec import CPU, H100, SpecError, Sweep
from adaptune.sweep.spec_file import load_spec_file, spec_from_dict, spec_to_dict, spec_to_json
from adaptune.sweep.store import RunStore
from adaptune.train.config import TrainConfig
from adaptune.train.state_saves import STATE_EVERY_S_ENV
from bench.stand_ins import stub_trainer

MAX_EXECUTOR_INPUT = 16 * 1024


def _small_spec(**changes: object):
    """Two tasks x two methods x two seeds on the embedded backbone: 8 runs, shards of 3."""
    spec = dataclasses.replace(
        get_experiment("smoke"),
        name="store_test",
        sweeps=(Sweep(tasks=("rte", "sms_spam"), methods=({"name": "full"}, {"name": "layernorm"}), learning_rates=(1e-4,),
                      epochs=(1,), seeds=(0, 1), max_length=32),),
        ablation=None,
        shard_size=3,
        retries=1,
    )
    return dataclasses.replace(spec, **changes)


def _run_all(spec, store: RunStore, **flags: bool) -> Counter[str]:
    outcomes: Counter[str] = Counter()
    for shard in plan(spec).shards:
        outcomes += run_shard(spec, shard.id, store, policy=RetrainPolicy.from_flags(**flags))
    return outcomes


# --- experiments as data -------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(EXPERIMENTS))
def test_every_named_experiment_round_trips_through_yaml(name: str, tmp_path: Path) -> None:
    spec = get_experiment(name)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec_to_dict(spec)))
    loaded = get_experiment(str(path))  # a file works wherever a name does
    assert [run.run_id for run in plan(loaded).runs] == [run.run_id for run in plan(spec).runs]
    assert spec_to_json(loaded) == spec_to_json(spec_from_dict(json.loads(spec_to_json(loaded))))


def test_a_hand_written_sweep_file_plans(tmp_path: Path) -> None:
    path = tmp_path / "sweep.yaml"
    path.write_text(
        "name: my_rte\n"
        "backbone: all-MiniLM-L6-v2\n"
        "accelerator: cpu\n"
        "max_train_examples: 200\n"
        "sweeps:\n"
        "  - tasks: [rte, mrpc]\n"
        "    methods: [full, 'adapters:16', 'top_k:2']\n"
        "    learning_rates: [1e-4, 3e-4]\n"
        "    epochs: 2\n"
        "    seeds: [0, 1]\n"
    )
    planned = plan(load_spec_file(path))
    assert len(planned.runs) == 2 * 3 * 2 * 2
    assert {run.method["name"] for run in planned.runs} == {"full", "adapters", "top_k"}
    assert {run.max_train_examples for run in planned.runs} == {200} and planned.spec.accelerator == CPU


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("name: x\nsweeps: [{tasks: [rte], methods: [full], learning_rate: [1e-4]}]\n", "learning_rate (did you mean learning_rates?)"),
        ("name: x\nsweeps: [{tasks: [rte], methods: ['adapters:-3'], learning_rates: [1e-4]}]\n", "adapters size must be >= 1"),
        ("name: x\naccelerator: v100\nsweeps: []\n", "unknown accelerator 'v100'"),
        ("name: x\nsweeps: [{tasks: [rte], methods: [full]\n", "not valid YAML"),
        ("[1, 2]\n", "mapping of fields"),
    ],
)
def test_a_malformed_sweep_file_names_the_problem(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(SpecError, match="bad.yaml") as error:
        load_spec_file(path)
    assert message in str(error.value)


def test_the_paper_full_spec_parameter_is_small() -> None:
    assert len(spec_to_json(get_experiment("paper_full")).encode()) < 8 * 1024


# --- plan: run ids, shards, quota -----------------------------------------------------------------


def test_run_ids_do_not_depend_on_the_experiment_name() -> None:
    glue = {run.run_id for run in plan(get_experiment("glue_full")).runs}
    assert glue <= {run.run_id for run in plan(get_experiment("paper_full")).runs}
    config = TrainConfig(task="rte", method={"name": "full"})
    assert dataclasses.replace(config, experiment="other").run_id == config.run_id
    assert dataclasses.replace(config, seed=1).run_id != config.run_id


def test_paper_full_packs_every_run_into_one_homogeneous_shard() -> None:
    planned = plan(get_experiment("paper_full"))
    shards = planned.shards
    groups = [[run.run_id for run in group] for group in planned.groups]
    ids = [run.run_id for shard in shards for run in shard.runs]
    assert sorted(ids) == sorted(run.run_id for run in planned.runs)  # each run exactly once
    assert len({shard.id for shard in shards}) == len(shards) < len(planned.runs) / 5
    for shard in shards:
        assert 1 <= len(shard.runs) <= planned.spec.shard_size
        hours = sum(planned.run_hours[run.run_id] for run in shard.runs)
        # a long run, or a long fused group (QQP's 8 adapter runs), is a shard alone: a group is never split
        alone = len(shard.runs) == 1 or [run.run_id for run in shard.runs] in groups
        assert hours <= planned.spec.shard_hours or alone, shard.id
        assert len({(run.task, run.backbone, run.max_length) for run in shard.runs}) == 1, shard.id
        assert planned.shard(shard.id) is shard


def test_plan_refuses_more_accelerators_than_the_quota() -> None:
    spec = dataclasses.replace(get_experiment("glue_full"), parallelism=40, max_accelerators=32)
    with pytest.raises(PlanError, match="40 NVIDIA_H100_80GB at once.*max_accelerators 32"):
        plan(spec)
    assert plan(dataclasses.replace(spec, max_accelerators=40)).peak_accelerators == 40
    two_gpus = dataclasses.replace(spec, accelerator=dataclasses.replace(H100, count=2), parallelism=16)
    assert plan(dataclasses.replace(two_gpus, max_accelerators=None)).peak_accelerators == 32


# --- the run store ---------------------------------------------------------------------------------


@pytest.mark.parametrize("root", ["local", "memory://adaptune-test"])
def test_resubmitting_trains_nothing_twice_and_aggregates_every_run(stub: Path, tmp_path: Path, root: str) -> None:
    spec = _small_spec()
    store = RunStore(tmp_path / "store" if root == "local" else f"{root}/{tmp_path.name}")
    with pytest.raises(IncompleteSweepError, match="8 of 8 planned runs have no record"):
        sweep_records(spec, store)
    assert _run_all(spec, store) == Counter(ok=8)
    assert _run_all(spec, store) == Counter(reused=8)
    assert all(stub_trainer.calls(run.run_id) == 1 for run in plan(spec).runs)
    summary = aggregate_sweep(spec, store, tmp_path / "results")
    runs = pd.read_parquet(tmp_path / "results" / "runs.parquet")
    assert sorted(runs["run_id"]) == sorted(run.run_id for run in plan(spec).runs) and summary["ok"] == 8


def test_growing_the_grid_by_a_seed_trains_only_the_new_runs(stub: Path, tmp_path: Path) -> None:
    spec = _small_spec()
    store = RunStore(tmp_path / "store")
    _run_all(spec, store)
    grown = dataclasses.replace(spec, sweeps=(dataclasses.replace(spec.sweeps[0], seeds=(0, 1, 2)),))
    assert _run_all(grown, store) == Counter(reused=8, ok=4)
    assert sum(stub_trainer.calls(run.run_id) for run in plan(grown).runs) == 12


def test_a_transient_error_is_retried_and_a_diverged_run_recorded_once(stub: Path, tmp_path: Path) -> None:
    spec = _small_spec(retries=1)
    runs = plan(spec).runs
    flaky, diverging = runs[0].run_id, runs[1].run_id
    (stub / "transient").mkdir()
    (stub / "transient" / flaky).write_text("1")  # fails once, then works
    (stub / "nan").mkdir()
    (stub / "nan" / diverging).write_text("")
    store = RunStore(tmp_path / "store")
    # Retried inside the shard (on KFP the orchestrator would not retry a ParallelFor task), with backoff.
    assert _run_all(spec, store) == Counter(ok=7, failed=1)
    assert store.files.read_json("runs", flaky, "attempts.json")["reasons"][0].startswith("ConnectionError: stub")
    assert _run_all(spec, store) == Counter(reused=8)
    assert stub_trainer.calls(flaky) == 2 and stub_trainer.calls(diverging) == 1
    assert store.record(diverging)["status"] == "failed"
    # Asked to, a resubmission trains the failed run again (and only it).
    assert _run_all(spec, store, retry_failed=True) == Counter(reused=7, failed=1)
    assert stub_trainer.calls(diverging) == 2


def test_a_transient_error_that_persists_becomes_a_failed_record(stub: Path, tmp_path: Path) -> None:
    spec = _small_spec(retries=1)
    flaky = plan(spec).runs[0].run_id
    (stub / "transient").mkdir()
    (stub / "transient" / flaky).write_text("5")
    store = RunStore(tmp_path / "store")
    assert _run_all(spec, store) == Counter(ok=7, failed=1)  # the sweep goes on without it
    assert store.record(flaky)["reason"].startswith("transient failure persisted over 2 attempts: ConnectionError: stub")
    assert stub_trainer.calls(flaky) == 2


def test_transient_errors_are_told_from_deterministic_ones() -> None:
    import torch

    assert is_transient(torch.OutOfMemoryError("CUDA out of memory"))
    assert is_transient(TimeoutError("read timed out"))
    try:
        try:
            raise ConnectionResetError("peer reset")
        except ConnectionResetError as cause:
            raise OSError("upload failed") from cause
    except OSError as wrapped:
        assert is_transient(wrapped)  # through the cause chain
    assert not is_transient(ValueError("task 'x' has no training rows"))
    assert not is_transient(FileNotFoundError("glue/RTE/train.tsv"))


@pytest.mark.slow
@pytest.mark.parametrize("root", ["local", "memory://adaptune-resume"])
def test_a_run_killed_mid_shard_resumes_in_the_next_attempt(
    tmp_path: Path, shared_data_dir: Path, monkeypatch: pytest.MonkeyPatch, root: str
) -> None:
    import adaptune.train.loop as train_module

    spec = dataclasses.replace(
        _small_spec(),
        sweeps=(Sweep(tasks=("sst2",), methods=({"name": "layernorm"},), learning_rates=(1e-3,), epochs=(2,), seeds=(0,),
                      max_length=32, batch_size=8),),
        max_train_examples=48, max_eval_examples=32,
    )
    (shard,) = plan(spec).shards
    store = RunStore(tmp_path / "store" if root == "local" else f"{root}/{tmp_path.name}")
    steps: list[int] = []
    real_step = train_module.training_step

    class Killed(BaseException):  # like SIGTERM on a preempted node: nothing in Python catches it
        pass

    def step(*args: object, **kwargs: object) -> float:
        steps.append(len(steps) + 1)
        if len(steps) == 8:  # in the second epoch, after the first epoch's state was saved
            raise Killed
        return real_step(*args, **kwargs)

    monkeypatch.setattr(train_module, "training_step", step)
    monkeypatch.setenv(STATE_EVERY_S_ENV, "0")  # a state at the first epoch's end: by default it waits a minute, this run's seconds
    with pytest.raises(Killed):
        run_shard(spec, shard.id, store, data_dir=shared_data_dir)
    assert store.record(shard.runs[0].run_id) is None
    steps.clear()
    outcome = run_shard(spec, shard.id, store, data_dir=shared_data_dir)
    assert sum(outcome.values()) == 1 and set(outcome) <= {"ok", "degenerate"}  # trained to the end, not reused
    assert len(steps) == 6  # only the second epoch's 6 steps: the first came back from the store
    record = store.record(shard.runs[0].run_id)
    assert [point["epoch"] for point in record["curve"]] == [1, 2]
    assert record["checkpoint_dir"] == store.files.url("runs", shard.runs[0].run_id, "checkpoint")


# --- the whole DAG at paper scale under kfp.local ----------------------------------------------------


@pytest.mark.heavy
@pytest.mark.slow
@pytest.mark.xdist_group("pipeline")
def test_paper_full_shaped_dag_runs_with_small_inputs_and_one_row_per_run(
    stub: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kfp.local import subprocess_task_handler

    from pipelines.local import run_local

    sizes: list[int] = []
    real_run = subprocess_task_handler.run_local_subprocess

    def measured(full_command: list[str], **options: object) -> int:
        sizes.append(max(len(argument.encode()) for argument in full_command))
        return real_run(full_command, **options)

    monkeypatch.setattr(subprocess_task_handler, "run_local_subprocess", measured)
    # paper_full's 8,800 runs in big shards (kfp.local starts a process per task), on the CPU runner.
    spec = dataclasses.replace(get_experiment("paper_full"), accelerator=CPU, shard_size=1000, shard_hours=1e9, parallelism=2)
    sweep_file = tmp_path / "paper_full.json"
    sweep_file.write_text(spec_to_json(spec))
    paths = run_local(str(sweep_file), tmp_path / "out", check_data=False)  # the stub reads no data

    planned = plan(spec)
    runs = pd.read_parquet(paths["runs.parquet"])
    assert len(planned.runs) == 8800  # paper_full, MNLI-mm scored by the MNLI runs (not planned apart)
    assert len(runs) == len(planned.runs) + sum(run.task == "mnli_m" for run in planned.runs)  # + their MNLI-mm rows
    assert set(runs[runs["task"] != "mnli_mm"]["run_id"]) == {run.run_id for run in planned.runs}
    assert len(sizes) == len(planned.shards) + 4  # plan, one task per shard, ablate, aggregate, report
    assert max(sizes) < MAX_EXECUTOR_INPUT, f"largest executor input {max(sizes)} bytes"
    assert (tmp_path / "out" / "report.md").is_file()
    assert sum(stub_trainer.calls(run.run_id) for run in planned.runs) == 8800  # each run trained once
    # Resubmitted, every shard finds its runs in the store (in-process: a second kfp.local pass is minutes).
    store = RunStore(tmp_path / "out" / "store")
    assert _run_all(spec, store) == Counter(reused=8800)


# --- MNLI once -------------------------------------------------------------------------------------


def test_mnli_is_planned_once_for_both_dev_sets() -> None:
    glue = plan(get_experiment("glue_full"))
    tasks = {run.task for run in glue.runs}
    assert "mnli_m" in tasks and "mnli_mm" not in tasks
    mismatched_only = dataclasses.replace(
        _small_spec(), sweeps=(Sweep(tasks=("mnli_mm",), methods=({"name": "full"},), learning_rates=(1e-4,)),)
    )
    assert {run.task for run in plan(mismatched_only).runs} == {"mnli_m"}  # the run that scores MNLI-mm


def test_an_mnli_record_fills_both_columns(tmp_path: Path) -> None:
    from adaptune.report.results import write_runs
    from adaptune.train.record import run_record

    record = run_record(TrainConfig(task="mnli_m", method={"name": "full"}), "accuracy")
    record.update(val_metrics={"accuracy": 0.84}, test_metrics={"accuracy": 0.82},
                  split_sizes={"train": 382702, "validation": 10000, "test": 9815},
                  companions={"mnli_mm": {"val_metrics": {"accuracy": 0.84}, "test_metrics": {"accuracy": 0.81},
                                          "split_sizes": {"train": 382702, "validation": 10000, "test": 9832}}})
    runs = pd.read_parquet(write_runs([record], tmp_path)).set_index("task")
    assert runs.loc["mnli_m", "test_score"] == 0.82 and runs.loc["mnli_mm", "test_score"] == 0.81
    assert runs.loc["mnli_m", "test_rows"] == 9815 and runs.loc["mnli_mm", "test_rows"] == 9832
    assert runs.loc["mnli_mm", "run_id"] == f"{record['run_id']}@mnli_mm"


@pytest.mark.slow
def test_a_run_scores_the_tasks_trained_as_it(tmp_path: Path, shared_data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # MNLI is not in the offline mirror: a second RTE entry trained as RTE (the shape of mnli_mm ->
    # mnli_m) must be scored by the RTE run, on its own test split (MNLI-mm: the mismatched dev set),
    # with the final model; its validation slice is the run's own (the same train file).
    from adaptune.data import tasks
    from adaptune.train.loop import train_and_evaluate

    monkeypatch.setitem(tasks.TASKS, "rte_again", dataclasses.replace(tasks.TASKS["rte"], name="rte_again", trained_as="rte"))
    config = TrainConfig(task="rte", method={"name": "layernorm"}, lr=1e-3, epochs=1, max_length=32, batch_size=16,
                         max_train_examples=32, max_eval_examples=48)
    record = train_and_evaluate(config, data_dir=shared_data_dir, out_dir=tmp_path / "run", cache_dir=tmp_path / "cache", progress=False)
    assert set(record["companions"]) == {"rte_again"}
    companion = record["companions"]["rte_again"]
    assert companion["val_metrics"] == record["val_metrics"]
    assert companion["test_metrics"] == record["test_metrics"] and companion["test_metrics"]  # same split, same final model
    assert companion["split_sizes"] == record["split_sizes"] == {"train": 32, "validation": 48, "test": 48}


def test_a_bucket_root_reads_through_the_vertex_mount_or_says_what_is_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    from adaptune.sweep import store_files as store_module
    from adaptune.sweep.store_files import StoreError

    if importlib.util.find_spec("gcsfs") is None:  # this environment's case: no GCS client library
        with pytest.raises(StoreError, match="install gcsfs, or on Vertex AI use the /gcs/<bucket> mount"):
            RunStore("gs://bucket/prefix")
    monkeypatch.setattr(store_module, "VERTEX_GCS_MOUNT", tmp_path / "gcs")
    (tmp_path / "gcs").mkdir()
    mounted = RunStore("gs://bucket/prefix")  # on Vertex AI: the Cloud Storage FUSE path, a local filesystem
    assert mounted.files.is_local and mounted.root == str(tmp_path / "gcs" / "bucket" / "prefix")
