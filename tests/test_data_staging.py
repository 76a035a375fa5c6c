"""`stage-data`: an experiment's data files copied into the run store's data/ mirror, each checked first.

What it must hold to (adaptune.sweep.data_staging):
- the smoke experiment's files (MRPC, SMS spam) staged from the real mirror are byte for byte the publishers',
  where a run reads them (load_task_data on the staged mirror), and staging again copies nothing;
- a file whose md5 is not the known copy's, or that its task cannot read (a missing column), is refused in one
  line naming it (path, md5 got and expected), after the other files are staged, and a good staged copy stays;
- a task found nowhere is one line naming the publisher's page, the file and the folder to put it in;
- the same on a bucket: memory:// (hashed as read) and gs:// on the GCS emulator (its md5Hash).
"""

from __future__ import annotations

import dataclasses
import filecmp
from pathlib import Path

import fsspec
import pytest

from adaptune.data import checksums
from adaptune.data.loading import load_task_data
from adaptune.sweep.data_prep import prepare_plan_data, source_data_dir
from adaptune.sweep.data_staging import DataStagingError, data_tasks, mirror_hint, stage_data
from adaptune.sweep.experiments import get_experiment
from adaptune.sweep.plan import plan
from adaptune.sweep.spec import Sweep
from adaptune.sweep.store import RunStore
from pipelines.__main__ import main
from tests.gcs_emulator import bucket  # noqa: F401 (a fixture)

SMOKE_FILES = ("glue/MRPC/train.tsv", "glue/MRPC/dev.tsv", "extra/sms_spam/SMSSpamCollection")
SMS = "extra/sms_spam/SMSSpamCollection"


def _spec(*tasks: str):
    """An experiment of one run per task (the smoke experiment's settings): what stage_data reads is its tasks."""
    return dataclasses.replace(get_experiment("smoke"), name="staging", ablation=None,
                               sweeps=(Sweep(tasks=tasks, methods=({"name": "full"},), learning_rates=(1e-4,), epochs=(1,)),))


def _mirror_of(shared: Path, into: Path, *files: str) -> Path:
    """A --from folder holding links to some of the real mirror's files."""
    for relative in files:
        (into / relative).parent.mkdir(parents=True, exist_ok=True)
        (into / relative).symlink_to(shared / relative)
    return into


def _actions(lines: list[dict]) -> dict[str, str]:
    return {line["file"]: line["action"] for line in lines}


def test_the_smoke_data_staged_into_a_local_store(tmp_path: Path, shared_data_dir: Path) -> None:
    store = RunStore(tmp_path / "store")
    spec = get_experiment("smoke")
    assert data_tasks(spec) == ["mrpc", "sms_spam"]
    assert _actions(stage_data(spec, store, shared_data_dir)) == dict.fromkeys(SMOKE_FILES, "staged")
    mirror = store.data_mirror()
    assert mirror == tmp_path / "store" / "data"
    for relative in SMOKE_FILES:
        assert filecmp.cmp(shared_data_dir / relative, mirror / relative, shallow=False)
    assert len(load_task_data("sms_spam", mirror)["test"]) == 558  # the paper's split, read from the staged mirror
    versions = store.files.file_versions("data")
    assert _actions(stage_data(spec, store, shared_data_dir)) == dict.fromkeys(SMOKE_FILES, "already staged")
    assert _actions(stage_data(spec, store)) == dict.fromkeys(SMOKE_FILES, "already staged")  # no --from: the store's copies
    assert store.files.file_versions("data") == versions  # nothing written again
    assert _actions(stage_data(spec, store, shared_data_dir, force=True)) == dict.fromkeys(SMOKE_FILES, "staged")


def test_a_corrupted_copy_is_refused_and_nothing_else_is_lost(tmp_path: Path, shared_data_dir: Path) -> None:
    store = RunStore(tmp_path / "store")
    spec = get_experiment("smoke")
    stage_data(_spec("sms_spam"), store, shared_data_dir)  # a good copy staged earlier
    source = _mirror_of(shared_data_dir, tmp_path / "from", *SMOKE_FILES[:2])
    corrupted = source / SMS
    corrupted.parent.mkdir(parents=True)
    corrupted.write_bytes((shared_data_dir / SMS).read_bytes()[:-100])  # a truncated download
    with pytest.raises(DataStagingError) as refused:
        stage_data(spec, store, source)
    message = str(refused.value)
    got, expected = checksums.file_md5(corrupted), checksums.KNOWN_MD5[SMS]
    problem = next(line for line in message.splitlines() if SMS in line)
    assert f"sms_spam: {corrupted}: md5 {got}, not the {expected}" in problem and "download the publisher's file again" in problem
    assert len(message.splitlines()) == 2  # the count, then one line
    assert _actions(refused.value.staged) == {**dict.fromkeys(SMOKE_FILES[:2], "staged"), SMS: "refused"}
    for relative in SMOKE_FILES:  # MRPC staged; the store's good SMS copy kept
        assert filecmp.cmp(shared_data_dir / relative, store.data_mirror() / relative, shallow=False)


