"""How long TensorBoard takes to show paper_full's HParams view: 8,800 stub runs' event files.

    .venv/bin/python -m bench.tensorboard_timing [--runs 8800] [--curve-points 200] [--out bench/tensorboard.json]

Writes a local run store as a finished paper_full sweep would leave it (train.event_log's files for
every planned run: a curve of --curve-points training steps plus 3 validation epochs, and the HParams
summary from a stub record), builds the sweep's view (adaptune.sweep.tensorboard_view) with curves and
summaries only, serves each with TensorBoard as `make tensorboard` does, and times until the HParams
API (the request the dashboard makes) lists every session, then one more such request. Prints JSON
and writes it to --out. Not a test: a measurement.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from bench.stand_ins.loopback import HPARAMS_STATUSES, free_port, post_json


def write_store(root: Path, runs: list, curve_points: int) -> None:
    from adaptune.data.tasks import get_task
    from adaptune.train.event_log import CurveLog, write_run_summary
    from adaptune.train.record import run_record

    for index, config in enumerate(runs):
        out = root / "runs" / config.run_id
        task = get_task(config.task)
        record = run_record(config, task.primary_metric, "stub")
        curve = CurveLog(out)
        curve.start(0)
        for step in range(1, curve_points + 1):
            curve.train_step(step, 0.7 / (1 + step / 50), config.lr * (1 - step / curve_points))
        for epoch in range(1, 4):
            curve.epoch(epoch * curve_points // 3, epoch, 0.5, {task.primary_metric: 0.5 + 0.1 * epoch})
        curve.close()
        status = "failed" if index % 97 == 0 else "degenerate" if index % 89 == 0 else "ok"
        record.update(status=status, trained_params=1000 + index, curve=[{"step": curve_points}],
                      val_metrics={} if status == "failed" else {task.primary_metric: 0.8},
                      test_metrics={} if status == "failed" else {task.primary_metric: 0.79})
        write_run_summary(out, record)


def time_view(view_dir: Path, expected: int) -> dict[str, float]:
    import subprocess
    import urllib.request

    port = free_port()
    started = time.perf_counter()
    server = subprocess.Popen([sys.executable, "-m", "tensorboard.main", "--logdir", str(view_dir), "--port", str(port), "--host", "127.0.0.1"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    request = {"experimentName": "", "allowedStatuses": HPARAMS_STATUSES, "startIndex": 0, "sliceSize": 100,
               "colParams": [{"hparam": "task"}, {"metric": {"tag": "score/validation"}}]}
    try:
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/data/runs", timeout=60):
                    pass
                found = post_json(port, "/data/plugin/hparams/session_groups", request)["totalSize"]
            except OSError:
                found = 0
            if found >= expected:
                break
            if time.perf_counter() - started > 3600:
                raise TimeoutError(f"{found} of {expected} sessions after an hour")
            time.sleep(2)
        shown = time.perf_counter() - started
        again = time.perf_counter()
        post_json(port, "/data/plugin/hparams/session_groups", request)
        return {"seconds_to_all_sessions": round(shown, 1), "seconds_per_table_request": round(time.perf_counter() - again, 2)}
    finally:
        server.terminate()
        server.wait(30)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=None, help="the first N of paper_full's runs (default: all)")
    parser.add_argument("--curve-points", type=int, default=200)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    from adaptune.sweep.experiments import get_experiment
    from adaptune.sweep.plan import plan
    from adaptune.sweep.store import RunStore
    from adaptune.sweep.tensorboard_view import SweepView

    spec = get_experiment("paper_full")
    runs = plan(spec).runs[: args.runs]
    result: dict[str, object] = {"runs": len(runs), "curve_points_per_run": args.curve_points + 3}
    with tempfile.TemporaryDirectory(prefix="adaptune-tb-") as scratch:
        root = Path(scratch)
        started = time.perf_counter()
        write_store(root / "store", runs, args.curve_points)
        result["seconds_to_write_stub_runs"] = round(time.perf_counter() - started, 1)
        for curves in (False, True):
            view = SweepView(spec, RunStore(root / "store"), root / f"view-{curves}", curves=curves)
            view.runs, view.labels = runs, {run.run_id: view.labels[run.run_id] for run in runs}  # --runs: the first N only
            started = time.perf_counter()
            view.build()
            timing = {"seconds_to_build_view": round(time.perf_counter() - started, 1), **time_view(view.view_dir, len(runs))}
            result["with_curves" if curves else "summaries_only"] = timing
            print(json.dumps({("with_curves" if curves else "summaries_only"): timing}), flush=True)
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
