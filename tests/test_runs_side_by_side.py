"""Several runs of a shard trained side by side on one device (adaptune.sweep.shard_runner, `runs_at_once`):
each run once, with the result it has when trained alone, and the leases still guarding every run."""

from __future__ import annotations

import dataclasses
from collections import Counter
from pathlib import Path

import pytest

from adaptune.sweep.experiments import Sweep, get_experiment
from adaptune.sweep.plan import plan
from adaptune.sweep.shard_runner import RUNS_PER_DEVICE_ENV, run_shard, runs_per_device
from adaptune.sweep.store import RunStore
from tests import stub_trainer


def _spec():
    return dataclasses.replace(
        get_experiment("smoke"), name="side_by_side", ablation=None, shard_size=8, retries=0,
        sweeps=(Sweep(tasks=("rte",), methods=({"name": "full"}, {"name": "layernorm"}), learning_rates=(1e-4, 3e-4), epochs=(1,),
                      seeds=(0, 1), max_length=32),),
    )


def test_runs_side_by_side_are_each_trained_once_by_several_processes_with_the_results_of_one_at_a_time(
        stub: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = _spec()
    (shard,) = plan(spec).shards
    alone, side_by_side = RunStore(tmp_path / "alone"), RunStore(tmp_path / "side")
    assert run_shard(spec, shard.id, alone, runs_at_once=1) == Counter(ok=8)
    monkeypatch.setenv("STUB_SLEEP_S", "0.5")  # long enough for every worker to start before the queue is empty
    assert run_shard(spec, shard.id, side_by_side, runs_at_once=3) == Counter(ok=8)

    assert all(stub_trainer.calls(run.run_id) == 2 for run in shard.runs)  # once into each store
    records = {run.run_id: (alone.record(run.run_id), side_by_side.record(run.run_id)) for run in shard.runs}
    assert len({one["stub_pid"] for one, _ in records.values()}) == 1
    assert len({other["stub_pid"] for _, other in records.values()}) > 1  # trained by more than one process
    for one, other in records.values():
        assert (one["val_metrics"], one["test_metrics"]) == (other["val_metrics"], other["test_metrics"])
    assert not list((tmp_path / "side").rglob("lease-*.json"))  # every lease given back

    assert run_shard(spec, shard.id, side_by_side, runs_at_once=3) == Counter(reused=8)


def test_runs_per_device_comes_from_the_accelerator_or_the_environment_and_refuses_nonsense(monkeypatch: pytest.MonkeyPatch) -> None:
    accelerator = dataclasses.replace(_spec().accelerator, runs_per_device=4)
    assert runs_per_device(accelerator) == 4
    monkeypatch.setenv(RUNS_PER_DEVICE_ENV, "2")
    assert runs_per_device(accelerator) == 2
    for bad in ("0", "two"):
        monkeypatch.setenv(RUNS_PER_DEVICE_ENV, bad)
        with pytest.raises(ValueError, match="whole number >= 1"):
            runs_per_device(accelerator)
