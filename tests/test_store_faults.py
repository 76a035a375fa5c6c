"""The run store under faults, on buckets: `memory://` (fsspec's in-memory filesystem) and the GCS JSON
API emulator (tests/gcs_emulator.py, fake-gcs-server on the loopback).

What a bucket store must hold to (GCS semantics: whole-object writes, last writer wins,
https://cloud.google.com/storage/docs/consistency; create-only uploads with ifGenerationMatch=0,
https://cloud.google.com/storage/docs/request-preconditions):
- the store's own files (attempts.json, lease-<n>.json, record.json) are only ever written by the store's
  own calls: a run's scratch copy never uploads them back over fresher ones;
- a record or lease that cannot be read is one line naming the run and the file: status lists it, the
  shard goes on, --retry-unreadable retrains it (the file kept aside) and --retry-failed does not; an
  unreadable lease ends as any lease does, once the store shows it unchanged for a lease length;
- a root that does not exist, or cannot be written, is refused with one line before anything runs;
- a create-only write whose answer is an error though the write was made (GCS may fail a request after changing
  the object, https://cloud.google.com/storage/docs/retry-strategy; gcsfs then retries the ifGenerationMatch=0
  upload and hears 412; Cloud Storage FUSE answers EIO) is settled by reading back: a lease whose owner is this
  attempt is its own (it never waits on itself), a record holding the bytes it published is published (ok, its
  resume state removed, never "reused").
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from adaptune.sweep import store_files
from adaptune.sweep.experiments import get_experiment
from adaptune.sweep.fan_in import IncompleteSweepError, aggregate_sweep
from adaptune.sweep.lease import LEASE_SECONDS_ENV, Holder, Lease, try_acquire
from adaptune.sweep.plan import plan
from adaptune.sweep.retrain import RetrainPolicy
from adaptune.sweep.shard_runner import run_in_store, run_shard
from adaptune.sweep.spec import Sweep
from adaptune.sweep.status import sweep_status
from adaptune.sweep.status_text import format_status
from adaptune.sweep.store import RunStore
from adaptune.sweep.store_files import StoreError
from bench.stand_ins import stub_trainer
from bench.stand_ins.flaky_proxy import Fault, Request
from tests.gcs_emulator import bucket, flaky_gcs_emulator, gcs_emulator  # noqa: F401 (bucket: a fixture)


def _spec(**changes: object):
    """Four runs of RTE on the embedded backbone, one shard."""
    spec = dataclasses.replace(
        get_experiment("smoke"), name="faults", ablation=None, shard_size=8, retries=3,
        sweeps=(Sweep(tasks=("rte",), methods=({"name": "full"}, {"name": "layernorm"}), learning_rates=(1e-4,), epochs=(1,),
                      seeds=(0, 1), max_length=32),),
    )
    return dataclasses.replace(spec, **changes)


def _run(spec, store: RunStore, **flags: bool) -> Counter[str]:
    """The one shard, under the RetrainPolicy of `flags` (retry_failed=..., as the pipeline's parameters)."""
    (shard,) = plan(spec).shards
    return run_shard(spec, shard.id, store, policy=RetrainPolicy.from_flags(**flags))


# --- the store's own files are written only by the store ---------------------------------------------


def test_retries_are_limited_on_a_bucket(stub: Path, bucket: str) -> None:
    """8 transient failures in a row with retries=3: 4 calls, then a failed record (the local store's
    documented behaviour); before, a sync uploaded the scratch copy of attempts.json over the count."""
    spec = _spec(retries=3)
    flaky = plan(spec).runs[0].run_id
    (stub / "transient").mkdir()
    (stub / "transient" / flaky).write_text("8")
    store = RunStore(bucket)
    assert _run(spec, store) == Counter(ok=3, failed=1)
    assert stub_trainer.calls(flaky) == 4
    assert store.record(flaky)["reason"].startswith("transient failure persisted over 4 attempts: ConnectionError: stub")
    assert store.files.read_json("runs", flaky, "attempts.json")["transient_failures"] == 4


def test_a_sync_never_puts_back_an_old_lease(bucket: str) -> None:
    store = RunStore(bucket)
    lease = try_acquire(store, "run-a", owner="live", seconds=60)
    assert isinstance(lease, Lease)
    with store.run_dir("run-a") as work:
        assert not any(path.name.startswith("lease-") for path in work.path.iterdir())
        time.sleep(0.01)
        lease.renew()
        renewed = store.files.read_json("runs", "run-a", lease.file)
        (work.path / "train_state.pt").write_bytes(b"state")
        work.sync()
    assert store.files.read_json("runs", "run-a", lease.file) == renewed
    assert store.files.names("runs", "run-a") == [lease.file, "train_state.pt"]


def test_a_live_run_longer_than_its_lease_is_not_taken_over(stub: Path, bucket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A 3 s lease (renewed every second) and a 4.5 s run that syncs every 0.5 s; a second attempt
    comes at 3.6 s. Before, a sync put back the lease as downloaded (expiring at 3 s), the second attempt
    took the run over and it trained twice, the first ending "superseded"."""
    monkeypatch.setenv(LEASE_SECONDS_ENV, "3")
    monkeypatch.setenv("STUB_SLEEP_S", "4.5")
    monkeypatch.setenv("STUB_SYNC_EVERY_S", "0.5")
    config = plan(_spec()).runs[0]
    store = RunStore(bucket)
    outcomes: dict[str, str] = {}
    first = threading.Thread(target=lambda: outcomes.update(first=run_in_store(config, store, wait=False, owner="first")))
    first.start()
    time.sleep(3.6)
    outcomes["second"] = run_in_store(config, RunStore(bucket), wait=False, owner="second")
    first.join()
    assert outcomes == {"first": "ok", "second": "leased"}
    assert stub_trainer.calls(config.run_id) == 1


# --- answers that are errors after the write ------------------------------------------------------------


@pytest.mark.parametrize("where", ["gcs", "local"])
def test_a_create_answered_with_an_error_after_its_write_is_the_attempts_own(
    stub: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """The run's lease-1.json and record.json are each created, then answered 503 (the bucket: through a proxy that
    forwards the upload and replaces the emulator's answer; gcsfs retries and hears 412) or EIO (a folder, as Cloud
    Storage FUSE answers a failed upload). Before, the attempt saw its own lease as another's and waited on it for a
    lease length, and called its freshly trained run "reused", its resume state left behind."""
    monkeypatch.setenv("STUB_SAVE_STATE", "1")
    config = plan(_spec()).runs[0]
    aimed = (f"runs/{config.run_id}/lease-1.json", f"runs/{config.run_id}/record.json")
    failed: list[str] = []

    def after_the_write(request: Request) -> Fault | None:
        hit = next((name for name in aimed if request.is_create_only and request.names(name) and name not in failed), None)
        if hit is None:
            return None
        failed.append(hit)
        return Fault(when="after", status=503)

    def waits(seconds: float) -> None:
        raise AssertionError(f"the attempt waited {seconds} s on a lease")

    with contextlib.ExitStack() as stack:
        if where == "gcs":
            emulator, proxy = stack.enter_context(flaky_gcs_emulator(after_the_write, log_dir=tmp_path))
            store = RunStore(emulator.url("store"))
        else:
            create = store_files.create_local_file

            def create_then_fail(path: str, data: bytes) -> None:
                create(path, data)
                if any(path.endswith(name) and name not in failed for name in aimed):
                    failed.append(next(name for name in aimed if path.endswith(name)))
                    raise OSError(errno.EIO, "Input/output error", path)

            monkeypatch.setattr(store_files, "create_local_file", create_then_fail)
            store = RunStore(tmp_path / "store")
        assert run_in_store(config, store, wait=True, owner="this-attempt", sleep=waits) == "ok"
        assert failed == list(aimed)
        assert stub_trainer.calls(config.run_id) == 1
        assert store.record(config.run_id)["status"] == "ok"
        assert store.files.names("runs", config.run_id) == ["record.json"]  # resume state and lease gone
        # another writer's file is still another's: a refusal whose read-back differs stays a refusal
        assert not store.files.create_exclusive(b'{"owner": "this-attempt"}', "runs", config.run_id, "record.json")
        if where == "gcs":
            assert proxy.counts["after"] == 2


def test_a_lease_left_by_this_attempt_is_its_own(bucket: str) -> None:
    """A lease file whose owner is this attempt (its create answered with an error, or its release failed) is taken
    back at once, never waited on; one of another attempt's is not."""
    store = RunStore(bucket)
    store.files.write_json({"owner": "me", "acquired_at": 0, "taken_at": 0, "expires_at": 0}, "runs", "run-a", "lease-3.json")
    mine = try_acquire(store, "run-a", owner="me", seconds=60)
    assert isinstance(mine, Lease) and mine.number == 3 and mine.still_held()
    other = try_acquire(store, "run-a", owner="other", seconds=60)
    assert isinstance(other, Holder) and other.owner == "me"


# --- unreadable files ----------------------------------------------------------------------------------


def test_an_unreadable_record_is_named_the_shard_goes_on_and_retry_unreadable_alone_retrains_it(
    stub: Path, bucket: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = _spec()
    runs = plan(spec).runs
    store = RunStore(bucket)
    assert _run(spec, store) == Counter(ok=4)
    broken = runs[1].run_id
    store.files.fs.pipe_file(store.files.path("runs", broken, "record.json"), b'{"run_id": "' + broken.encode() + b'", "sta')

    status = sweep_status(spec, store)
    assert status.count("unreadable") == 1 and status.count("ok") == 3
    text = format_status(status)
    assert "unreadable 1" in text and f"runs/{broken}/record.json is not readable JSON" in text

    capsys.readouterr()
    assert _run(spec, store) == Counter(reused=3, unreadable=1)  # the other runs are still checked
    out = capsys.readouterr().out
    assert f"{broken}: " in out and "record.json is not readable JSON" in out and "--retry-unreadable" in out

    with pytest.raises(IncompleteSweepError, match=r"1 of 4 planned runs have a record that cannot be read .*record\.json"):
        aggregate_sweep(spec, store, tmp_path / "results")
    summary = aggregate_sweep(spec, store, tmp_path / "partial", partial=True)
    assert summary["runs"] == 3 and f"skipped run {broken}" in capsys.readouterr().err

    assert _run(spec, store, retry_failed=True) == Counter(reused=3, unreadable=1)  # failed runs alone: not this one
    assert _run(spec, store, retry_unreadable=True) == Counter(reused=3, ok=1)
    assert stub_trainer.calls(broken) == 2 and store.record(broken)["status"] == "ok"
    kept = [name for name in store.files.names("runs", broken) if name.startswith("record.json.unreadable-")]
    assert len(kept) == 1 and store.files.fs.cat_file(store.files.path("runs", broken, kept[0])).endswith(b'"sta')
    assert sweep_status(spec, store).count("ok") == 4


@pytest.mark.parametrize("content", [b"\x00garbage{", b'{"owner": "someone"}', b"[1, 2]"])
def test_an_unreadable_lease_ends_once_older_than_the_lease_length(
    stub: Path, bucket: str, monkeypatch: pytest.MonkeyPatch, content: bytes
) -> None:
    """The rule: a lease file that cannot be read, or has no numeric expires_at, ends as any lease does: once
    the store shows it unchanged for a lease length (a live holder rewrites it every third of that)."""
    monkeypatch.setenv(LEASE_SECONDS_ENV, "6")  # reading a torn file is retried for a second: room for two reads
    spec = _spec()
    held = plan(spec).runs[0].run_id
    store = RunStore(bucket)
    store.files.fs.pipe_file(store.files.path("runs", held, "lease-1.json"), content)

    status = sweep_status(spec, store)
    assert status.count("running") == 1 and status.count("not started") == 3
    taken = try_acquire(store, held, owner="other")
    assert isinstance(taken, Holder) and 0 < taken.expires_in <= 6
    # The shard trains the others first, then waits for the lease to end and trains the held run.
    assert _run(spec, store) == Counter(ok=4)
    assert store.record(held)["status"] == "ok" and stub_trainer.calls(held) == 1


# --- roots that cannot be used ----------------------------------------------------------------------


def test_a_missing_bucket_or_prefix_is_refused_by_readers_and_writers(stub: Path, tmp_path: Path) -> None:
    from pipelines.__main__ import main

    with gcs_emulator(log_dir=tmp_path) as emulator:
        missing_bucket = "gs://no-such-bucket/store"
        with pytest.raises(StoreError, match="does not exist"):
            RunStore(missing_bucket).require_existing()
        with pytest.raises(StoreError, match="bucket of run store gs://no-such-bucket/store does not exist"):
            _run(_spec(), RunStore(missing_bucket))
        with pytest.raises(StoreError, match="does not exist"):
            RunStore(emulator.url("wrong-prefix")).require_existing()
        assert main(["status", "smoke", "--runs-root", emulator.url("wrong-prefix")]) == 2
        with pytest.raises(StoreError, match="does not exist"):
            aggregate_sweep(_spec(), RunStore(emulator.url("wrong-prefix")), tmp_path / "results", partial=True)


@pytest.mark.parametrize("where", ["under a file", "proc"])
def test_a_root_no_run_can_be_written_under_is_refused_before_training(stub: Path, tmp_path: Path, where: str) -> None:
    (tmp_path / "a-file").write_text("")
    root = tmp_path / "a-file" / "store" if where == "under a file" else Path("/proc/adaptune-store")
    refusal = f"run store {root} lies under {tmp_path / 'a-file'}, which is a file" if where == "under a file" else f"cannot write runs under {root}"
    with pytest.raises(StoreError, match=refusal):
        _run(_spec(), RunStore(root))
    assert not (stub / "calls").exists()


def test_status_of_a_missing_local_root_is_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    from pipelines.__main__ import main

    assert main(["status", "smoke", "--runs-root", str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "does not exist" in err
