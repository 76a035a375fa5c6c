"""Where a run's wall time goes (adaptune.train.phase_times): every record's time_s, alone and in a fused group,
over a resume, and a step-graph group's counts. Real data (MRPC from ../shared/data), the embedded backbone."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from adaptune.core.run_files import STATE_FILE
from adaptune.fused.step_graphs import STEP_GRAPHS
from adaptune.train import phase_times
from adaptune.train.config import TrainConfig
from adaptune.train.group_loop import train_group
from adaptune.train.loop import train_and_evaluate
from adaptune.train.state import Progress

SMALL = dict(task="mrpc", epochs=2, max_length=48, max_train_examples=40, max_eval_examples=24, batch_size=16,
             method={"name": "adapters", "size": 8})


class _Killed(Exception):
    pass


def _assert_phases_fill_the_wall_time(record: dict) -> None:
    times = record["time_s"]
    assert list(times) == list(phase_times.PHASES)
    assert all(seconds > 0 for seconds in times.values()), times  # each phase happened and was timed
    assert sum(times.values()) <= record["wall_time_s"] + 1e-3  # parts of the whole, none counted twice
    trained = record["config"]["epochs"] * record["split_sizes"]["train"]
    assert times["steps"] == pytest.approx(trained / record["train_examples_per_s"], abs=2e-3)  # the steps' own clock


def test_a_run_alone_records_its_time_by_phase(tmp_path: Path, shared_data_dir: Path) -> None:
    record = train_and_evaluate(TrainConfig(lr=1e-3, seed=0, **SMALL), data_dir=shared_data_dir, out_dir=tmp_path, progress=False)
    _assert_phases_fill_the_wall_time(record)
    assert record["step_graphs"] is None


def test_a_groups_runs_each_record_the_groups_time_and_step_graph_counts(tmp_path: Path, shared_data_dir: Path,
                                                                         patch_settings: Callable[..., object]) -> None:
    patch_settings(dropout_masks="counter", compile=STEP_GRAPHS)
    runs = [TrainConfig(lr=1e-3, seed=0, **SMALL), TrainConfig(lr=3e-4, seed=1, **SMALL)]
    records = train_group(runs, [tmp_path / "a", tmp_path / "b"], data_dir=shared_data_dir)
    for record in records:
        _assert_phases_fill_the_wall_time(record)
    assert records[0]["time_s"] == records[1]["time_s"]  # the group's, as its wall time
    steps = 2 * -(-40 // 16)  # epochs x batches: a CPU captures nothing, so every step ran eagerly
    assert [record["step_graphs"] for record in records] == [{"graphs": 0, "eager_steps": steps, "replayed_steps": 0, "padded_up_steps": 0,
                                                              "eager_and_capture_s": 0.0, "capture_s": 0.0, "warmup": 1}] * 2  # seconds: CUDA's only


def test_a_resumed_run_adds_the_phases_of_its_earlier_attempt(tmp_path: Path, shared_data_dir: Path) -> None:
    config = TrainConfig(lr=1e-3, seed=0, checkpoint_every_steps=2, **SMALL)

    def kill_at_step_5(step: int) -> None:  # 3 steps an epoch: the last state saved at step 4, after epoch 1's evaluation
        if step == 5:
            raise _Killed

    with pytest.raises(_Killed):
        train_and_evaluate(config, data_dir=shared_data_dir, out_dir=tmp_path, progress=False, step_callback=kill_at_step_5)
    saved = torch.load(tmp_path / STATE_FILE, weights_only=True)["progress"]["phase_s"]
    assert saved["setup"] > 0 and saved["evaluation"] > 0 and saved["saving"] > 0
    record = train_and_evaluate(config, data_dir=shared_data_dir, out_dir=tmp_path, progress=False)
    assert record["time_s"]["setup"] > saved["setup"]  # both attempts' setups
    assert record["time_s"]["evaluation"] > saved["evaluation"]


def test_an_unknown_phase_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown phase 'steps'"), phase_times.timed([Progress()], "steps"):
        pass


def test_a_shards_phases_count_each_groups_times_once() -> None:
    group = {"group_size": 2, "time_s": {"setup": 4.0, "steps": 10.0}, "step_graphs": {"graphs": 3, "eager_steps": 6}}
    # (each of the group's two records carries its times: counted once)
    alone = {"group_size": 1, "time_s": {"setup": 1.0, "steps": 2.0}, "step_graphs": None}
    assert phase_times.summed([group, group, alone]) == {"setup": 5.0, "steps": 12.0}
    assert phase_times.summed([group, group, alone], "step_graphs") == {"graphs": 3.0, "eager_steps": 6.0}
