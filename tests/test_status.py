"""`python -m pipelines status`: every kind of run in one store, counted exactly, on a directory and a bucket."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from adaptune.core.files import json_text
from adaptune.data.tasks import get_task
from adaptune.sweep.lease import try_acquire
from adaptune.sweep.plan import plan
from adaptune.sweep.spec_file import spec_from_dict
from adaptune.sweep.status import sweep_status
from adaptune.sweep.status_text import format_status
from adaptune.sweep.store import RUNS_DIR, STATE_FILE, RunStore
from adaptune.train.config import TrainConfig
from adaptune.train.record import run_record
from pipelines.__main__ import main
from tests.gcs_emulator import gcs  # noqa: F401  (the fixture)

# 12 runs in plan order: rte full s0-2, rte adapters8 s0-2, mrpc full s0-2, mrpc adapters8 s0-2; one run per
# shard, two shards at once, 1,000 training examples each.
SWEEP = {
    "name": "status_check", "backbone": "all-MiniLM-L6-v2", "accelerator": "cpu", "max_train_examples": 1000,
    "parallelism": 2, "shard_size": 1,
    "sweeps": [{"tasks": ["rte", "mrpc"], "methods": ["full", "adapters:8"], "learning_rates": [1e-4], "epochs": [3], "seeds": [0, 1, 2]}],
}
HOUR = 3600.0


def finished(config: TrainConfig, status: str = "ok", reason: str | None = None, wall_time_s: float | None = HOUR) -> dict:
    record = run_record(config, get_task(config.task).primary_metric, device="cpu")
    record.update(status=status, reason=reason, wall_time_s=wall_time_s, split_sizes={"train": 1000, "validation": 100, "test": 100},
                  val_metrics={"accuracy": 0.6}, test_metrics={"accuracy": 0.6})
    return record


def fill_store(store: RunStore) -> list[TrainConfig]:
    """One run of every kind: ok, degenerate, failed (two reasons), in progress, interrupted, stale, not started."""
    runs = plan(spec_from_dict(SWEEP)).runs
    for config in runs[:3]:  # 1 h each for 1,000 rows x 3 epochs: 0.83 examples/s
        store.publish_record({**finished(config), "time_s": {"setup": 360.0, "steps": 2520.0, "evaluation": 540.0, "saving": 180.0}})
    store.publish_record(finished(runs[3], "degenerate", "validation predictions are all one class"))
    store.publish_record(finished(runs[4], "failed", "ValueError: non-finite training loss (nan) at step 12", None))
    store.publish_record(finished(runs[5], "failed", "ValueError: non-finite training loss (nan) at step 40", None))
    store.publish_record(finished(runs[6], "failed", "DataError: rte's train.tsv has no label column", None))
    try_acquire(store, runs[7].run_id, owner="pod-a", seconds=900)  # training now
    expired = {"owner": "pod-dead", "acquired_at": time.time() - 7200, "taken_at": time.time() - 3600, "expires_at": time.time() - 2700}
    store.files.create_exclusive(json_text(expired).encode(), RUNS_DIR, runs[8].run_id, "lease-1.json")  # its pod died an hour ago:
    written = store.files.modified_times  # the store last wrote its lease then (status judges by the store's timestamp alone)
    store.files.modified_times = lambda paths: {parts: stamp - (HOUR if parts[1] == runs[8].run_id else 0.0)  # type: ignore[method-assign]
                                          for parts, stamp in written(paths).items()}
    store.publish_record({**finished(runs[9]), "data_scheme": "glue-1"})  # made before GLUE's validation slice
    store.files.write_json({"saved": True}, RUNS_DIR, runs[10].run_id, STATE_FILE)  # an interrupted run's state, no lease
    return runs  # runs[11]: nothing at all


@pytest.fixture(autouse=True)
def summary_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("ADAPTUNE_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture(params=["directory", "bucket"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> RunStore:
    if request.param == "directory":
        return RunStore(tmp_path / "store")
    return RunStore(request.getfixturevalue("gcs").url("store"))


def test_status_counts_every_kind_of_run_exactly(store: RunStore) -> None:
    runs = fill_store(store)
    status = sweep_status(spec_from_dict(SWEEP), store)

    assert status.planned == 12
    assert {state: status.count(state) for state in ("ok", "degenerate", "failed", "running", "not started", "stale")} == {
        "ok": 3, "degenerate": 1, "failed": 3, "running": 1, "not started": 3, "stale": 1}
    assert status.interrupted == 2  # the expired lease and the saved state
    by_task = status.by("task")
    assert list(by_task.index) == ["rte", "mrpc"]
    assert by_task.loc["rte"].to_dict() == {"planned": 6, "ok": 3, "degenerate": 1, "failed": 2, "running": 0, "not started": 0, "stale": 0, "unreadable": 0}
    assert by_task.loc["mrpc"].to_dict() == {"planned": 6, "ok": 0, "degenerate": 0, "failed": 1, "running": 1, "not started": 3, "stale": 1, "unreadable": 0}
    assert status.by("method").loc["adapters8", "planned"] == 6

    [running] = status.running
    assert running.run_id == runs[7].run_id and running.owner == "pod-a" and 0 <= running.held_s < 60
    assert [(group.reason, group.count, group.example) for group in status.failures] == [
        ("ValueError: non-finite training loss (nan) at step #", 2, runs[4].run_id),
        ("DataError: rte's train.tsv has no label column", 1, runs[6].run_id),
    ]
    # Spent: the 4 finished runs with a wall time (the stale one is counted apart). Left: runs 7, 8, 10 and
    # 11, each 1,000 x 3 examples at the measured 0.83 examples/s = 1 h; 2 shards at once: 2 h.
    assert status.spent_hours == pytest.approx(4.0)
    assert status.remaining_hours == pytest.approx(4.0)
    assert status.eta_hours == pytest.approx(2.0)
    assert "measured by the run store's records" in status.estimate_basis and "from 3 run(s)" in status.estimate_basis
    # Where the time went: the three records that say (the degenerate one predates time_s)
    assert status.spent_by_phase == {"setup": 1080.0, "steps": 7560.0, "evaluation": 1620.0, "saving": 540.0}

    text = format_status(status)
    assert "12 runs planned" in text and "finished 7 (58.3%): 3 ok, 1 degenerate, 3 failed" in text
    assert "in progress 1" in text and "not started 3 (2 of them interrupted" in text and "stale 1" in text
    assert "  where it went: 70% steps, 15% evaluation, 10% setup, 5% saving" in text
    assert f"    2  {runs[4].run_id}  ValueError: non-finite training loss (nan) at step #" in text


def test_the_status_command_reads_a_sweep_file_and_refuses_a_missing_store(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sweep = tmp_path / "status_check.yaml"
    sweep.write_text(json.dumps(SWEEP))
    fill_store(RunStore(tmp_path / "store"))
    assert main(["status", str(sweep), "--runs-root", str(tmp_path / "store")]) == 0
    assert "status_check: 12 runs planned" in capsys.readouterr().out

    assert main(["status", str(sweep), "--runs-root", str(tmp_path / "nowhere")]) == 2
    assert "nowhere does not exist" in capsys.readouterr().err


def test_a_second_status_reads_only_the_records_written_since(store: RunStore, monkeypatch: pytest.MonkeyPatch) -> None:
    runs = fill_store(store)
    spec = spec_from_dict(SWEEP)
    sweep_status(spec, store)
    reads: list[tuple[str, ...]] = []
    read_json = store.files.read_json
    monkeypatch.setattr(store.files, "read_json", lambda *parts: reads.append(parts) or read_json(*parts))
    store.forget(runs[4].run_id)  # retried: a new record, a new version in the store
    store.publish_record(finished(runs[4]))
    store.publish_record(finished(runs[11]))
    status = sweep_status(spec, store)
    assert sorted(parts[1] for parts in reads if parts[-1] == "record.json") == sorted([runs[4].run_id, runs[11].run_id])
    assert (status.count("ok"), status.count("failed"), status.count("not started")) == (5, 2, 2)


@pytest.mark.parametrize(("cpu_precision", "measured"), [("bf16", True), ("float32", False)])
def test_a_bf16_sweeps_status_learns_from_its_own_records(cpu_precision: str, measured: bool, tmp_path: Path) -> None:
    """Records made in bf16 on the CPU ("cpu:bf16") price the rest of a sweep pinned to bf16, not one
    pinned to float32, whose runs step half as fast (throughput.measure_on)."""
    store = RunStore(tmp_path / "store")
    spec = spec_from_dict({**SWEEP, "accelerator": {"cpu_precision": cpu_precision}})
    for config in plan(spec).runs[:3]:
        store.publish_record({**finished(config), "device": "cpu:bf16"})
    status = sweep_status(spec, store)
    assert ("measured by the run store's records" in status.estimate_basis) is measured
    assert ("full on cpu: 0.8 examples/s from 3 run(s)" in status.estimate_basis) is measured
