"""The run store's soak: a sweep of stub runs in a bucket on the GCS emulator, as a user's worst week.

Two overlapping submissions of the same sweep (shard workers in their own processes, several at once),
workers SIGKILLed at chosen points and restarted (inside a run; between publishing a record and
releasing its lease; while waiting for a run another attempt holds), runs that fail transiently and
runs that diverge; dead workers' leases that claim to expire ten years ahead, stray lease names the
store does not write, workers whose clocks run ahead and behind by many lease lengths (the second
submission's, alternately), run folders deleted while their runs train; then a third submission, status
and aggregate. Checked: every planned run ends with exactly one record, none hangs (a deadline stops the
submissions), none is trained to completion twice, the failed records are exactly the diverging runs, no
lease nor resume state of a finished run is left behind, each run trained as often as its faults explain
(once; twice if killed inside it; once more per transient failure), and status, aggregate and
runs.parquet agree.

The bucket can be flaky too (`flaky_share`): the workers reach the emulator through a loopback proxy
(bench.stand_ins.flaky_proxy) that answers that share of their requests 503 or 429, half before forwarding and
half after the emulator did the write, at most `flaky_max` in all and none after the submissions. Then no run
may wait on its own lease (`waited_on_self`: an attempt shown its own lease as another's) and no run an attempt
trained may come out "reused" (`reported_reused`: its record's create answered with an error though it wrote).
The lease is longer there (`flaky_lease_s`): gcsfs sleeps 1-2 s before retrying a failed request, 2-4 s before
the second retry, and a holder's renewal must not wait longer than a lease.

    python -m bench.soak --runs 10000 --flaky-share 0.05 --out bench/soak.json      (make bench-soak)
tests/test_soak.py runs the same driver at a few hundred runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
TASKS = ("cola", "sst2", "mrpc", "rte")
METHODS = ({"name": "full"}, {"name": "layernorm"}, {"name": "adapters", "size": 8}, {"name": "adapters", "size": 64},
           {"name": "top_k", "k": 1})
LEARNING_RATES = (1e-5, 3e-5, 1e-4, 3e-4, 1e-3)
KILL_POINTS = ("inside", "publish", "catch_up")


@dataclasses.dataclass(frozen=True)
class SoakSettings:
    runs: int = 300  # rounded to whole seeds of 4 tasks x 5 methods x lr
    kills: int = 8  # SIGKILLs over the whole soak, spread over the kill points
    transient: int = 12  # runs that fail transiently 1..retries times, then work
    diverging: int = 4  # runs whose loss is not finite: a failed record
    long_runs: int = 20  # runs that last long enough to cross a lease renewal (and sync meanwhile)
    long_run_s: float = 1.2
    dead_leases: int = 4  # runs a dead worker's lease holds, claiming to expire ten years ahead
    stray_leases: int = 4  # runs with a lease-01.json beside them: a name the store does not write
    deleted_folders: int = 3  # runs whose folder is deleted while they train
    clock_skew_s: float = 60.0  # the second submission's workers: ahead and behind by this, alternately
    lease_s: float = 1.5  # renewed every third of it
    deadline_s: float = 900.0  # the submissions stopped here: a run still without a record hung
    workers: int = 4  # shard processes at once per submission
    shard_size: int = 25
    retries: int = 3
    seed: int = 0
    flaky_share: float = 0.0  # of the workers' requests to the bucket, answered 503/429 (half after the write)
    flaky_max: int = 100_000  # faults at most, over the whole soak
    flaky_lease_s: float = 10.0  # the lease length where the bucket is flaky

    @property
    def lease_length_s(self) -> float:
        return self.flaky_lease_s if self.flaky_share else self.lease_s


def soak_spec(settings: SoakSettings) -> Any:
    from adaptune.sweep.experiments import get_experiment
    from adaptune.sweep.spec import Sweep

    per_seed = len(TASKS) * len(METHODS) * len(LEARNING_RATES)
    seeds = tuple(range(max(1, round(settings.runs / per_seed))))
    return dataclasses.replace(
        get_experiment("smoke"), name="soak", ablation=None, shard_size=settings.shard_size, retries=settings.retries,
        sweeps=(Sweep(tasks=TASKS, methods=METHODS, learning_rates=LEARNING_RATES, epochs=(1,), seeds=seeds, max_length=32),),
    )


def run_soak(settings: SoakSettings, root: str, control: Path, log: Path, emulator_endpoint: str | None = None) -> dict[str, Any]:
    """Drive the soak against the store at `root` (the emulator's environment already in os.environ); with
    `settings.flaky_share`, the workers reach the emulator at `emulator_endpoint` through a FlakyProxy."""
    from bench.stand_ins.flaky_proxy import FlakyProxy, RandomFaults

    faults = RandomFaults(settings.flaky_share, max_faults=settings.flaky_max, seed=settings.seed)
    if not settings.flaky_share:
        return _run_soak(settings, root, control, log, None, faults)
    if emulator_endpoint is None:
        raise ValueError("a flaky soak needs the emulator's endpoint, to put its proxy in front of it")
    with FlakyProxy(emulator_endpoint, faults) as proxy:
        return _run_soak(settings, root, control, log, proxy, faults)


def _run_soak(settings: SoakSettings, root: str, control: Path, log: Path, proxy: Any, faults: Any) -> dict[str, Any]:
    from adaptune.core.run_files import LEASE_FILE, STATE_FILE
    from adaptune.sweep.fan_in import aggregate_sweep
    from adaptune.sweep.plan import plan
    from adaptune.sweep.spec_file import spec_to_dict
    from adaptune.sweep.status import sweep_status
    from adaptune.sweep.store import RunStore

    started = time.perf_counter()
    spec = soak_spec(settings)
    planned = plan(spec)
    run_ids = [run.run_id for run in planned.runs]
    rng = random.Random(settings.seed)
    extra = settings.dead_leases + settings.stray_leases + settings.deleted_folders
    faulty = rng.sample(run_ids, settings.transient + settings.diverging + settings.kills + settings.long_runs + extra)
    faulty, special = faulty[:len(faulty) - extra], faulty[len(faulty) - extra:]
    dead, stray = special[:settings.dead_leases], special[settings.dead_leases:settings.dead_leases + settings.stray_leases]
    deleted = special[settings.dead_leases + settings.stray_leases:]
    transient = dict.fromkeys(faulty[:settings.transient])
    diverging = set(faulty[settings.transient:settings.transient + settings.diverging])
    killed_inside = faulty[settings.transient + settings.diverging:][:settings.kills // len(KILL_POINTS) + settings.kills % len(KILL_POINTS)]
    long_runs = faulty[-settings.long_runs:] if settings.long_runs else []
    for name in ("transient", "nan", "sleep", "kill/inside", "kill/publish", "kill/catch_up", "calls"):
        (control / name).mkdir(parents=True, exist_ok=True)
    for run_id in transient:
        transient[run_id] = rng.randint(1, settings.retries)
        (control / "transient" / run_id).write_text(str(transient[run_id]))
    for run_id in diverging:
        (control / "nan" / run_id).write_text("")
    for run_id in long_runs:
        (control / "sleep" / run_id).write_text(str(settings.long_run_s))
    for run_id in deleted:
        (control / "sleep" / run_id).write_text(str(4 * settings.lease_length_s))  # long enough to be deleted mid-run
    for run_id in killed_inside:
        (control / "kill" / "inside" / run_id).write_text("")
    store = RunStore(root)
    never = {"owner": "dead-pod-1234", "acquired_at": time.time(), "taken_at": time.time(), "expires_at": time.time() + 10 * 365 * 86400}
    for run_id in dead:
        store.files.write_json(never, "runs", run_id, "lease-1.json")
    for run_id in stray:
        store.files.write_json(never, "runs", run_id, "lease-01.json")
    planned_kills = Counter(inside=len(killed_inside))
    for index in range(settings.kills - len(killed_inside)):  # tokens any worker may take at that point
        point = "publish" if index % 2 == 0 else "catch_up"
        (control / "kill" / point / str(index)).write_text("")
        planned_kills[point] += 1
    spec_path = control / "spec.json"
    spec_path.write_text(json.dumps(spec_to_dict(spec)))

    env = {**os.environ, "STUB_TRAINER_DIR": str(control), "ADAPTUNE_TRAINER": "bench.stand_ins.stub_trainer:train",
           "ADAPTUNE_RETRY_BACKOFF_S": "0", "ADAPTUNE_LEASE_SECONDS": str(settings.lease_length_s), "STUB_SYNC_EVERY_S": "0.3",
           "STUB_SAVE_STATE": "1",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]), "OMP_NUM_THREADS": "1"}
    if proxy is not None:  # the workers through the flaky proxy; this driver's own reads and checks go straight to the emulator
        env["STORAGE_EMULATOR_HOST"] = proxy.endpoint
    shards = [shard.id for shard in planned.shards]
    first = _Submission("A", shards, root, spec_path, env, log, settings.workers)
    second = _Submission("B", list(reversed(shards)), root, spec_path, env, log, settings.workers, settings.clock_skew_s)
    deadline = time.monotonic() + settings.deadline_s
    to_delete = _FolderDeleter(store, deleted, after_s=settings.lease_length_s)
    first.start_some()
    time.sleep(1.0)  # the second submission overlaps the first
    while not (first.done() and second.done()) and time.monotonic() < deadline:
        first.step()
        second.step()
        to_delete.step()
        time.sleep(0.05)
    third = _Submission("C", shards, root, spec_path, env, log, settings.workers)
    while not (first.done() and second.done() and third.done()) and time.monotonic() < deadline:
        third.step()
        time.sleep(0.05)
    hung_submissions = [submission.stop() for submission in (first, second, third)]
    faults.stop()
    wall = time.perf_counter() - started
    if any(hung_submissions):
        listed = store.run_files()
        hung = sum(1 for run_id in run_ids if "record.json" not in listed.get(run_id, {}))
    else:
        hung = 0

    status = sweep_status(spec, store)
    out = Path(tempfile.mkdtemp(prefix="soak-results-"))
    summary = aggregate_sweep(spec, store, out)  # also drops the leases a kill after publishing left behind
    files = store.run_files()
    records = store.records(run_ids, files=files)
    import pandas as pd

    parquet_rows = len(pd.read_parquet(out / "runs.parquet"))
    calls = {run_id: int(path.read_text()) if (path := control / "calls" / run_id).is_file() else 0 for run_id in run_ids}
    expected = {run_id: 1 + transient.get(run_id, 0) + (run_id in killed_inside) for run_id in run_ids}
    failed = {run_id for run_id, record in records.items() if record["status"] == "failed"}
    leases_left = sum(1 for names in files.values() for name in names if LEASE_FILE.match(name))
    states_left = sum(1 for run_id, record in records.items() if record["status"] != "failed" and STATE_FILE in files.get(run_id, {}))
    completions = {run_id: int(path.read_text()) if (path := control / "completions" / run_id).is_file() else 0 for run_id in run_ids}
    kills_made = {point: planned_kills[point] - sum(1 for _ in (control / "kill" / point).iterdir()) for point in KILL_POINTS}
    return {
        "runs": len(run_ids), "shards": len(shards), "workers_per_submission": settings.workers, "submissions": 3,
        "kills": sum(kills_made.values()), "kills_planned": settings.kills, "kills_by_point": kills_made,
        "worker_exits": Counter(first.exits + second.exits + third.exits),
        "transient_runs": len(transient), "diverging_runs": len(diverging), "long_runs": len(long_runs),
        "dead_leases": len(dead), "stray_leases": len(stray), "folders_deleted": to_delete.deleted,
        "clock_skew_s": settings.clock_skew_s,
        "calls": sum(calls.values()), "calls_per_run": sum(calls.values()) / len(run_ids),
        "lost": sum(1 for run_id in run_ids if run_id not in records),
        "hung": hung,
        "trained_twice": sum(1 for count in completions.values() if count > 1),
        "duplicated": sum(1 for run_id in run_ids if calls[run_id] > expected[run_id]),
        "trained_less_than_expected": sum(1 for run_id in run_ids if calls[run_id] < expected[run_id]),
        "failed_are_the_diverging": failed == diverging,
        "leases_left": leases_left,
        "states_left": states_left,
        "status": {state: status.count(state) for state in ("ok", "failed", "running", "not started", "unreadable")},
        "aggregate_runs": summary["runs"], "parquet_rows": parquet_rows,
        "waited_on_self": _events(control, "waited_on_self"),
        "reported_reused": _events(control, "reported_reused"),
        "bucket_faults": dict(proxy.counts) if proxy is not None else {},
        "worker_tracebacks": log.read_text(errors="replace").count("Traceback (most recent call last)") if log.is_file() else 0,
        "wall_s": round(wall, 1),
    }


def _events(control: Path, kind: str) -> int:
    """How many times workers noted `kind` (one line each in control/events/<kind>)."""
    path = control / "events" / kind
    return len(path.read_text().splitlines()) if path.is_file() else 0


def _note(kind: str, run_id: str) -> None:
    from bench.stand_ins.stub_trainer import control_dir

    (control_dir() / "events").mkdir(exist_ok=True)
    with open(control_dir() / "events" / kind, "a") as events:  # one short append: whole, across processes
        events.write(f"{run_id}\n")


class _Submission:
    """One submission: each shard in its own worker process, `workers` at once; a killed worker is
    started again (what a KFP retry or a resubmission does), until every shard exits 0."""

    def __init__(self, name: str, shards: list[str], root: str, spec_path: Path, env: dict[str, str], log: Path, workers: int,
                 clock_skew_s: float = 0.0) -> None:
        self.name, self.pending, self.root, self.spec_path, self.env, self.log, self.workers = name, list(shards), root, spec_path, env, log, workers
        self.running: dict[str, subprocess.Popen[bytes]] = {}
        self.exits: list[str] = []
        self.clock_skew_s, self.started = clock_skew_s, 0

    def start_some(self) -> None:
        while self.pending and len(self.running) < self.workers:
            shard = self.pending.pop(0)
            skew = self.clock_skew_s * (1 if self.started % 2 == 0 else -1)  # ahead, behind, ahead, ...
            self.started += 1
            with open(self.log, "ab") as out:
                self.running[shard] = subprocess.Popen(
                    [sys.executable, "-m", "bench.soak", "worker", self.root, str(self.spec_path), shard],
                    cwd=REPO, env={**self.env, "SOAK_CLOCK_SKEW_S": str(skew)}, stdout=out, stderr=subprocess.STDOUT)

    def step(self) -> None:
        for shard, process in list(self.running.items()):
            code = process.poll()
            if code is None:
                continue
            del self.running[shard]
            self.exits.append("ok" if code == 0 else "killed" if code == -signal.SIGKILL else f"exit {code}")
            if code == -signal.SIGKILL:
                self.pending.insert(0, shard)  # restarted, as an orchestrator's retry would
            elif code != 0:
                raise RuntimeError(f"submission {self.name}: shard {shard} exited {code}; see {self.log}")
        self.start_some()

    def done(self) -> bool:
        return not self.pending and not self.running

    def stop(self) -> bool:
        """Past the deadline: kill what still runs; True where anything had to be."""
        for process in self.running.values():
            process.kill()
            process.wait()
        stopped = bool(self.running or self.pending)
        self.running, self.pending = {}, []
        return stopped


class _FolderDeleter:
    """Deletes each chosen run's folder in the store `after_s` after its lease appears: mid-run."""

    def __init__(self, store: Any, run_ids: list[str], after_s: float) -> None:
        self.store, self.waiting, self.after_s = store, {run_id: None for run_id in run_ids}, after_s
        self.deleted, self.next_look = 0, 0.0

    def step(self) -> None:
        now = time.monotonic()
        if now < self.next_look or not self.waiting:
            return
        self.next_look = now + 0.2
        for run_id, seen in list(self.waiting.items()):
            if seen is None:
                if any(name.startswith("lease-") for name in self.store.files.names("runs", run_id)):
                    self.waiting[run_id] = now
            elif now - seen >= self.after_s:
                self.store.files.remove("runs", run_id)
                del self.waiting[run_id]
                self.deleted += 1


def _worker(root: str, spec_path: str, shard_id: str) -> int:
    """One shard, in this process, with kill points on the store's own steps."""
    from adaptune.sweep import run_attempt
    from adaptune.sweep.lease import Holder
    from adaptune.sweep.shard_runner import run_shard
    from adaptune.sweep.spec_file import spec_from_dict
    from adaptune.sweep.store import RunStore
    from bench.stand_ins.stub_trainer import consume, control_dir

    skew = float(os.environ.get("SOAK_CLOCK_SKEW_S") or 0)
    if skew:  # this worker's clock is off: every time it writes (a lease's claims) is
        true_time = time.time
        time.time = lambda: true_time() + skew  # type: ignore[assignment]
    def take(point: str) -> bool:
        return any(consume(f"kill/{point}/{token.name}") for token in sorted((control_dir() / "kill" / point).iterdir()))

    publish = RunStore.publish_record

    def publish_then_die(self: RunStore, record: dict[str, Any]) -> bool:
        published = publish(self, record)
        if published and take("publish"):  # published, its lease not yet released
            os.kill(os.getpid(), signal.SIGKILL)
        return published

    take_lease = run_attempt._take_lease

    def catch_up_then_die(run_id: str, store: RunStore, owner: str | None, wait: bool, sleep: Any, watch: Any) -> Any:
        if wait and take("catch_up"):  # waiting for a run another attempt holds
            os.kill(os.getpid(), signal.SIGKILL)
        return take_lease(run_id, store, owner, wait, sleep, watch)

    acquire = run_attempt.try_acquire

    def acquire_noting_self(store: RunStore, run_id: str, owner: str | None = None, seconds: float | None = None, watch: Any = None) -> Any:
        taken = acquire(store, run_id, owner, seconds, watch)
        if isinstance(taken, Holder) and owner is not None and taken.owner == owner:  # shown its own lease as another's
            _note("waited_on_self", run_id)
        return taken

    publish_run = run_attempt._publish

    def publish_noting_reused(config: Any, record: dict[str, Any], lease: Any, store: RunStore, data_dir: Any) -> str:
        outcome = publish_run(config, record, lease, store, data_dir)
        if outcome == "reused":  # this attempt trained the run: its own record cannot be another's
            _note("reported_reused", config.run_id)
        return outcome

    RunStore.publish_record = publish_then_die  # type: ignore[method-assign]
    run_attempt._take_lease = catch_up_then_die
    run_attempt.try_acquire = acquire_noting_self
    run_attempt._publish = publish_noting_reused
    spec = spec_from_dict(json.loads(Path(spec_path).read_text()))
    outcomes = run_shard(spec, shard_id, RunStore(root))
    print(f"{shard_id}: {dict(outcomes)}", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "worker":
        return _worker(*argv[1:4])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--kills", type=int, default=24)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--shard-size", type=int, default=250)
    parser.add_argument("--flaky-share", type=float, default=0.05,
                        help="share of the workers' bucket requests answered 503/429, half after the write (0: none)")
    parser.add_argument("--out", default="bench/soak.json")
    args = parser.parse_args(argv)
    settings = SoakSettings(runs=args.runs, kills=args.kills, transient=max(12, args.runs // 50), diverging=max(4, args.runs // 1000),
                            long_runs=max(20, args.runs // 100), workers=args.workers, shard_size=args.shard_size,
                            dead_leases=max(4, args.runs // 1000), stray_leases=max(4, args.runs // 1000),
                            deleted_folders=max(3, args.runs // 2000), deadline_s=max(900.0, args.runs * 0.4),
                            flaky_share=args.flaky_share)
    from bench.stand_ins.gcs_emulator import gcs_emulator

    with tempfile.TemporaryDirectory(prefix="soak-") as scratch, gcs_emulator(log_dir=scratch) as emulator:
        result = run_soak(settings, emulator.url("soak"), Path(scratch) / "control", Path(scratch) / "workers.log", emulator.endpoint)
    result = {"measured_on": time.strftime("%Y-%m-%d"), "command": "make bench-soak", "settings": dataclasses.asdict(settings), **result}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(json.dumps(result, indent=2, default=str))
    clean = all(result[key] == 0 for key in ("lost", "hung", "duplicated", "trained_twice", "leases_left", "states_left", "waited_on_self",
                                             "reported_reused"))
    return 0 if clean else 1


if __name__ == "__main__":
    sys.exit(main())
