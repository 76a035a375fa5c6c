"""The run store on the cloud's terms, rehearsed here: one owner per run, records written once,
failures classed as the platforms raise them, stale records, staged weights, and a shard that checks
its machine before it trains anything."""

from __future__ import annotations

import dataclasses
import errno
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from adaptune.sweep.experiments import get_experiment
from adaptune.sweep.fan_in import IncompleteSweepError, aggregate_sweep
from adaptune.sweep.lease import Holder, Lease, try_acquire
from adaptune.sweep.plan import KFP_MAX_FANOUT, plan, within_fanout
from adaptune.sweep.retrain import RetrainPolicy
from adaptune.sweep.shard_runner import ShardEnvironmentError, is_transient, run_in_store, run_shard
from adaptune.sweep.spec import Sweep
from adaptune.sweep.staging import StagingError, stage_models
from adaptune.sweep.store import RunStore
from bench.stand_ins import stub_trainer


def _spec(**changes: object):
    spec = dataclasses.replace(
        get_experiment("smoke"), name="safety", ablation=None, shard_size=4, retries=1,
        sweeps=(Sweep(tasks=("rte",), methods=({"name": "full"}, {"name": "layernorm"}), learning_rates=(1e-4,), epochs=(1,),
                      seeds=(0, 1), max_length=32),),
    )
    return dataclasses.replace(spec, **changes)


# --- one owner per run ------------------------------------------------------------------------------