def test_a_file_its_task_cannot_read_is_refused_before_it_is_copied(tmp_path: Path, shared_data_dir: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """No md5 is known for this file (as for a task the project has no copy of): the reader refuses it."""
    monkeypatch.delitem(checksums.KNOWN_MD5, "glue/RTE/train.tsv")
    source = _mirror_of(shared_data_dir, tmp_path / "from", "glue/RTE/dev.tsv")
    rows = (shared_data_dir / "glue/RTE/train.tsv").read_text(encoding="utf-8").splitlines()
    without_sentence2 = ["\t".join(fields[:2] + fields[3:]) for fields in (row.split("\t") for row in rows)]
    (source / "glue/RTE/train.tsv").write_text("\n".join(without_sentence2) + "\n", encoding="utf-8")
    store = RunStore(tmp_path / "store")
    with pytest.raises(DataStagingError) as refused:
        stage_data(_spec("rte"), store, source)
    (problem,) = str(refused.value).splitlines()[1:]
    assert problem.startswith(f"  rte: {source / 'glue/RTE/train.tsv'} does not read as rte's train file (DataError: ")
    assert "'sentence2'" in problem
    assert _actions(refused.value.staged) == {"glue/RTE/train.tsv": "refused", "glue/RTE/dev.tsv": "staged"}
    assert not (store.data_mirror() / "glue/RTE/train.tsv").exists()


def test_a_task_found_nowhere_names_its_publisher(tmp_path: Path, shared_data_dir: Path) -> None:
    store = RunStore(tmp_path / "store")
    with pytest.raises(DataStagingError) as missing:
        stage_data(_spec("corporate_messaging", "qnli", "sms_spam"), store, shared_data_dir)
    lines = str(missing.value).splitlines()[1:]
    assert lines[0] == (f"  corporate_messaging: not staged and not in {shared_data_dir}: download Corporate-messaging-DFE.csv "
                        f"from https://data.world/crowdflower/corporate-messaging into {shared_data_dir}/extra/corporate_messaging/ "
                        f"and pass --from {shared_data_dir} (file name and columns as the publisher documents them: no copy was "
                        "at hand to check)")
    assert lines[1].startswith(f"  qnli: not staged and not in {shared_data_dir}: download train.tsv from "
                               f"https://gluebenchmark.com/tasks into {shared_data_dir}/glue/QNLI/")
    assert "nyu-mll/glue qnli" in lines[1] and len(lines) == 2
    assert _actions(missing.value.staged) == {"extra/corporate_messaging/Corporate-messaging-DFE.csv": "missing",
                                              "glue/QNLI/train.tsv": "missing", "glue/QNLI/dev.tsv": "staged", SMS: "staged"}


def test_the_companion_tasks_files_are_staged_too() -> None:
    """MNLI-mm is scored by the MNLI runs: its dev file belongs to the plan's data."""
    assert data_tasks(_spec("mnli_m", "rte")) == ["mnli_m", "mnli_mm", "rte"]


def test_staged_into_a_bucket(bucket: str, shared_data_dir: Path) -> None:  # noqa: F811 (the fixture)
    store = RunStore(bucket)
    spec = _spec("mrpc", "sms_spam")
    assert _actions(stage_data(spec, store, shared_data_dir)) == dict.fromkeys(SMOKE_FILES, "staged")
    fs, base = fsspec.core.url_to_fs(bucket)
    for relative in SMOKE_FILES:
        assert fs.cat_file(f"{base}/data/{relative}") == (shared_data_dir / relative).read_bytes()
    assert _actions(stage_data(spec, store, shared_data_dir)) == dict.fromkeys(SMOKE_FILES, "already staged")
    assert store.data_mirror() is None
    assert mirror_hint(store) == (f"data mirror: {bucket}/data; a submission with this run store reads it when its data_dir "
                                  "is empty (the data-preparation step, adaptune.sweep.data_prep.source_data_dir)")
    # that step finds the staged mirror itself and prepares from it
    mirror = source_data_dir(store, "", {"mrpc", "sms_spam"})
    assert mirror is not None and filecmp.cmp(mirror / SMS, shared_data_dir / SMS, shallow=False)
    prepared = prepare_plan_data(plan(spec), store, mirror)
    assert [entry.action for entry in prepared.tasks] == ["prepared", "prepared"]


def test_the_command_line(tmp_path: Path, shared_data_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "store"
    assert main(["stage-data", "smoke", "--runs-root", str(root), "--from", str(shared_data_dir)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"mrpc: glue/MRPC/train.tsv: staged (0.9 MB) -> {root}/data/glue/MRPC/train.tsv"
    assert out[-1].startswith("3 files in ") and out[-1].endswith(f"a local run reads it with --data-dir {root}/data")
    assert main(["stage-data", "smoke", "--runs-root", str(root), "--from", str(tmp_path / "nowhere")]) == 2
    assert capsys.readouterr().err.startswith(f"error: --from {tmp_path / 'nowhere'}: no such folder")
