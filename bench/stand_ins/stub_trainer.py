"""A stand-in for adaptune.train.loop.train_and_evaluate that trains nothing: it writes a complete record.

Used through $ADAPTUNE_TRAINER (adaptune.sweep.shard_runner.TRAINER_ENV) to run a paper-scale DAG's shape under
kfp.local in seconds, and directly by the run-store tests. Behaviour per run is steered by files in
$STUB_TRAINER_DIR: `calls/<run_id>` counts the calls; `transient/<run_id>` holds how many more
calls raise ConnectionError; `nan/<run_id>` makes the run diverge (a failed record); `sleep/<run_id>` holds its own
seconds; `kill/inside/<run_id>` SIGKILLs the process halfway through the run, once; `completions/<run_id>` counts the
calls that returned a record. $STUB_SAVE_STATE=1 saves a stand-in resume state as each run starts.
$STUB_SLEEP_S makes each call take that long, and records the process that trained it (`stub_pid`):
what a test of runs trained side by side reads. $STUB_SECONDS_PER_EXAMPLE gives a finished record a known throughput (wall time = training rows x
epochs x that, on device $STUB_DEVICE, default "stub"): what the plan's calibration reads. $STUB_SYNC_EVERY_S saves a
stand-in state that often during the sleep and calls `on_state_saved` (the run store's sync), as the loop does.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from adaptune.data.tasks import get_task, scored_companions
from adaptune.train.config import TrainConfig
from adaptune.train.record import run_record


def control_dir() -> Path:
    return Path(os.environ["STUB_TRAINER_DIR"])


def calls(run_id: str) -> int:
    path = control_dir() / "calls" / run_id
    return int(path.read_text()) if path.is_file() else 0


def train(config: TrainConfig, out_dir: str | os.PathLike[str], write_record: bool = True,
          on_state_saved: Callable[[], None] | None = None, **_: Any) -> dict[str, Any]:
    root = control_dir()
    (root / "calls").mkdir(parents=True, exist_ok=True)
    (root / "calls" / config.run_id).write_text(str(calls(config.run_id) + 1))
    transient = root / "transient" / config.run_id
    if transient.is_file() and int(transient.read_text()) > 0:
        transient.write_text(str(int(transient.read_text()) - 1))
        raise ConnectionError(f"stub: storage unreachable while training {config.run_id}")
    own_sleep = root / "sleep" / config.run_id
    seconds = float(own_sleep.read_text()) if own_sleep.is_file() else float(os.environ.get("STUB_SLEEP_S") or 0)
    if os.environ.get("STUB_SAVE_STATE") == "1":
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        (Path(out_dir) / "train_state.pt").write_bytes(b"state")
    if consume(f"kill/inside/{config.run_id}"):  # the node dies halfway through this run (once)
        _sleep(seconds / 2, Path(out_dir), on_state_saved)
        os.kill(os.getpid(), signal.SIGKILL)
    _sleep(seconds, Path(out_dir), on_state_saved)
    task = get_task(config.task)
    record = run_record(config, task.primary_metric, device=os.environ.get("STUB_DEVICE", "stub"))
    if (root / "nan" / config.run_id).is_file():
        record.update(status="failed", reason="non-finite training loss (nan) at step 1: the learning rate is likely too high")
    else:
        rows = config.max_train_examples or 100
        # A deterministic score per run, so tables and figures have something to rank.
        score = int(hashlib.sha1(config.run_id.encode()).hexdigest()[:6], 16) / 0xFFFFFF
        metrics = {name: score for name in task.metrics}
        companions = {name: {"val_metrics": metrics, "test_metrics": metrics} for name in scored_companions(config.task)}
        record.update(best_epoch=config.epochs, val_metrics=metrics, test_metrics=metrics, trained_params=1, total_params=100,
                      companions=companions,
                      curve=[{"epoch": config.epochs, "step": 1, "train_loss": 1.0 - score, "val_metrics": metrics}],
                      wall_time_s=rows * config.epochs * float(os.environ.get("STUB_SECONDS_PER_EXAMPLE") or 0),
                      split_sizes={"train": rows, "validation": 10, "test": 10}, stub_pid=os.getpid())
    if write_record:
        Path(out_dir, "record.json").write_text(json.dumps(record))
    (root / "completions").mkdir(exist_ok=True)
    (root / "completions" / config.run_id).write_text(str(_count(root / "completions" / config.run_id) + 1))
    return record


def _count(path: Path) -> int:
    return int(path.read_text()) if path.is_file() else 0


def _sleep(seconds: float, out_dir: Path, on_state_saved: Callable[[], None] | None) -> None:
    every = float(os.environ.get("STUB_SYNC_EVERY_S") or 0)
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        time.sleep(min(left, every) if every else left)
        if every and on_state_saved is not None:
            out_dir.mkdir(parents=True, exist_ok=True)  # as the loop's atomic_write does, were the folder deleted meanwhile
            (out_dir / "train_state.pt").write_bytes(str(time.time()).encode())
            on_state_saved()


def consume(token: str) -> bool:
    """Take a one-shot token file under the control dir: True for exactly one caller, across processes."""
    try:
        os.unlink(control_dir() / token)
    except FileNotFoundError:
        return False
    return True