def race_for_a_lease(store: RunStore, attempts: int = 16) -> list[Lease | Holder]:
    """`attempts` threads released at once, each trying to take run-a's lease."""
    results: list[Lease | Holder] = []
    barrier = threading.Barrier(attempts)

    def attempt(index: int) -> None:
        barrier.wait()
        results.append(try_acquire(store, "run-a", owner=f"attempt-{index}", seconds=60))

    threads = [threading.Thread(target=attempt, args=(i,)) for i in range(attempts)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def test_of_many_attempts_racing_for_a_run_exactly_one_takes_its_lease(tmp_path: Path) -> None:
    results = race_for_a_lease(RunStore(tmp_path / "store"))
    winners = [r for r in results if isinstance(r, Lease)]
    assert len(winners) == 1 and len(results) == 16
    assert all(isinstance(r, Holder) and r.owner == winners[0].owner for r in results if r is not winners[0])


def test_an_expired_lease_is_taken_over_and_its_old_holder_publishes_nothing(stub: Path, tmp_path: Path) -> None:
    store = RunStore(tmp_path / "store")
    config = plan(_spec()).runs[0]
    stalled = try_acquire(store, config.run_id, owner="stalled-pod", seconds=0.2)
    assert isinstance(stalled, Lease)
    assert isinstance(try_acquire(store, config.run_id, owner="eager"), Holder)  # live: not taken
    time.sleep(0.3)
    # The retry trains the run: it takes lease 2 once lease 1 expired, and publishes the record.
    assert run_in_store(config, store, owner="retry") == "ok"
    assert stub_trainer.calls(config.run_id) == 1
    assert not stalled.still_held()  # the stalled pod, were it to wake, is fenced off
    assert store.files.names("runs", config.run_id) == ["record.json"]  # leases released


def test_a_run_held_by_another_attempt_is_left_to_it_then_reused(stub: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ADAPTUNE_LEASE_SECONDS", "10")  # a waiting attempt looks again every second
    spec = _spec()
    store = RunStore(tmp_path / "store")
    busy = plan(spec).runs[0]
    other = try_acquire(store, busy.run_id, owner="other-submission", seconds=60)
    assert isinstance(other, Lease)
    finished = threading.Event()

    def other_submission_finishes() -> None:  # trains the run meanwhile and publishes its record
        time.sleep(1.0)
        record = stub_trainer.train(busy, out_dir=tmp_path, write_record=False)
        assert store.publish_record(record)
        other.release()
        finished.set()

    other_submission = threading.Thread(target=other_submission_finishes)
    other_submission.start()
    (shard,) = plan(spec).shards
    outcomes = run_shard(spec, shard.id, store)
    other_submission.join(timeout=60)  # it publishes the record before it marks itself finished: the shard may end between
    assert finished.is_set() and outcomes == Counter(ok=3, reused=1)
    assert stub_trainer.calls(busy.run_id) == 1  # trained once, by its owner


def test_a_record_is_never_overwritten_by_a_second_writer(tmp_path: Path) -> None:
    store = RunStore(tmp_path / "store")
    assert store.publish_record({"run_id": "r1", "status": "ok", "writer": 1})
    assert not store.publish_record({"run_id": "r1", "status": "failed", "writer": 2})
    assert store.record("r1")["writer"] == 1


# --- failures as the platforms raise them ----------------------------------------------------------


def test_storage_and_http_hiccups_are_transient_and_bad_input_is_not() -> None:
    import httpx
    from gcsfs.retry import HttpError
    from google.api_core import exceptions as api

    assert is_transient(OSError(errno.EIO, "Input/output error"))  # Cloud Storage FUSE, a failed GCS call
    assert is_transient(OSError(errno.ESTALE, "Stale file handle"))  # FUSE: a concurrent writer replaced the object
    assert is_transient(httpx.ConnectError("connection refused"))  # huggingface_hub
    assert is_transient(HttpError({"code": 503, "message": "backend error"}))  # gcsfs
    assert is_transient(api.ServiceUnavailable("try again"))  # google-api-core
    assert not is_transient(HttpError({"code": 403, "message": "forbidden"}))  # a permission problem stays
    assert not is_transient(OSError(errno.ENOSPC, "No space left on device"))
    assert not is_transient(FileNotFoundError(errno.ENOENT, "glue/RTE/train.tsv"))


# --- stale records -----------------------------------------------------------------------------------


def test_a_record_from_another_data_scheme_is_reported_not_reused_and_retrained_on_request(stub: Path, tmp_path: Path) -> None:
    spec = _spec()
    store = RunStore(tmp_path / "store")
    (shard,) = plan(spec).shards
    assert run_shard(spec, shard.id, store) == Counter(ok=4)
    old = plan(spec).runs[1]
    record = store.record(old.run_id)
    record.pop("data_scheme")  # as records were written before the GLUE validation slice
    store.files.remove("runs", old.run_id, "record.json")
    store.publish_record(record)
    assert run_shard(spec, shard.id, store) == Counter(reused=3, stale=1)
    with pytest.raises(IncompleteSweepError, match=r"1 of 4 planned runs hold records from another data scheme.*--retrain-stale"):
        aggregate_sweep(spec, store, tmp_path / "results")
    assert run_shard(spec, shard.id, store, policy=RetrainPolicy(stale=True)) == Counter(reused=3, ok=1)
    assert store.record(old.run_id)["data_scheme"] == "glue-2"
    assert aggregate_sweep(spec, store, tmp_path / "results")["ok"] == 4


def test_every_published_record_carries_its_provenance(stub: Path, tmp_path: Path, shared_data_dir: Path) -> None:
    import hashlib

    spec = _spec()
    store = RunStore(tmp_path / "store")
    (shard,) = plan(spec).shards
    run_shard(spec, shard.id, store, data_dir=shared_data_dir)
    record = store.record(plan(spec).runs[0].run_id)
    provenance = record["provenance"]
    assert provenance["code_version"] not in ("", None)
    assert provenance["packages"]["torch"].startswith("2.13.0") and provenance["packages"]["transformers"]
    assert provenance["device"]["kind"] == "cpu" and provenance["data_scheme"] == record["data_scheme"] == "glue-2"
    train = (shared_data_dir / "glue/RTE/train.tsv").read_bytes()
    assert provenance["data"]["files"]["glue/RTE/train.tsv"] == hashlib.sha256(train).hexdigest()


# --- the machine is checked before any run --------------------------------------------------------------


def test_a_gpu_task_on_a_node_without_cuda_fails_before_training_anything(stub: Path, tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ADAPTUNE_DEVICE", "cuda")  # what the compiled GPU tasks set
    spec = _spec()
    (shard,) = plan(spec).shards
    with pytest.raises(ShardEnvironmentError, match="'cuda' was requested but is not available.*driver"):
        run_shard(spec, shard.id, RunStore(tmp_path / "store"))
    assert not (stub / "calls").exists() and not (tmp_path / "store" / "runs").exists()  # no run trained, none recorded


def test_an_offline_pod_without_staged_weights_fails_the_task_saying_how_to_stage(tmp_path: Path) -> None:
    spec = _spec(backbone="bert-base-uncased")  # HF_HUB_OFFLINE=1 here (conftest): the hub is out of reach
    (shard,) = plan(spec).shards
    store = RunStore(tmp_path / "store")
    with pytest.raises(ShardEnvironmentError, match="make stage-models"):
        run_shard(spec, shard.id, store)  # the real trainer: the check comes before any run
    assert not (tmp_path / "store" / "runs").exists()


def test_staged_weights_are_loaded_from_the_store_offline(stub: Path, tmp_path: Path, backbone_path: str) -> None:
    from adaptune.model.backbone import resolve_backbone

    spec = _spec(backbone="bert-base-uncased")
    store = RunStore(tmp_path / "store")
    with pytest.raises(StagingError, match="--from bert-base-uncased=DIR"):
        stage_models(spec, store)  # offline: nothing to download from
    (line,) = stage_models(spec, store, sources={"bert-base-uncased": backbone_path})
    assert line["action"].startswith("staged from") and line["bytes"] > 80e6
    staged = tmp_path / "store/models/bert-base-uncased"
    assert (staged / "config.json").is_file() and (staged / "STAGED.json").is_file()
    assert stage_models(spec, store)[0]["action"] == "already staged"
    (shard,) = plan(spec).shards
    assert run_shard(spec, shard.id, store) == Counter(ok=4)
    assert resolve_backbone("bert-base-uncased") == str(staged)


def test_a_task_past_its_deadline_ends_itself_with_status_124() -> None:
    code = "from adaptune.sweep.shard_runner import start_deadline; import time; start_deadline(0.5, 'shard-x'); time.sleep(30)"
    started = time.perf_counter()
    finished = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert finished.returncode == 124 and "past its deadline" in finished.stderr
    assert time.perf_counter() - started < 20


# --- KFP's fan-out ceiling -------------------------------------------------------------------------------


def test_paper_full_for_kfp_fans_out_under_the_ceiling_with_every_run() -> None:
    spec = get_experiment("paper_full")
    vertex, kfp = plan(spec), plan(within_fanout(spec))
    assert len(vertex.shards) > KFP_MAX_FANOUT >= len(kfp.shards)
    assert sorted(r.run_id for s in kfp.shards for r in s.runs) == sorted(r.run_id for r in vertex.runs)
    assert f"{len(kfp.shards)} on a KFP cluster (ceiling {KFP_MAX_FANOUT}" in vertex.summary()
