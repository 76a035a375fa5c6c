"""How long `python -m pipelines status paper_full` takes against 8,556 stub records in the emulated bucket.

    .venv/bin/python -m bench.status_timing [--out bench/status.json] [--repeats 3]

Fills gs://<bucket>/adaptune-runs on fake-gcs-server (bench/stand_ins/gcs_emulator.py, loopback) as a finished
paper_full sweep would: every planned run with a stub record (a few failed, a few degenerate, a few
stale) and a two-file checkpoint beside it; with --under-way, the last 64 runs are in progress (a
live lease each) and the 600 before them not started. Then times the status command end to end in a fresh process
(imports, planning, listing, reads, printing): first cold (no record summaries cached on this machine:
every record is read), then `repeats` times warm (only the listing and the leases are read), and the
same with a local directory store holding the same files. Prints JSON (and writes it to --out). Not a
test: a measurement.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

UNDER_WAY = (64, 600)  # --under-way: runs in progress (paper_full's parallelism) and not started
REPO_ROOT = Path(__file__).resolve().parents[1]


def store_files(now: float, running: int = 0, not_started: int = 0) -> dict[str, bytes]:
    """{path under the store root: content} of a paper_full sweep under way."""
    from adaptune.core.files import json_text
    from adaptune.data.tasks import get_task
    from adaptune.sweep.experiments import get_experiment
    from adaptune.sweep.plan import plan
    from adaptune.train.record import run_record

    runs = plan(get_experiment("paper_full")).runs
    files: dict[str, bytes] = {}
    done = len(runs) - running - not_started
    for index, config in enumerate(runs):
        folder = f"runs/{config.run_id}"
        if index >= done + not_started:
            lease = {"owner": f"pod-{index}", "acquired_at": now - 600, "taken_at": now - 60, "expires_at": now + 840}
            files[f"{folder}/lease-1.json"] = json_text(lease).encode()
            continue
        if index >= done:
            continue
        task = get_task(config.task)
        record = run_record(config, task.primary_metric, device="cuda:NVIDIA H100 80GB HBM3")
        metrics = {name: 0.8 for name in task.metrics}
        record.update(wall_time_s=900.0 + index % 600, split_sizes={"train": 8000, "validation": 800, "test": 800}, best_epoch=config.epochs,
                      val_metrics=metrics, test_metrics=metrics, trained_params=1_000_000, total_params=110_000_000,
                      curve=[{"epoch": e, "step": 250 * e, "train_loss": 0.5, "val_metrics": metrics} for e in range(1, config.epochs + 1)])
        if index % 97 == 0:
            record.update(status="failed", reason=f"ValueError: non-finite training loss (nan) at step {index % 500}", wall_time_s=None)
        elif index % 31 == 0:
            record.update(status="degenerate", reason="validation predictions at the final epoch are all one class")
        elif index % 500 == 1:
            record["data_scheme"] = "glue-1"
        files[f"{folder}/record.json"] = json_text(record).encode()
        files[f"{folder}/checkpoint/task_weights.safetensors"] = b"\0" * 64
        files[f"{folder}/checkpoint/meta.json"] = b"{}"
    return files


def time_command(root: str, repeats: int, env: dict[str, str]) -> tuple[list[float], str]:
    times, output = [], ""
    for _ in range(repeats):
        started = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "pipelines", "status", "paper_full", "--runs-root", root], cwd=REPO_ROOT,
                              env=env, capture_output=True, text=True, check=True)
        times.append(round(time.perf_counter() - started, 2))
        output = done.stdout
    return times, output


def main() -> None:
    from adaptune.sweep.store import RunStore
    from bench.stand_ins.gcs_emulator import gcs_emulator

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="also write the JSON here")
    parser.add_argument("--repeats", type=int, default=2, help="warm runs after the cold one")
    parser.add_argument("--under-way", action="store_true", help=f"{UNDER_WAY[0]} runs in progress, {UNDER_WAY[1]} not started")
    args = parser.parse_args()

    files = store_files(time.time(), *(UNDER_WAY if args.under_way else (0, 0)))
    records = sum(name.endswith("/record.json") for name in files)
    result: dict[str, object] = {"records": records, "objects": len(files), "cpu_cores": os.cpu_count()}
    with tempfile.TemporaryDirectory(prefix="adaptune-status-") as scratch:
        # One copy on disk: the local store, and what the emulator loads into its bucket at start-up.
        local = Path(scratch) / "data" / "adaptune-test" / "adaptune-runs"
        for name, data in files.items():
            (local / name).parent.mkdir(parents=True, exist_ok=True)
            (local / name).write_bytes(data)
        with gcs_emulator("adaptune-test", preload=Path(scratch) / "data") as gcs:
            root = gcs.url("adaptune-runs")
            listed = RunStore(root).run_files()
            assert sum("record.json" in names for names in listed.values()) == records, "the bucket lacks records"
            env = {**os.environ, **gcs.env, "PYTHONPATH": str(REPO_ROOT), "ADAPTUNE_CACHE_DIR": str(Path(scratch) / "cache")}
            [bucket_cold], _ = time_command(root, 1, env)
            bucket_warm, output = time_command(root, args.repeats, env)
        [local_cold], _ = time_command(str(local), 1, env)
        local_warm, _ = time_command(str(local), args.repeats, env)
    result.update(status_bucket_cold_s=bucket_cold, status_bucket_warm_s=bucket_warm, status_bucket_warm_median_s=statistics.median(bucket_warm),
                  status_local_cold_s=local_cold, status_local_warm_s=local_warm, output=output.splitlines())
    text = json.dumps(result, indent=2)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
