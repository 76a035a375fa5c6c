"""The data-preparation step: a plan's tasks read once, checked, split and tokenized into the run store.

What it must hold to (adaptune.sweep.data_prep, adaptune.data.prepared):
- the prepared splits are row for row the mirror's, and a second preparation of the same data reuses them;
- a run given the prepared folder reads no source file, asks no hub and tokenizes nothing, and gets exactly the
  rows it would have got from the mirror (training and evaluation-only alike);
- a problem (a file that is not the known copy, rows that are not the paper's Table 3, a task found nowhere) is one
  line per task, after the tasks without one are prepared;
- on a bucket (memory://, and gs:// on the GCS emulator) a shard's tasks are downloaded to its own disk and read there;
- prepared folders never mix: each marker is one create-only write (GCS's ifGenerationMatch=0,
  https://cloud.google.com/storage/docs/request-preconditions; O_EXCL on a folder), so of two writers racing on one
  task the first to finish names its own complete set and the other takes it; a reader downloads only what the
  markers name; a writer killed mid-upload named nothing, and the next one prepares the task whole.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import datasets
import pytest

from adaptune.data import checksums
from adaptune.data.loading import load_task_data
from adaptune.data.prepared import PLAN_MARKER, PreparedData
from adaptune.data.tasks import get_task
from adaptune.model.backbone import load_tokenizer
from adaptune.sweep import data_prep
from adaptune.sweep.data_prep import PREPARED_DIR, DataPreparationError, prepare_plan_data, readable_data_dir
from adaptune.sweep.experiments import get_experiment
from adaptune.sweep.plan import plan
from adaptune.sweep.spec import Sweep
from adaptune.sweep.store import RunStore
from adaptune.train import run_data
from adaptune.train.run_data import prepare_run_data
from tests.gcs_emulator import bucket, gcs_emulator  # noqa: F401 (bucket: a fixture)

SMS = "extra/sms_spam/SMSSpamCollection"
MRPC = ("glue/MRPC/train.tsv", "glue/MRPC/dev.tsv")


def _plan(*tasks: str, max_length: int = 64):
    """One run per task at the smoke experiment's settings: what the step prepares is the plan's tasks and lengths."""
    spec = dataclasses.replace(get_experiment("smoke"), name="prep", ablation=None,
                               sweeps=(Sweep(tasks=tasks, methods=({"name": "full"},), learning_rates=(1e-4,), epochs=(1,),
                                             max_length=max_length),))
    return plan(spec)


def _mirror(shared: Path, into: Path, *files: str) -> Path:
    for relative in files:
        (into / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shared / relative, into / relative)
    return into


def _columns(dataset: datasets.Dataset) -> dict[str, list]:
    return {name: dataset[name] for name in ("text_a", "text_b", "label")}


def test_prepared_splits_are_the_mirrors_and_are_reused(tmp_path: Path, shared_data_dir: Path) -> None:
    store = RunStore(tmp_path / "store")
    first = prepare_plan_data(_plan("mrpc", "sms_spam"), store, shared_data_dir)
    assert {entry.task: entry.action for entry in first.tasks} == {"mrpc": "prepared", "sms_spam": "prepared"}
    sms = next(entry for entry in first.tasks if entry.task == "sms_spam")
    assert (sms.rows["train"], sms.rows["validation"], sms.rows["test"]) == get_task("sms_spam").paper_sizes
    for task in ("mrpc", "sms_spam"):
        prepared, mirror = load_task_data(task, first.url), load_task_data(task, shared_data_dir)
        assert set(prepared) == set(mirror)
        for split in mirror:
            assert _columns(prepared[split]) == _columns(mirror[split]), (task, split)
    again = prepare_plan_data(_plan("mrpc", "sms_spam"), store, shared_data_dir)
    assert again.url == first.url
    assert {entry.task: (entry.action, entry.tokenized) for entry in again.tasks} == {
        task: ("reused", [f"{get_experiment('smoke').backbone}@64: reused"]) for task in ("mrpc", "sms_spam")}
    # a new max length tokenizes again, from the prepared splits, and keeps the task's folder
    longer = prepare_plan_data(_plan("sms_spam", max_length=96), store, shared_data_dir)
    assert longer.tasks[0].action == "reused" and longer.tasks[0].tokenized[0].endswith("@96: prepared")
    assert longer.tasks[0].folder == sms.folder
    assert ("| sms_spam | mirror extra/sms_spam/SMSSpamCollection | checked on a real file before | md5 known, matches | 4459 | 557 | 558 "
            "| reused |") in longer.markdown()


def test_a_run_reads_the_prepared_data_alone(tmp_path: Path, shared_data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    prepared = prepare_plan_data(_plan("mrpc"), RunStore(tmp_path / "store"), shared_data_dir).url
    task, tokenizer = get_task("mrpc"), load_tokenizer(get_experiment("smoke").backbone)
    arguments = (task, tokenizer, 64, 128, 200, 100)
    from_mirror = prepare_run_data(*arguments, data_dir=shared_data_dir, cache_dir=tmp_path / "cache")
    mirror_eval = prepare_run_data(*arguments, data_dir=shared_data_dir, cache_dir=tmp_path / "cache", with_train=False)

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a run given prepared data read a source, asked the hub or tokenized")

    monkeypatch.setattr("adaptune.data.splits.source_records", refuse)
    monkeypatch.setattr(datasets, "load_dataset", refuse)
    monkeypatch.setattr(run_data, "tokenize_task", refuse)
    from_prepared = prepare_run_data(*arguments, data_dir=prepared, cache_dir=tmp_path / "cache")
    prepared_eval = prepare_run_data(*arguments, data_dir=prepared, cache_dir=tmp_path / "cache", with_train=False)
    assert from_prepared.train_rows == from_mirror.train_rows
    assert from_prepared.split_sizes == from_mirror.split_sizes
    for ours, theirs in ((from_prepared, from_mirror), (prepared_eval, mirror_eval)):
        assert set(ours.eval_splits) == set(theirs.eval_splits)
        for name, split in theirs.eval_splits.items():
            assert ours.eval_splits[name].rows == split.rows and ours.eval_splits[name].references == split.references
    # a length the step did not tokenize for is one line, not a tokenization on the accelerator
    with pytest.raises(FileNotFoundError, match="not tokenized by this tokenizer at max_length 32"):
        prepare_run_data(task, tokenizer, 32, 128, 200, 100, data_dir=prepared)


def test_each_task_with_a_problem_is_one_line_and_the_others_are_prepared(tmp_path: Path, shared_data_dir: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    mirror = _mirror(shared_data_dir, tmp_path / "mirror", *MRPC, SMS, "glue/RTE/train.tsv", "glue/RTE/dev.tsv")
    lines = (mirror / SMS).read_text(encoding="utf-8").splitlines(keepends=True)
    (mirror / SMS).write_text("".join(lines[:-100]), encoding="utf-8")  # a truncated download
    rte_dev = mirror / "glue/RTE/dev.tsv"
    rte_dev.write_bytes(rte_dev.read_bytes() + b"\n")  # re-exported: one more byte
    store = RunStore(tmp_path / "store")
    with pytest.raises(DataPreparationError) as raised:
        prepare_plan_data(_plan("mrpc", "sms_spam", "rte", "corporate_messaging"), store, mirror)
    message = str(raised.value).splitlines()
    assert message[0] == "the data of the plan cannot be prepared; nothing was trained:"
    by_task = {line.split(":", 1)[0]: line for line in message[1:]}
    assert set(by_task) == {"sms_spam", "rte", "corporate_messaging"}
    assert str(mirror / SMS) in by_task["sms_spam"] and checksums.KNOWN_MD5[SMS] in by_task["sms_spam"]
    assert str(rte_dev) in by_task["rte"] and "download the publisher's file again" in by_task["rte"]
    assert "https://data.world/crowdflower/corporate-messaging" in by_task["corporate_messaging"]
    assert sorted(path.name.split("-")[0] for path in (tmp_path / "store" / "prepared").iterdir()) == ["mrpc", "problems"]
    assert data_prep.preparation_problems(_plan("mrpc", "sms_spam", "rte", "corporate_messaging"), store) == {
        task: line.split(": ", 1)[1] for task, line in by_task.items()}  # what `pipelines run` shows, as the step found it

    # with no checksum to catch it, the rows the paper's Table 3 gives do
    monkeypatch.delitem(checksums.KNOWN_MD5, SMS)
    with pytest.raises(DataPreparationError, match=r"sms_spam: splits of 4379/547/548 rows, not the paper's 4459/557/558"):
        prepare_plan_data(_plan("sms_spam"), store, mirror)


def test_a_shard_on_a_bucket_reads_its_tasks_from_its_own_disk(bucket: str, shared_data_dir: Path,  # noqa: F811 (the fixture)
                                                               tmp_path: Path) -> None:
    store = RunStore(bucket)
    prepared = prepare_plan_data(_plan("mrpc", "sms_spam"), store, shared_data_dir)
    assert prepared.url.startswith(bucket)
    local = readable_data_dir(store, prepared.url, {"sms_spam"})
    assert Path(local).is_relative_to(Path(local).anchor) and (Path(local) / PLAN_MARKER).is_file()
    assert json.loads((Path(local) / PLAN_MARKER).read_text())["tasks"].keys() == {"mrpc", "sms_spam"}
    assert not (Path(local).parent / PreparedData.open(Path(local)).tasks["mrpc"].removeprefix("../")).exists()  # not this shard's
    loaded = load_task_data("sms_spam", local)
    assert _columns(loaded["test"]) == _columns(load_task_data("sms_spam", shared_data_dir)["test"])
    assert readable_data_dir(store, shared_data_dir) == shared_data_dir  # a mirror is read as given


def test_squad_runs_take_their_questions_windows_from_the_prepared_data(tmp_path: Path, shared_data_dir: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    planned = _plan("squad", max_length=384)
    (run,) = planned.runs
    prepared = prepare_plan_data(planned, RunStore(tmp_path / "store"), shared_data_dir)
    assert prepared.tasks[0].tokenized == [f"{run.backbone}@384/{run.doc_stride}: prepared"]
    task, tokenizer = get_task("squad"), load_tokenizer(run.backbone)
    arguments = (task, tokenizer, 384, run.doc_stride, 60, 40)
    from_mirror = prepare_run_data(*arguments, data_dir=shared_data_dir)  # the dev-articles stand-in: no train file here
    monkeypatch.setattr(run_data, "prepare_features", lambda *args, **kwargs: pytest.fail("a run given prepared data windowed"))
    from_prepared = prepare_run_data(*arguments, data_dir=prepared.url)
    assert (from_prepared.data_split, from_prepared.split_sizes) == (from_mirror.data_split, from_mirror.split_sizes)
    assert from_prepared.train_rows == from_mirror.train_rows and len(from_mirror.train_rows) >= 60
    ours, theirs = from_prepared.eval_splits["validation"], from_mirror.eval_splits["validation"]
    assert ours.rows == theirs.rows
    assert ours.features["example_id"] == theirs.features["example_id"]
    assert ours.features["offset_mapping"] == theirs.features["offset_mapping"]
    assert ours.examples["id"] == theirs.examples["id"]


def test_a_never_read_definition_from_a_file_of_unknown_checksum_says_so(tmp_path: Path) -> None:
    """Corporate messaging's definition was declared from the publisher's docs; a file of its declared name, columns and
    Table 3's rows prepares, and the step's table says the definition was never read before and the checksum is unknown."""
    task = get_task("corporate_messaging")
    assert not task.source.verified
    mirror = _corporate_messaging_file(tmp_path / "mirror", sum(task.paper_sizes))
    entry = prepare_plan_data(_plan("corporate_messaging"), RunStore(tmp_path / "store"), mirror).tasks[0]
    assert entry.definition.startswith("never read before") and entry.checksum == "not known: sha256 recorded in TASK.json only"
    assert (entry.rows["train"], entry.rows["validation"], entry.rows["test"]) == task.paper_sizes


def _corporate_messaging_file(root: Path, rows: int) -> Path:
    """A file in corporate messaging's declared layout (text, category; four categories), `rows` rows."""
    path = root / get_task("corporate_messaging").source.files[0][1]
    path.parent.mkdir(parents=True)
    categories = ("Action", "Dialogue", "Exclude", "Information")
    lines = ["text,category"] + [f"message number {i} about topic {i % 17},{categories[i % 4]}" for i in range(rows)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return root


def _task_folder(store: RunStore, task: str) -> tuple[str, list[str]]:
    """The one prepared folder of `task` in the store, and what it holds."""
    (folder,) = [name for name in store.files.names(PREPARED_DIR) if name.startswith(f"{task}-")]
    return folder, store.files.names(PREPARED_DIR, folder)


def _same_as_mirror(task: str, data_dir: object, shared_data_dir: Path) -> None:
    prepared, mirror = load_task_data(task, data_dir), load_task_data(task, shared_data_dir)
    assert set(prepared) == set(mirror)
    for split in mirror:
        assert _columns(prepared[split]) == _columns(mirror[split]), (task, split)


def test_two_writers_racing_on_one_task_leave_one_writers_complete_set(bucket: str, shared_data_dir: Path,  # noqa: F811
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Both find no TASK.json and upload their own splits (a barrier holds each until the other has its set ready);
    one marker is created, the other writer's folder goes, and both name the same folder. A reader then downloads
    what the markers name and nothing beside it (here a dead writer's partial folder)."""
    both_ready = threading.Barrier(2, timeout=120)
    write_task = data_prep.write_task

    def write_then_wait(*args: object, **kwargs: object) -> None:
        write_task(*args, **kwargs)  # type: ignore[arg-type]
        both_ready.wait()

    monkeypatch.setattr(data_prep, "write_task", write_then_wait)
    results: dict[str, object] = {}

    def writer(name: str) -> None:
        try:
            results[name] = prepare_plan_data(_plan("mrpc"), RunStore(bucket), shared_data_dir)
        except BaseException as error:  # noqa: BLE001 -- shown by the assertion below
            results[name] = error

    threads = [threading.Thread(target=writer, args=(name,)) for name in ("a", "b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    first, second = results["a"], results["b"]
    assert isinstance(first, data_prep.PreparedPlan) and isinstance(second, data_prep.PreparedPlan), results
    assert first.url == second.url and first.tasks[0].folder == second.tasks[0].folder
    assert sorted(result.tasks[0].action for result in (first, second)) == ["prepared", "reused"]
    assert first.tasks[0].rows == second.tasks[0].rows

    store = RunStore(bucket)
    folder, held = _task_folder(store, "mrpc")
    info = store.files.read_json(PREPARED_DIR, folder, "TASK.json")
    assert held == sorted(["TASK.json", info["raw"], "tokenized"])  # the loser's splits are gone
    tokenized = store.files.names(PREPARED_DIR, folder, "tokenized")
    (marker,) = [name for name in tokenized if name.endswith(".json")]
    assert tokenized == sorted([marker, store.files.read_json(PREPARED_DIR, folder, "tokenized", marker)["dir"]])

    store.files.fs.pipe_file(store.files.path(PREPARED_DIR, folder, "raw-0123456789ab", "train", "data-00000-of-00001.arrow"), b"half")
    local = Path(readable_data_dir(store, first.url, {"mrpc"}))
    copied = local.parent / folder
    assert sorted(path.name for path in copied.iterdir()) == sorted(["TASK.json", info["raw"], "tokenized"])
    _same_as_mirror("mrpc", local, shared_data_dir)


KILLED_WRITER = """
import os, signal, sys
from pathlib import Path
from adaptune.sweep.store import RunStore
from adaptune.sweep.store_files import StoreFiles
from adaptune.sweep.data_prep import prepare_plan_data
from tests.test_data_prep import _plan

put, uploaded = StoreFiles.put_file, []
def put_then_die(self, source, *parts):
    put(self, source, *parts)
    uploaded.append(parts)
    if len(uploaded) == 3:  # half-way through the task's splits: the node is gone
        os.kill(os.getpid(), signal.SIGKILL)
StoreFiles.put_file = put_then_die
prepare_plan_data(_plan("mrpc"), RunStore(sys.argv[1]), Path(sys.argv[2]))
"""


@pytest.mark.parametrize("where", ["local", "gcs"])
def test_a_writer_killed_half_way_leaves_nothing_a_reader_takes(where: str, tmp_path: Path, shared_data_dir: Path) -> None:
    with contextlib.ExitStack() as stack:
        root = str(tmp_path / "store") if where == "local" else stack.enter_context(gcs_emulator(log_dir=tmp_path)).url("store")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH", "")])}
        killed = subprocess.run([sys.executable, "-c", KILLED_WRITER, root, str(shared_data_dir)], env=env, capture_output=True, timeout=300)
        assert killed.returncode == -signal.SIGKILL, killed.stderr.decode()[-2000:]
        store = RunStore(root)
        folder, held = _task_folder(store, "mrpc")
        (dead,) = held
        assert dead.startswith("raw-") and "TASK.json" not in held  # half its splits, and no marker naming them
        assert not [name for name in store.files.names(PREPARED_DIR) if name.startswith("plan-")]  # nothing a shard is given

        again = prepare_plan_data(_plan("mrpc"), store, shared_data_dir)
        assert again.tasks[0].action == "prepared" and again.tasks[0].folder == folder
        info = store.files.read_json(PREPARED_DIR, folder, "TASK.json")
        assert info["raw"] != dead and _task_folder(store, "mrpc")[1] == sorted(["TASK.json", info["raw"], "tokenized"])
        _same_as_mirror("mrpc", readable_data_dir(store, again.url, {"mrpc"}, scratch=tmp_path / "shard"), shared_data_dir)


# --- a data fault reaches `pipelines run` as one line per task ------------------------------------------------------


def _sweep_file(tmp_path: Path, *tasks: str) -> str:
    from adaptune.sweep.spec_file import spec_to_json

    spec = dataclasses.replace(_plan(*tasks).spec, name="data_faults")
    path = tmp_path / "data_faults.json"
    path.write_text(spec_to_json(spec))
    return str(path)


def test_pipelines_run_names_every_broken_task_and_file_before_the_dag(tmp_path: Path, shared_data_dir: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """MRPC's dev.tsv with a column renamed, SMS spam's file truncated, RTE whole: one line for each broken task, its
    file named, exit 2, nothing run. Before, the check named MRPC's column alone and left SMS spam to the next try."""
    from pipelines.__main__ import main

    mirror = _mirror(shared_data_dir, tmp_path / "mirror", *MRPC, SMS, "glue/RTE/train.tsv", "glue/RTE/dev.tsv")
    dev = mirror / MRPC[1]
    dev.write_text(dev.read_text(encoding="utf-8").replace("#1 String", "#1 Text", 1), encoding="utf-8")
    (mirror / SMS).write_bytes((mirror / SMS).read_bytes()[:100_000])
    out = tmp_path / "out"
    assert main(["run", _sweep_file(tmp_path, "mrpc", "sms_spam", "rte"), "--out", str(out), "--data-dir", str(mirror)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "error: the data of the plan cannot be prepared; nothing was trained:" and len(err) == 3
    assert err[1].startswith(f"mrpc: {dev} lacks the column(s) #1 String (it has Quality, #1 ID, #2 ID, #1 Text, #2 String)")
    assert err[2].startswith(f"sms_spam: {mirror / SMS}: md5 ") and checksums.KNOWN_MD5[SMS] in err[2]
    assert not (out / "kfp_root").exists()


@pytest.mark.slow
def test_a_fault_the_preparation_step_finds_ends_pipelines_run_in_one_line_per_task(stub: Path, tmp_path: Path,
                                                                                   shared_data_dir: Path) -> None:
    """The DAG run without the up-front check (as a dry run does): MRPC's train.tsv cut in half is found by the
    preparation step inside kfp.local, and reaches the caller as its line, not kfp's RuntimeError."""
    from pipelines.local import run_local

    mirror = _mirror(shared_data_dir, tmp_path / "mirror", *MRPC)
    train = mirror / MRPC[0]
    train.write_bytes(train.read_bytes()[: train.stat().st_size // 2])
    with pytest.raises(DataPreparationError) as raised:
        run_local(_sweep_file(tmp_path, "mrpc"), tmp_path / "out", data_dir=mirror, check_data=False)
    lines = str(raised.value).splitlines()
    assert lines[0] == "the data of the plan cannot be prepared; nothing was trained:" and len(lines) == 2
    assert lines[1].startswith(f"mrpc: {train}: md5 ") and checksums.KNOWN_MD5[MRPC[0]] in lines[1]
    assert not (stub / "calls").exists()
