"""Lease expiry judged by what the store shows, never by a time another machine wrote (adaptune.sweep.lease),
and the run store's edges around it: one rule for what a runs root is, a run whose folder is deleted while
it trains, retraining exactly what the user asks, no litter and no library noise.

On buckets through the `bucket` fixture: fsspec's memory:// and the GCS JSON API emulator. A bucket object
is replaced whole on every write and gets a new generation (https://cloud.google.com/storage/docs/metadata,
"Object generation"); a filesystem's atomic rename gives the lease a new inode.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from adaptune.sweep.fan_in import aggregate_sweep
from adaptune.sweep.lease import LEASE_SECONDS_ENV, Holder, Lease, LeaseWatch, try_acquire
from adaptune.sweep.plan import plan
from adaptune.sweep.shard_runner import run_in_store
from adaptune.sweep.status import sweep_status
from adaptune.sweep.status_text import format_status
from adaptune.sweep.store import RunStore
from adaptune.sweep.store_files import StoreError
from bench.stand_ins import stub_trainer
from tests.gcs_emulator import bucket, gcs, gcs_emulator  # noqa: F401 (bucket, gcs: fixtures)
from tests.test_store_faults import _run, _spec

DEAD_POD_LEASE = {"owner": "dead-pod-1234", "acquired_at": time.time(), "taken_at": time.time(), "expires_at": time.time() + 10 * 365 * 86400}


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


# --- expiry by the store's versions, on the waiter's clock ------------------------------------------------


def test_a_dead_workers_far_future_lease_expires_after_one_lease_length_on_the_waiters_clock(bucket: str) -> None:
    store = RunStore(bucket)
    store.files.write_json(DEAD_POD_LEASE, "runs", "run-a", "lease-1.json")
    clock = FakeClock()
    watch = LeaseWatch(clock)
    first = try_acquire(store, "run-a", owner="waiter", seconds=10, watch=watch)
    assert isinstance(first, Holder) and first.owner == "dead-pod-1234"
    assert first.describe() == "held by dead-pod-1234, taken over in at most 10 s unless its holder renews it"  # not 315,359,981 s
    clock.now = 9.5
    assert isinstance(try_acquire(store, "run-a", owner="waiter", seconds=10, watch=watch), Holder)
    clock.now = 10.0
    taken = try_acquire(store, "run-a", owner="waiter", seconds=10, watch=watch)
    assert isinstance(taken, Lease) and taken.number == 2 and taken.still_held()


@pytest.mark.parametrize("skew_s", [-3600.0, 3600.0])
def test_a_live_holder_whose_clock_is_off_by_more_than_the_lease_length_is_never_taken_over(bucket: str, skew_s: float) -> None:
    """Behind: its expires_at lies in the past the moment it is written; ahead: an hour beyond the lease length.
    Either way the waiter sees the lease change every renewal and waits, then takes it once the holder is gone."""
    store = RunStore(bucket)
    holder = try_acquire(store, "run-a", owner="skewed", seconds=0.6)
    assert isinstance(holder, Lease)
    honest = holder.content
    holder.content = lambda: {**honest(), **{key: honest()[key] + skew_s for key in ("acquired_at", "taken_at", "expires_at")}}
    watch = LeaseWatch()
    with holder.kept_alive():
        holder.renew()
        deadline = time.monotonic() + 2.0  # more than three lease lengths
        while time.monotonic() < deadline:
            assert isinstance(try_acquire(store, "run-a", owner="waiter", seconds=0.6, watch=watch), Holder)
            time.sleep(0.05)
    assert isinstance(try_acquire(store, "run-a", owner="waiter", seconds=0.6, watch=watch), Holder)  # silent: not yet a lease length
    time.sleep(0.7)
    assert isinstance(try_acquire(store, "run-a", owner="waiter", seconds=0.6, watch=watch), Lease)
    assert not holder.still_held()


def test_a_shard_trains_the_runs_a_dead_worker_and_a_stray_lease_name_block(stub: Path, bucket: str, monkeypatch: pytest.MonkeyPatch,
                                                                               capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv(LEASE_SECONDS_ENV, "1")
    spec = _spec()
    dead, stray = plan(spec).runs[0].run_id, plan(spec).runs[1].run_id
    store = RunStore(bucket)
    store.files.write_json(DEAD_POD_LEASE, "runs", dead, "lease-1.json")
    store.files.write_json(DEAD_POD_LEASE, "runs", stray, "lease-01.json")  # a name the store does not write
    running = sweep_status(spec, store)
    assert running.count("running") == 1 and [run.run_id for run in running.running] == [dead]
    assert "renewed 0 s ago" in format_status(running)  # by the store's timestamp, not its claimed expiry
    started = time.monotonic()
    assert _run(spec, store) == Counter(ok=4)
    assert time.monotonic() - started < 30
    assert stub_trainer.calls(dead) == stub_trainer.calls(stray) == 1
    assert "taken over in at most 1 s" in capsys.readouterr().out


def test_status_shows_a_lease_the_store_has_not_seen_renewed_for_a_lease_length_as_interrupted(stub: Path, bucket: str,
                                                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(LEASE_SECONDS_ENV, "10")
    spec = _spec()
    dead = plan(spec).runs[0].run_id
    store = RunStore(bucket)
    store.files.write_json(DEAD_POD_LEASE, "runs", dead, "lease-1.json")
    later = sweep_status(spec, store, now=time.time() + 11)
    assert later.count("running") == 0 and later.interrupted == 1


# --- one rule for what a runs root is -----------------------------------------------------------------------


def test_a_file_or_a_bucket_object_as_the_runs_root_is_refused_alike_by_every_command_and_the_shard(
    stub: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from pipelines.__main__ import main

    (tmp_path / "a-file").write_text("")
    with gcs_emulator(log_dir=tmp_path) as emulator:
        RunStore(emulator.url("")).files.fs.pipe_file(RunStore(emulator.url("object")).files.path(), b"not a folder")
        for root, line in [(str(tmp_path / "a-file"), f"run store {tmp_path / 'a-file'} is a file, not a folder"),
                           (str(tmp_path / "a-file" / "under"), f"run store {tmp_path / 'a-file' / 'under'} lies under {tmp_path / 'a-file'}, "
                                                                "which is a file, not a folder"),
                           (emulator.url("object"), f"run store {emulator.url('object')} is a file, not a folder"),
                           (emulator.url("object/under"), f"run store {emulator.url('object/under')} lies under {emulator.url('object')}, "
                                                          "which is a file, not a folder")]:
            with pytest.raises(StoreError) as refused:
                _run(_spec(), RunStore(root))
            assert str(refused.value).startswith(line)
            for command in (["status", "smoke"], ["report", "smoke", "--out", str(tmp_path / "report")]):
                assert main([*command, "--runs-root", root]) == 2
                err = capsys.readouterr().err
                assert err.count("\n") == 1 and line in err, (command, err)
    assert not (stub / "calls").exists()  # nothing trained


# --- a run whose folder is deleted while it trains ------------------------------------------------------------


@pytest.fixture(params=["directory", "memory", "gcs"])
def any_root(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "gcs":
        return request.getfixturevalue("gcs").url("store")
    return str(tmp_path / "store") if request.param == "directory" else f"memory://adaptune-bucket/{tmp_path.name}"


def test_a_run_whose_folder_is_deleted_while_it_trains_publishes_its_record(stub: Path, any_root: str, monkeypatch: pytest.MonkeyPatch,
                                                                           capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv(LEASE_SECONDS_ENV, "1.5")
    monkeypatch.setenv("STUB_SLEEP_S", "2.5")
    monkeypatch.setenv("STUB_SYNC_EVERY_S", "0.3")
    config = plan(_spec()).runs[0]
    store = RunStore(any_root)

    def delete_the_folder_mid_run() -> None:
        while not store.files.names("runs", config.run_id):
            time.sleep(0.05)
        time.sleep(0.8)
        store.files.remove("runs", config.run_id)

    deleter = threading.Thread(target=delete_the_folder_mid_run)
    deleter.start()
    assert run_in_store(config, store, owner="trainer") == "ok"
    deleter.join()
    assert store.record(config.run_id)["status"] == "ok" and stub_trainer.calls(config.run_id) == 1
    assert "superseded" not in capsys.readouterr().out
    assert not [name for name in store.files.names("runs", config.run_id) if name.startswith("lease-")]  # released


def test_a_run_taken_over_after_its_folder_was_deleted_says_so_in_one_true_line(stub: Path, tmp_path: Path,
                                                                                capsys: pytest.CaptureFixture[str]) -> None:
    config = plan(_spec()).runs[0]
    store = RunStore(tmp_path / "store")
    ours = try_acquire(store, config.run_id, owner="ours", seconds=60)
    assert isinstance(ours, Lease)
    store.files.remove("runs", config.run_id)
    assert isinstance(try_acquire(store, config.run_id, owner="other", seconds=60), Lease)  # the folder is empty: theirs now
    assert not ours.reclaim()
    from adaptune.sweep.run_attempt import _publish

    record = stub_trainer.train(config, out_dir=tmp_path, write_record=False)
    assert _publish(config, record, ours, store, None) == "superseded"
    assert "another attempt (other) took the run over while this one trained" in capsys.readouterr().out
    assert store.record(config.run_id) is None


# --- retrain exactly what the user asks ------------------------------------------------------------------------


def test_failed_runs_and_unreadable_records_are_retrained_each_by_their_own_flag(stub: Path, tmp_path: Path) -> None:
    spec = _spec()
    runs = [run.run_id for run in plan(spec).runs]
    (stub / "nan").mkdir()
    (stub / "nan" / runs[0]).write_text("")
    store = RunStore(tmp_path / "store")
    assert _run(spec, store) == Counter(ok=3, failed=1)
    (tmp_path / "store" / "runs" / runs[1] / "record.json").write_text("{truncated")
    assert _run(spec, store, retry_failed=True) == Counter(reused=2, unreadable=1, failed=1)  # the failed one, again
    assert stub_trainer.calls(runs[0]) == 2 and stub_trainer.calls(runs[1]) == 1
    assert _run(spec, store, retry_unreadable=True) == Counter(reused=3, ok=1)  # the unreadable one alone
    assert stub_trainer.calls(runs[0]) == 2 and stub_trainer.calls(runs[1]) == 2
    assert any(name.startswith("record.json.unreadable-") for name in store.files.names("runs", runs[1]))
    (tmp_path / "store" / "runs" / runs[2] / "record.json").write_text("[]")
    assert _run(spec, store, retry_failed=True, retry_unreadable=True) == Counter(reused=2, failed=1, ok=1)  # both
    assert stub_trainer.calls(runs[0]) == 3 and stub_trainer.calls(runs[2]) == 2


# --- no litter, no noise -----------------------------------------------------------------------------------------


def test_the_fan_in_removes_the_lease_and_state_a_kill_after_publishing_left(stub: Path, bucket: str, tmp_path: Path) -> None:
    spec = _spec()
    store = RunStore(bucket)
    assert _run(spec, store) == Counter(ok=4)
    killed = plan(spec).runs[0].run_id
    store.files.write_json({"owner": "killed-after-publishing", "taken_at": time.time()}, "runs", killed, "lease-3.json")
    store.files.fs.pipe_file(store.files.path("runs", killed, "train_state.pt"), b"29 MB to 4 GB")
    aggregate_sweep(spec, store, tmp_path / "results")
    assert store.files.names("runs", killed) == ["record.json"]


def test_a_lease_vanishing_between_listing_and_reading_and_a_set_aside_log_nothing(bucket: str, caplog: pytest.LogCaptureFixture) -> None:
    store = RunStore(bucket)
    store.files.write_json({"run_id": "run-a"}, "runs", "run-a", "record.json")
    with caplog.at_level(logging.WARNING):
        assert store.files.read_json("runs", "run-a", "lease-7.json") is None
        assert store.files.read_json_many([("runs", "run-b", "lease-1.json")]) == {}
        kept = store.files.set_aside("runs", "run-a", "record.json")
    assert store.files.names("runs", "run-a") == [kept]
    assert json.loads(store.files.fs.cat_file(store.files.path("runs", "run-a", kept))) == {"run_id": "run-a"}
    assert [record.getMessage() for record in caplog.records] == []
