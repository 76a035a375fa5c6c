"""`make tensorboard` as a user meets it: the columns the HParams table shows by default, the tag groups Time Series
lists first, TensorBoard bound to this machine unless asked, and stopped with the command on SIGTERM as on Ctrl-C.

The dashboard ticks the first 5 hyperparameters of the experiment, those marked `differs` first (tf-hparams-query-pane's
Math.min(5, ...) over hparams sorted by differs; the backend's order: backend_context._sort_and_reduce_to_hparams_limit),
so the columns shown by default are the ones the experiment marks; the server's /data/plugin/hparams/experiment
(http_api.md) returns that order.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from adaptune.sweep.experiments import get_experiment
from adaptune.sweep.plan import plan
from adaptune.sweep.tensorboard_view import DASHBOARD_COLUMNS, EXPERIMENT_FILE, shown_by_default, write_experiment
from adaptune.train.event_log import read_events

REPO_ROOT = Path(__file__).resolve().parents[1]
KEPT_GLUE_LOCAL = REPO_ROOT / "analysis" / "measured" / "glue_local"


def _marked(path: Path) -> dict[str, bool]:
    from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData

    (event,) = [event for event in read_events(path) if event.HasField("summary")]
    content = HParamsPluginData.FromString(event.summary.value[0].metadata.plugin_data.content)
    return {info.name: info.differs for info in content.experiment.hparam_infos}


@pytest.mark.parametrize(("name", "shown"), [
    # glue_local varies task, method, size, lr, epochs and seed: task and status were hidden behind five of them.
    ("glue_local", {"task", "method", "status", "lr", "epochs"}),
    ("smoke", {"task", "method", "status", "lr", "epochs"}),  # the head alone's probe takes 10 epochs, the others 2
])
def test_the_hparams_table_shows_task_method_status_and_what_the_sweep_varies(tmp_path: Path, name: str, shown: set[str]) -> None:
    spec = get_experiment(name)
    write_experiment(tmp_path / EXPERIMENT_FILE, spec, plan(spec).runs)
    marked = _marked(tmp_path / EXPERIMENT_FILE)
    assert {hparam for hparam, differs in marked.items() if differs} == shown
    assert len(shown) <= DASHBOARD_COLUMNS and set(marked) >= {"seed", "size_or_rank", "backbone"}  # the rest one tick away


def test_at_most_the_dashboards_five_columns_and_seed_last() -> None:
    assert shown_by_default({"lr", "epochs", "seed", "backbone"}) == ["task", "method", "status", "lr", "epochs"]
    assert shown_by_default({"seed"}) == ["task", "method", "status", "seed"]
    assert shown_by_default(set()) == ["task", "method", "status"]


def test_time_series_lists_the_loss_curves_before_the_score_cards(tmp_path: Path) -> None:
    from adaptune.train.event_log import CurveLog, write_run_summary

    curve = CurveLog(tmp_path)
    curve.start(0)
    curve.train_step(1, 0.7, 1e-3)
    curve.epoch(1, 1, 0.7, {"accuracy": 0.8})
    curve.close()
    record = {"task": "mrpc", "method": {"name": "adapters", "size": 16}, "method_label": "adapters16", "lr": 1e-3, "epochs": 1,
              "seed": 0, "backbone": "all-MiniLM-L6-v2", "status": "ok", "primary_metric": "accuracy",
              "val_metrics": {"accuracy": 0.8}, "test_metrics": {"accuracy": 0.75}, "trained_params": 10, "curve": [{"step": 1}]}
    write_run_summary(tmp_path, record)
    tags = {value.tag for path in (tmp_path / "tensorboard").iterdir() for event in read_events(path)
            for value in event.summary.value if not value.tag.startswith("_hparams_")}
    groups = sorted({tag.split("/")[0] for tag in tags})  # Time Series' order of its groups
    assert groups[0] == "loss" and groups.index("lr") < groups.index("score")
    assert "loss/train" in tags and {"score/validation", "score/test", "score/test_accuracy", "score/trained_params"} <= tags


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _listening(port: int) -> list[str]:
    """The local addresses listening on `port` (Linux /proc/net/tcp and tcp6, state 0A = LISTEN)."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, port_hex = local.rsplit(":", 1)
            if state == "0A" and int(port_hex, 16) == port:
                found.append(address)
    return found


def _children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(child) for child in path.read_text().split()] if path.exists() else []


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    status = Path(f"/proc/{pid}/status")
    return not status.exists() or "State:\tZ" in status.read_text()


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="reads Linux's /proc for listening sockets and children")
def test_make_tensorboard_serves_localhost_only_and_stops_with_its_command_on_sigterm(tmp_path: Path) -> None:
    port = _free_port()
    command = subprocess.Popen(
        [sys.executable, "-m", "pipelines", "tensorboard", "glue_local", "--runs-root", str(KEPT_GLUE_LOCAL), "--out", str(tmp_path),
         "--port", str(port)], cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.time() + 90
        while time.time() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/data/runs", timeout=5) as response:
                    if json.load(response):
                        break
            except OSError:
                time.sleep(0.5)
        else:
            raise AssertionError(f"TensorBoard did not answer on port {port} within 90 s")
        loopback = {"0100007F", "00000000000000000000000001000000"}  # 127.0.0.1, ::1
        assert _listening(port) and set(_listening(port)) <= loopback, _listening(port)  # never 0.0.0.0 or ::
        (server,) = _children(command.pid)

        command.send_signal(signal.SIGTERM)
        assert command.wait(timeout=30) == 128 + signal.SIGTERM
        deadline = time.time() + 15
        while not _gone(server) and time.time() < deadline:
            time.sleep(0.2)
        assert _gone(server), "TensorBoard outlived the command"
        with socket.socket() as probe:  # the port is free again
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(("127.0.0.1", port))
        assert "this machine only" in command.stdout.read()
    finally:
        if command.poll() is None:
            command.kill()
            command.wait()
