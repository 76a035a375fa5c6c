"""The sweep in TensorBoard: each run's event files and the sweep's HParams view, read back by
TensorBoard itself (its event loader; its server's HParams API, the one its dashboard calls).

HParams plugin API: tensorboard/plugins/hparams/api.proto (ListSessionGroupsRequest) and
http_api.md ("/data/plugin/hparams/experiment", "/data/plugin/hparams/session_groups").
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from adaptune.core.run_files import EVENTS_DIR, RECORD_FILE
from adaptune.sweep.experiments import get_experiment
from adaptune.sweep.plan import plan
from adaptune.sweep.store import RUNS_DIR, RunStore
from adaptune.sweep.tensorboard_view import EXPERIMENT_FILE, SweepView, run_label
from adaptune.train.config import TrainConfig
from adaptune.train.event_log import SUMMARY_FILE, read_events, write_run_summary
from adaptune.train.record import failed_run_record
from bench.stand_ins.loopback import HPARAMS_STATUSES as ALL_STATUSES
from bench.stand_ins.loopback import free_port as _free_port
from bench.stand_ins.loopback import post_json as _post
from tests.gcs_emulator import gcs  # noqa: F401, F811  (the fixture)


def _copy_events(source: Path, target: Path) -> None:
    """A run store holding only what the view reads (records and event folders), not the checkpoints."""
    for run in (source / RUNS_DIR).iterdir():
        (target / RUNS_DIR / run.name).mkdir(parents=True)
        shutil.copy(run / RECORD_FILE, target / RUNS_DIR / run.name / RECORD_FILE)
        shutil.copytree(run / EVENTS_DIR, target / RUNS_DIR / run.name / EVENTS_DIR)


@pytest.fixture()
def served(tmp_path: Path) -> Any:
    """Serve a directory with TensorBoard as `make tensorboard` does; yields its port once it answers."""
    servers = []

    def serve(logdir: Path) -> int:
        port = _free_port()
        servers.append(subprocess.Popen([sys.executable, "-m", "tensorboard.main", "--logdir", str(logdir), "--port", str(port),
                                         "--host", "127.0.0.1"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/data/runs", timeout=5) as response:
                    if len(json.load(response)) > 1:  # the experiment's "." and at least one run loaded
                        return port
            except OSError:
                pass
            time.sleep(0.5)
        raise AssertionError("TensorBoard did not serve the view within 60 s")

    yield serve
    for server in servers:
        server.terminate()
        server.wait(10)


@pytest.mark.slow
@pytest.mark.xdist_group("containers")  # shares the smoke_run fixture with the other smoke tests
def test_the_hparams_view_names_every_planned_run_of_the_smoke_sweep(smoke_run: dict[str, Path], tmp_path: Path, served: Any) -> None:
    store_root = tmp_path / "store"
    _copy_events(smoke_run["runs.parquet"].parent / "store", store_root)  # run_local's default store
    # Another sweep's run in the same store: the view leaves it out.
    other = TrainConfig(task="rte", method={"name": "full"}, lr=1e-5, epochs=1)
    write_run_summary(store_root / RUNS_DIR / other.run_id, failed_run_record(other, "another sweep's run"))
    spec = get_experiment("smoke")
    planned = plan(spec).runs
    view = SweepView(spec, RunStore(store_root), tmp_path / "view")
    assert view.build() == len(planned)
    assert (tmp_path / "view" / EXPERIMENT_FILE).is_file()

    port = served(tmp_path / "view")
    experiment = _post(port, "/data/plugin/hparams/experiment", {"experimentName": ""})
    domains = {info["name"]: info.get("domainDiscrete") for info in experiment["hparamInfos"]}
    # Task, method and status, then what the grid varies, are marked, so the dashboard's default columns show them.
    assert {info["name"] for info in experiment["hparamInfos"] if info["differs"]} == {"task", "method", "status", "lr", "epochs"}
    assert domains["task"] == sorted({run.task for run in planned})
    assert domains["lr"] == sorted({run.lr for run in planned})
    assert {metric["name"]["tag"] for metric in experiment["metricInfos"]} == {"score/validation", "score/test"}
    groups = _post(port, "/data/plugin/hparams/session_groups", {
        "experimentName": "", "allowedStatuses": ALL_STATUSES, "startIndex": 0, "sliceSize": 1000,
        "colParams": [{"hparam": "task"}, {"hparam": "method"}, {"metric": {"tag": "score/validation"}}]})["sessionGroups"]
    assert sorted(group["name"] for group in groups) == sorted(run_label(run) for run in planned)
    by_label = {group["name"]: group for group in groups}
    for run in planned:
        record = json.loads((store_root / RUNS_DIR / run.run_id / RECORD_FILE).read_text())
        group = by_label[run_label(run)]
        assert group["hparams"]["status"] == record["status"] and group["hparams"]["lr"] == run.lr
        scores = {metric["name"]["tag"]: metric["value"] for metric in group["metricValues"]}
        assert scores["score/validation"] == pytest.approx(record["val_metrics"][record["primary_metric"]])
        assert scores["score/test"] == pytest.approx(record["test_metrics"][record["primary_metric"]])


def test_a_run_that_failed_before_training_is_a_failed_session(tmp_path: Path) -> None:
    config = TrainConfig(task="mrpc", method={"name": "adapters", "size": 64}, lr=3e-4, epochs=20, seed=2)
    write_run_summary(tmp_path, failed_run_record(config, "malformed row 12 in train.tsv"))
    from tensorboard.plugins.hparams import plugin_data_pb2

    events = read_events(tmp_path / EVENTS_DIR / SUMMARY_FILE)
    contents = {value.tag: value.metadata.plugin_data.content for event in events for value in event.summary.value}
    start = plugin_data_pb2.HParamsPluginData.FromString(contents["_hparams_/session_start_info"]).session_start_info
    end = plugin_data_pb2.HParamsPluginData.FromString(contents["_hparams_/session_end_info"]).session_end_info
    assert start.hparams["status"].string_value == "failed" and start.hparams["epochs"].number_value == 20
    assert start.hparams["method"].string_value == "adapters64"
    assert end.status == 2  # api.proto: STATUS_FAILURE
    assert "score/validation" not in contents  # no score where none was measured


def test_a_bucket_view_copies_the_sweeps_event_files_and_only_what_changed(gcs: Any, tmp_path: Path) -> None:  # noqa: F811
    """On a bucket the view is a local copy (no links there), refreshed by one listing per call."""
    spec = get_experiment("smoke")
    planned = plan(spec).runs
    store = RunStore(gcs.url("store"))
    local = tmp_path / "made"
    for run in planned[:2]:
        write_run_summary(local / run.run_id, failed_run_record(run, "stand-in"))
        store.files.fs.put(str(local / run.run_id / EVENTS_DIR), store.files.url(RUNS_DIR, run.run_id, EVENTS_DIR).removeprefix("gs://"), recursive=True)
    other = TrainConfig(task="rte", method={"name": "full"}, lr=1e-5, epochs=1)
    write_run_summary(local / other.run_id, failed_run_record(other, "another sweep's run"))
    store.files.fs.put(str(local / other.run_id / EVENTS_DIR), store.files.url(RUNS_DIR, other.run_id, EVENTS_DIR).removeprefix("gs://"), recursive=True)

    view = SweepView(spec, store, tmp_path / "view")
    assert view.build() == 2
    copied = sorted(path.relative_to(tmp_path / "view").as_posix() for path in (tmp_path / "view").rglob("events.*"))
    assert copied == sorted([EXPERIMENT_FILE] + [f"{run_label(run)}/{SUMMARY_FILE}" for run in planned[:2]])

    downloads: list[str] = []
    original = store.files.get_file
    store.files.get_file = lambda target, *parts: (downloads.append(parts[-3]), original(target, *parts))[1]  # type: ignore[method-assign]
    assert view.mirror() == 2 and downloads == []  # nothing changed: nothing copied
    record = failed_run_record(planned[2], "now it has events too")
    write_run_summary(local / planned[2].run_id, record)
    store.files.fs.put(str(local / planned[2].run_id / EVENTS_DIR), store.files.url(RUNS_DIR, planned[2].run_id, EVENTS_DIR).removeprefix("gs://"),
                       recursive=True)
    assert view.mirror() == 3 and downloads == [planned[2].run_id]
