"""The run store: one durable root that holds every run, so a sweep can resume, grow and fan in.

Layout under the root (a local directory, `gs://bucket/prefix`, or any fsspec URL):

    runs/<run_id>/record.json        the finished (or failed) run record: written last
    runs/<run_id>/checkpoint/        the compact task checkpoint (what the method trained)
    runs/<run_id>/train_state.pt     the resumable training state, until the run finishes
    runs/<run_id>/attempts.json      transient failures seen so far (preemption, OOM, network)
    runs/<run_id>/traceback.txt      the full traceback of a failed run
    ablation/<run_id>.json           the Figure 6 rows of an ablated run
    cache/                           the tokenization cache (only where the root is a filesystem path)

Run ids depend only on what determines a result (TrainConfig.run_id), so experiments share runs.
A run trains in a local working directory: the root itself where it is a filesystem path (this
machine, or Vertex AI's Cloud Storage FUSE mount `/gcs/<bucket>`), else a temporary directory that
is downloaded before the run and uploaded at every saved state and at the end.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

from adaptune.files import json_text, write_json
from adaptune.records import TRACEBACK_FILE

RUNS_DIR = "runs"
ABLATION_DIR = "ablation"
CACHE_DIR = "cache"
RECORD_FILE = "record.json"
CHECKPOINT_DIR = "checkpoint"
ATTEMPTS_FILE = "attempts.json"
VERTEX_GCS_MOUNT = Path("/gcs")  # Vertex AI mounts every bucket the job can read here
READ_THREADS = 32  # object stores answer many small reads at once far faster than one by one


class StoreError(RuntimeError):
    """The run store cannot be opened; the message says which root and what to do."""


class RunStore:
    def __init__(self, root: str | os.PathLike[str]) -> None:
        root = str(root)
        if not root:
            raise StoreError("the run store root is empty: pass --runs-root DIR (or gs://bucket/prefix)")
        if root.startswith("gs://") and VERTEX_GCS_MOUNT.is_dir():
            root = str(VERTEX_GCS_MOUNT / root.removeprefix("gs://"))
        try:
            self.fs, base = fsspec.core.url_to_fs(root)
        except (ImportError, ValueError) as error:
            raise StoreError(
                f"cannot open run store {root!r}: {error}. For gs:// install gcsfs, or on Vertex AI use the /gcs/<bucket> mount"
            ) from None
        self.is_local = isinstance(self.fs, LocalFileSystem)
        self.root = str(Path(base).resolve()) if self.is_local else root.rstrip("/")
        self._base = self.root if self.is_local else base.rstrip("/")

    def __repr__(self) -> str:
        return f"RunStore({self.root!r})"

    def url(self, *parts: str) -> str:
        """Where `parts` live, as a path or URL a user (or another pod) can open."""
        return "/".join([self.root, *parts])

    def _path(self, *parts: str) -> str:
        return "/".join([self._base, *parts])

    # --- small JSON files -------------------------------------------------------------------------

    def read_json(self, *parts: str) -> Any | None:
        try:
            with self.fs.open(self._path(*parts), "r") as handle:
                return json.load(handle)
        except FileNotFoundError:
            return None

    def write_json(self, data: Any, *parts: str) -> None:
        """Whole-file writes: atomic rename here, a single object put on a bucket."""
        if self.is_local:
            target = Path(self._path(*parts))
            target.parent.mkdir(parents=True, exist_ok=True)
            write_json(target, data)
        else:
            self.fs.pipe_file(self._path(*parts), json_text(data).encode())

    def remove(self, *parts: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.fs.rm(self._path(*parts), recursive=True)

    # --- runs -------------------------------------------------------------------------------------

    def record(self, run_id: str) -> dict[str, Any] | None:
        return self.read_json(RUNS_DIR, run_id, RECORD_FILE)

    def records(self, run_ids: Iterable[str]) -> dict[str, dict[str, Any]]:
        """The records that exist among run_ids, read concurrently (thousands of small objects)."""
        run_ids = list(run_ids)
        with ThreadPoolExecutor(READ_THREADS) as pool:
            found = pool.map(self.record, run_ids)
        return {run_id: record for run_id, record in zip(run_ids, found) if record is not None}

    def note_transient_failure(self, run_id: str, reason: str) -> int:
        """Count one more transient failure of the run; returns the count so far."""
        attempts = self.read_json(RUNS_DIR, run_id, ATTEMPTS_FILE) or {"transient_failures": 0, "reasons": []}
        attempts["transient_failures"] += 1
        attempts["reasons"] = [*attempts["reasons"], reason][-5:]
        self.write_json(attempts, RUNS_DIR, run_id, ATTEMPTS_FILE)
        return attempts["transient_failures"]

    def forget(self, run_id: str) -> None:
        """Drop a run's record and failure count (retry_failed): the next attempt trains it again,
        resuming from its saved state where there is one."""
        for name in (RECORD_FILE, ATTEMPTS_FILE, TRACEBACK_FILE):
            self.remove(RUNS_DIR, run_id, name)

    @contextlib.contextmanager
    def run_dir(self, run_id: str) -> Iterator[RunDir]:
        """A local directory for the run; on a remote root, downloaded first and uploaded by `sync()`."""
        if self.is_local:
            path = Path(self._path(RUNS_DIR, run_id))
            path.mkdir(parents=True, exist_ok=True)
            yield RunDir(path, sync=lambda: None)
            return
        with tempfile.TemporaryDirectory(prefix=f"{run_id}-") as scratch:
            local = Path(scratch)
            self._download(self._path(RUNS_DIR, run_id), local)
            yield RunDir(local, sync=lambda: self._upload(local, self._path(RUNS_DIR, run_id)))

    @contextlib.contextmanager
    def local_copy(self, *parts: str) -> Iterator[Path]:
        """A directory of the store (a checkpoint) as a local path, downloaded where the root is remote."""
        if self.is_local:
            yield Path(self._path(*parts))
            return
        with tempfile.TemporaryDirectory(prefix="adaptune-") as scratch:
            self._download(self._path(*parts), Path(scratch))
            yield Path(scratch)

    def cache_dir(self) -> Path | None:
        """The shared tokenization cache, where the root is a filesystem path; None: the local default."""
        return Path(self._path(CACHE_DIR)) if self.is_local else None

    def _download(self, remote: str, local: Path) -> None:
        for path in self.fs.find(remote):
            target = local / os.path.relpath(path, remote)
            target.parent.mkdir(parents=True, exist_ok=True)
            self.fs.get_file(path, str(target))

    def _upload(self, local: Path, remote: str) -> None:
        """Every file, the record last: a reader that sees record.json sees the whole run."""
        files = sorted((p for p in local.rglob("*") if p.is_file()), key=lambda p: p.name == RECORD_FILE)
        for path in files:
            self.fs.put_file(str(path), f"{remote}/{path.relative_to(local).as_posix()}")


class RunDir:
    """A run's local working directory and the call that makes the store see its current content."""

    def __init__(self, path: Path, sync: Callable[[], None]) -> None:
        self.path, self.sync = path, sync

