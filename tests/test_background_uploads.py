"""A bucket store's run directory uploads off the training thread (adaptune.sweep.background_uploads), on
`memory://` (fsspec's in-memory filesystem) and the GCS JSON API emulator (tests/gcs_emulator.py).

GCS semantics relied on: an object is written whole or not at all, the last writer wins
(https://cloud.google.com/storage/docs/consistency). So the bucket holds the previous state until an
upload of the next one completes; what must hold here is that training is not held up by the upload, that
nothing half-written is uploaded, that a failure is raised, and that the directory's close waits for the
last upload (the record is published after it)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from adaptune.core.files import atomic_write
from adaptune.sweep.background_uploads import BackgroundUploads
from adaptune.sweep.store import RunStore
from tests.gcs_emulator import bucket  # noqa: F401 (the fixture)


def _held_uploads(store: RunStore, monkeypatch: pytest.MonkeyPatch) -> tuple[threading.Event, list[int]]:
    """The store's uploads wait for the returned event; the list counts the uploads that ran."""
    release, ran = threading.Event(), []
    upload = store.files.upload

    def held(local: Path, remote: str) -> None:
        assert release.wait(30), "the test never released the upload"
        ran.append(1)
        upload(local, remote)

    monkeypatch.setattr(store.files, "upload", held)
    return release, ran


def test_a_sync_returns_while_its_upload_runs_and_the_close_waits_for_it(bucket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    store = RunStore(bucket)
    release, ran = _held_uploads(store, monkeypatch)
    with store.run_dir("run-a") as work:
        atomic_write(work.path / "train_state.pt", lambda path: path.write_bytes(b"epoch 1"))
        work.sync()  # returns at once: the upload waits on `release`
        assert ran == [] and store.files.names("runs", "run-a") == []
        atomic_write(work.path / "train_state.pt", lambda path: path.write_bytes(b"epoch 2"))
        work.sync()  # one upload waits behind the held one
        work.sync()  # ... and covers this request too
        release.set()
    assert len(ran) == 2  # the held upload, then one for both later requests
    assert store.files.fs.cat_file(store.files.path("runs", "run-a", "train_state.pt")) == b"epoch 2"


def test_a_file_being_written_is_not_uploaded_nor_one_removed_meanwhile(bucket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    store = RunStore(bucket)
    release, _ = _held_uploads(store, monkeypatch)
    with store.run_dir("run-a") as work:
        (work.path / ".train_state.pt.x1y2.tmp").write_bytes(b"half a state")  # atomic_write's temporary name
        (work.path / "gone.txt").write_text("removed before the upload reads it")
        work.sync()
        (work.path / "events.out").write_text("kept")
        real_put = store.files.fs.put_file

        def put_after_removal(local: str, remote: str, **kwargs: object) -> None:
            (work.path / "gone.txt").unlink(missing_ok=True)  # as a finished run removes its state
            real_put(local, remote, **kwargs)

        monkeypatch.setattr(store.files.fs, "put_file", put_after_removal)
        release.set()
    assert store.files.names("runs", "run-a") == ["events.out"]


def test_an_upload_that_failed_is_raised_by_the_next_request_and_by_the_close(bucket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    def refused() -> None:
        raise ConnectionError("the bucket did not answer")

    uploads = BackgroundUploads(refused)
    uploads.request()
    uploads._executor.submit(lambda: None).result()  # one worker, in order: the failed upload has ended
    with pytest.raises(ConnectionError, match="did not answer"):
        uploads.request()

    store = RunStore(bucket)
    monkeypatch.setattr(store.files, "upload", lambda local, remote: refused())
    with pytest.raises(ConnectionError, match="did not answer"), store.run_dir("run-b") as work:
        work.sync()  # the close waits for it and raises its failure
