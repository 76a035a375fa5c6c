"""What makes a local sweep fast keeps its results' meaning: each component's thread share, the curve's validation
subset (the result still the whole split's), and the CPU preset's fused groups (bench/peer.py times them)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from adaptune.data.batching import column_values
from adaptune.data.loading import load_task_data
from adaptune.data.tasks import get_task
from adaptune.sweep.experiments import get_experiment
from adaptune.sweep.plan import plan
from adaptune.sweep.spec_file import spec_from_dict
from adaptune.train import evaluate
from adaptune.train.config import TrainConfig
from adaptune.train.evaluate import EvalSplit, curve_split, scored_outputs
from adaptune.train.loop import train_and_evaluate
from pipelines.local_threads import CoreShare, ThreadCountError
from pipelines.reproduction import build_pipeline

REPO = Path(__file__).resolve().parents[1]


def test_a_one_shard_sweep_gets_every_core_and_shards_at_once_share_them() -> None:
    one_shard = plan(spec_from_dict({"name": "one", "accelerator": "cpu", "parallelism": 2, "shard_size": 8,
                                     "sweeps": [{"tasks": ["mrpc"], "methods": ["adapters:16"], "learning_rates": [1e-3], "epochs": [1], "seeds": [0, 1]}]}))
    assert len(one_shard.shards) == 1
    share = CoreShare.for_plan(one_shard, environ={}, cores=2)
    assert (share.shard_threads, share.step_threads, share.shards_at_once) == (2, 2, 1)
    smoke = plan(get_experiment("smoke"))  # two shards, parallelism 2: one core each, every core for the other steps
    assert len(smoke.shards) >= 2
    assert (CoreShare.for_plan(smoke, environ={}, cores=2).shard_threads, CoreShare.for_plan(smoke, environ={}, cores=8).shard_threads) == (1, 4)
    kept = CoreShare.for_plan(smoke, environ={"OMP_NUM_THREADS": "1"}, cores=2)
    assert kept.user_set and kept.environment(shard=False) == {"OMP_NUM_THREADS": "1"}
    assert "OMP_NUM_THREADS as set" in kept.line()


@pytest.mark.parametrize("asked", ["3", "0", "two"])
def test_a_thread_count_the_machine_cannot_hold_is_refused_with_what_it_can_hold(asked: str) -> None:
    with pytest.raises(ThreadCountError, match="at most 2 threads.*from 1 to 2"):
        CoreShare.for_plan(plan(get_experiment("smoke")), environ={"OMP_NUM_THREADS": asked}, cores=2)


def test_pipelines_run_refuses_an_impossible_thread_count_in_one_line_before_anything_runs(tmp_path: Path) -> None:
    import os

    too_many = str(len(os.sched_getaffinity(0)) + 1)
    done = subprocess.run([sys.executable, "-m", "pipelines", "run", "smoke", "--out", str(tmp_path / "out")], cwd=REPO,
                          capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": too_many})
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().count("\n") == 0 and f"OMP_NUM_THREADS='{too_many}'" in done.stderr
    assert not (tmp_path / "out" / "kfp_root").exists()


def test_each_compiled_task_carries_its_thread_share(tmp_path: Path) -> None:
    from kfp import compiler

    spec = get_experiment("smoke")
    share = CoreShare(cores=4, shards_at_once=2, shard_threads=2, step_threads=4)
    compiler.Compiler().compile(build_pipeline(spec, threads=share), str(tmp_path / "local.json"))
    executors = json.loads((tmp_path / "local.json").read_text())["deploymentSpec"]["executors"]
    threads = {name: {e["name"]: e["value"] for e in body["container"].get("env", [])}.get("OMP_NUM_THREADS")
               for name, body in executors.items()}
    assert threads["exec-train-shard"] == "2"
    assert {name: value for name, value in threads.items() if name != "exec-train-shard"} == {
        name: "4" for name in threads if name != "exec-train-shard"}
    tokenizer = {name: {e["name"]: e["value"] for e in body["container"].get("env", [])}.get("TOKENIZERS_PARALLELISM")
                 for name, body in executors.items()}
    assert tokenizer["exec-prepare-data"] == "true" and tokenizer["exec-train-shard"] is None  # a shard may fork after
    compiler.Compiler().compile(build_pipeline(spec), str(tmp_path / "cloud.json"))  # compiled for a cluster: the node's
    assert "OMP_NUM_THREADS" not in (tmp_path / "cloud.json").read_text()


def test_the_curve_subset_is_seeded_and_scored_from_the_whole_splits_outputs(shared_data_dir: Path) -> None:
    task = get_task("sst2")
    validation = load_task_data(task, shared_data_dir, splits=("validation",))["validation"]
    labels = column_values(validation, "label")
    split = EvalSplit("validation", [{"input_ids": [101, index, 102]} for index in range(len(labels))], references=labels)
    subset = curve_split(split)
    assert len(subset.rows) == evaluate.CURVE_ROWS < len(labels)
    assert subset.positions == sorted(subset.positions) and curve_split(split).positions == subset.positions  # seeded
    assert set(np.asarray(labels)[subset.positions]) == set(labels)
    logits = list(np.random.default_rng(0).normal(size=(len(labels), 2)))
    whole = scored_outputs(task, split, logits)
    assert whole.on_subset(task, subset).metrics == scored_outputs(task, subset, [logits[i] for i in subset.positions]).metrics
    assert curve_split(subset.parent, rows=len(labels)) is split  # a split no larger than the limit is its own curve


def test_a_runs_curve_scores_the_subset_and_its_result_the_whole_split(tmp_path: Path, shared_data_dir: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(evaluate, "CURVE_ROWS", 50)
    config = TrainConfig(task="sst2", method={"name": "adapters", "size": 16}, lr=3e-3, epochs=2, max_length=64,
                         max_train_examples=96, max_eval_examples=160)
    record = train_and_evaluate(config, data_dir=shared_data_dir, out_dir=tmp_path, cache_dir=tmp_path / "cache", progress=False)
    assert record["status"] in ("ok", "degenerate") and record["curve_rows"] == 50
    assert record["split_sizes"]["validation"] == 160
    for point in record["curve"]:  # accuracy over 50 rows: a multiple of 1/50
        assert point["val_metrics"]["accuracy"] * 50 == pytest.approx(round(point["val_metrics"]["accuracy"] * 50))
    assert record["val_metrics"]["accuracy"] * 160 == pytest.approx(round(record["val_metrics"]["accuracy"] * 160))


def test_a_float32_cpu_trains_the_planned_groups_one_run_at_a_time_and_plans_the_same_shards(monkeypatch: pytest.MonkeyPatch,
                                                                                              tmp_path: Path) -> None:
    """The CPU preset fuses 4 runs where the CPU trains in bf16 and none in float32 (measured: bench/LOG.md), and
    every machine plans the same groups and shards whatever its precision; a group size a sweep file sets holds in both."""
    from adaptune.core import environment
    from adaptune.sweep import shard_runner
    from adaptune.sweep.device_sharing import runs_per_group
    from adaptune.sweep.spec import CPU
    from adaptune.sweep.store import RunStore

    assert (runs_per_group(CPU), runs_per_group(CPU, "cpu:bf16"), runs_per_group(CPU, "cpu")) == (4, 4, 1)
    with environment.patch(runs_per_group=3):
        assert runs_per_group(CPU, "cpu") == 3  # the user's variable first
    set_in_file = spec_from_dict({"name": "f", "accelerator": {"family": "cpu", "runs_per_group": 2},
                                  "sweeps": [{"tasks": ["mrpc"], "methods": ["adapters:8"], "learning_rates": [1e-3], "epochs": [1], "seeds": [0]}]})
    assert (runs_per_group(set_in_file.accelerator, "cpu"), runs_per_group(set_in_file.accelerator, "cpu:bf16")) == (2, 2)

    spec = spec_from_dict({"name": "four", "accelerator": "cpu", "shard_size": 8, "retries": 0, "pod_retries": 0,
                           "sweeps": [{"tasks": ["mrpc"], "methods": ["adapters:8"], "learning_rates": [1e-3, 3e-4], "epochs": [1], "seeds": [0, 1]}]})
    (shard,) = plan(spec).shards
    assert [len(group) for group in plan(spec).groups] == [4]
    trained_at: dict[str, int] = {}
    for device in ("cpu", "cpu:bf16"):
        monkeypatch.setattr(shard_runner, "prepare_machine", lambda store, backbones, device=device: device)
        monkeypatch.setattr(shard_runner, "train_runs", lambda runs, shard_id, store, options, fused, device=device:
                            trained_at.update({device: fused}) or {run.run_id: "ok" for run in runs})
        shard_runner.run_shard(spec, shard.id, RunStore(str(tmp_path / device.replace(":", "_"))))
    assert trained_at == {"cpu": 1, "cpu:bf16": 4}
