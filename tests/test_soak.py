"""The run store's soak (bench/soak.py) at CI size: two overlapping submissions of 200 stub runs in a
bucket on the GCS emulator, workers SIGKILLed inside runs, between publishing a record and releasing its
lease, and while waiting for a held run, then restarted; transient and diverging runs; long runs that
cross lease renewals while syncing; dead workers' far-future leases, stray lease names, workers whose
clocks run a minute ahead and behind, run folders deleted mid-run; and the same through a flaky bucket. `make bench-soak`
runs the same driver at 10,000 runs, through a flaky bucket."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.soak import SoakSettings, run_soak
from tests.gcs_emulator import gcs_emulator


@pytest.mark.slow
def test_the_soak_loses_nothing_and_trains_each_run_as_often_as_its_faults_explain(tmp_path: Path) -> None:
    settings = SoakSettings(runs=200, kills=6, transient=8, diverging=3, long_runs=12, workers=3, shard_size=40, dead_leases=3,
                            stray_leases=3, deleted_folders=2, deadline_s=600)
    with gcs_emulator(log_dir=tmp_path) as emulator:
        result = run_soak(settings, emulator.url("soak"), tmp_path / "control", tmp_path / "workers.log")
    assert result["runs"] == 200
    assert result["kills_by_point"]["inside"] == 2 and result["kills_by_point"]["publish"] == 2  # catch-up kills need a wait
    assert result["worker_exits"]["killed"] == result["kills"] >= 4
    assert result["lost"] == 0 and result["duplicated"] == 0 and result["trained_less_than_expected"] == 0
    assert result["hung"] == 0 and result["trained_twice"] == 0 and result["folders_deleted"] == 2
    assert result["failed_are_the_diverging"] and result["leases_left"] == 0 and result["states_left"] == 0
    assert result["status"] == {"ok": 197, "failed": 3, "running": 0, "not started": 0, "unreadable": 0}
    assert result["aggregate_runs"] == result["parquet_rows"] == 200


@pytest.mark.slow
def test_through_a_flaky_bucket_no_run_waits_on_itself_and_none_it_trained_is_called_reused(tmp_path: Path) -> None:
    """The same soak with 5% of the workers' requests answered 503 or 429, half of them after the emulator did the
    write (GCS may fail a request after making its change: https://cloud.google.com/storage/docs/retry-strategy).
    Before, an attempt whose lease create was answered so waited on its own lease, and one whose record create was
    called its own fresh run "reused" (29 and 4 times in a 200-run soak)."""
    settings = SoakSettings(runs=100, kills=3, transient=4, diverging=2, long_runs=6, workers=3, shard_size=25, dead_leases=2,
                            stray_leases=2, deleted_folders=1, deadline_s=600, flaky_share=0.05)
    with gcs_emulator(log_dir=tmp_path) as emulator:
        result = run_soak(settings, emulator.url("soak"), tmp_path / "control", tmp_path / "workers.log", emulator.endpoint)
    assert result["bucket_faults"]["before"] >= 20 and result["bucket_faults"]["after"] >= 20
    assert result["waited_on_self"] == 0 and result["reported_reused"] == 0
    assert result["lost"] == 0 and result["hung"] == 0 and result["trained_twice"] == 0 and result["duplicated"] == 0
    assert result["leases_left"] == 0 and result["states_left"] == 0 and result["worker_tracebacks"] == 0
    assert result["status"]["ok"] == 98 and result["aggregate_runs"] == result["parquet_rows"] == 100
