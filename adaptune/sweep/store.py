"""The run store: one durable root that holds every run, so a sweep can resume, grow and fan in.

Layout under the root (a local directory, `gs://bucket/prefix`, or any fsspec URL):

    runs/<run_id>/record.json        the finished (or failed) run record: written last
    runs/<run_id>/checkpoint/        the compact task checkpoint (what the method trained)
    runs/<run_id>/train_state.pt     the resumable training state, until the run finishes
    runs/<run_id>/attempts.json      transient failures seen so far (preemption, OOM, network)
    runs/<run_id>/traceback.txt      the full traceback of a failed run
    runs/<run_id>/lease-<n>.json     who trains the run now, until when (adaptune.sweep.lease)
    ablation/<run_id>.json           the Figure 6 rows of an ablated run
    models/<backbone>/               staged backbone weights (stage_backbone), STAGED.json written last
    cache/                           the tokenization cache (only where the root is a local directory)

Run ids depend only on what determines a result (TrainConfig.run_id), so experiments share runs.
A run trains in a local working directory: the root itself where it is a filesystem path (this
machine, or Vertex AI's Cloud Storage FUSE mount `/gcs/<bucket>`), else a temporary directory that
is downloaded before the run and uploaded at every saved state and at the end.

Nothing here renames a directory: Cloud Storage FUSE refuses that in ordinary (flat) buckets unless
`rename-dir-limit` is set (gcsfuse docs/semantics.md, "Directory operations"). Whatever must appear
whole (a record, a lease, staged weights) is published by one create-only write of a small file, made
last: `create_exclusive` (O_EXCL on a filesystem, GCS's `ifGenerationMatch=0` on a bucket).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

from adaptune.core.files import json_text, write_json
from adaptune.core.run_files import ATTEMPTS_FILE, CHECKPOINT_DIR, RECORD_FILE, STATE_FILE, TRACEBACK_FILE  # noqa: F401 (the layout above)

RUNS_DIR = "runs"
ABLATION_DIR = "ablation"
CACHE_DIR = "cache"
MODELS_DIR = "models"
STAGED_MARKER = "STAGED.json"  # written last into models/<backbone>/: the copy is whole
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
        """The parsed file, or None where it does not exist. A file caught mid-write (a create-only
        write on a filesystem is visible before its content) is read again for up to a second."""
        for attempt in range(5):
            try:
                with self.fs.open(self._path(*parts), "r") as handle:
                    return json.load(handle)
            except FileNotFoundError:
                return None
            except json.JSONDecodeError:
                if attempt == 4:
                    raise
                time.sleep(0.25)
        return None

    def create_exclusive(self, data: bytes, *parts: str) -> bool:
        """Write a new file only where none exists; False when one does (another writer was first).

        Filesystems (this machine, the /gcs FUSE mount): O_CREAT|O_EXCL. Buckets through gcsfs: a
        create-only upload (GCS precondition ifGenerationMatch=0, answered 412 when the object exists:
        https://cloud.google.com/storage/docs/request-preconditions)."""
        path = self._path(*parts)
        if self.is_local:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            try:
                with open(path, "xb") as handle:
                    handle.write(data)
            except FileExistsError:
                return False
            return True
        try:
            self.fs.pipe_file(path, data, mode="create")
        except FileExistsError:
            return False
        return True

    def names(self, *parts: str) -> list[str]:
        """File names directly under a directory of the store (fresh, never a cached listing)."""
        path = self._path(*parts)
        self.fs.invalidate_cache(path)
        try:
            return sorted(entry.rstrip("/").rsplit("/", 1)[-1] for entry in self.fs.ls(path, detail=False))
        except FileNotFoundError:
            return []

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

    def publish_record(self, record: dict[str, Any]) -> bool:
        """Make a run's record visible, once: False (nothing written) when the run already has one,
        so a second writer never overwrites the first. Everything else of the run is uploaded first."""
        return self.create_exclusive(json_text(record).encode(), RUNS_DIR, record["run_id"], RECORD_FILE)

    def run_files(self) -> dict[str, dict[str, str]]:
        """{run_id: {file name: version}} for every run in the store, from one recursive listing (a few
        paginated calls on a bucket, not one per run). The version (GCS generation, else mtime and size)
        changes whenever the file is written again; a subdirectory (checkpoint/) shows as its name."""
        base = self._path(RUNS_DIR)
        self.fs.invalidate_cache(base)
        try:
            listing = self.fs.find(base, detail=True)
        except FileNotFoundError:
            return {}
        runs: dict[str, dict[str, str]] = {}
        prefix = base.rstrip("/") + "/"
        for path, info in listing.items():
            parts = path.removeprefix(prefix).split("/")
            if len(parts) >= 2 and path.startswith(prefix):
                version = "" if len(parts) > 2 else str(info.get("generation") or f"{info.get('mtime')}:{info.get('size')}")
                runs.setdefault(parts[0], {})[parts[1]] = version
        return runs

    def read_json_many(self, paths: Iterable[tuple[str, ...]]) -> dict[tuple[str, ...], Any]:
        """The JSON files that exist among `paths` (each a tuple of parts), read concurrently."""
        paths = list(paths)
        with ThreadPoolExecutor(READ_THREADS) as pool:
            found = pool.map(lambda parts: self.read_json(*parts), paths)
        return {parts: data for parts, data in zip(paths, found) if data is not None}

    def records(self, run_ids: Iterable[str] | None = None, files: dict[str, dict[str, str]] | None = None) -> dict[str, dict[str, Any]]:
        """{run_id: record} of the runs among run_ids (None: every run in the store) that have one, in
        that order: one listing of runs/ (or `files`, run_files' answer already at hand), then only the
        records that exist are read, concurrently (thousands of small objects). The one way to read a
        store's records in bulk: the fan-in, the status, the bundle all come here."""
        files = self.run_files() if files is None else files
        present = [run_id for run_id in (files if run_ids is None else run_ids) if RECORD_FILE in files.get(run_id, ())]
        found = self.read_json_many((RUNS_DIR, run_id, RECORD_FILE) for run_id in present)
        return {run_id: found[(RUNS_DIR, run_id, RECORD_FILE)] for run_id in present if (RUNS_DIR, run_id, RECORD_FILE) in found}

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

    def remove_state(self, run_id: str) -> None:
        """A finished run's resumable state (the optimizer's moments: up to 3x the model) is not kept."""
        self.remove(RUNS_DIR, run_id, STATE_FILE)

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

    @property
    def is_bucket_mount(self) -> bool:
        """A root on Vertex AI's Cloud Storage FUSE mount: a filesystem path that is really a bucket."""
        return self.is_local and Path(self.root).is_relative_to(VERTEX_GCS_MOUNT)

    def cache_dir(self) -> Path | None:
        """The shared tokenization cache where the root is a local directory; None (the pod's own disk,
        adaptune.data.loading.default_cache_dir) on a bucket, mounted or not: the cache is memory-mapped Arrow
        files, read at random, and a task is tokenized once per shard in a minute or less."""
        return Path(self._path(CACHE_DIR)) if self.is_local and not self.is_bucket_mount else None

    # --- staged backbones -------------------------------------------------------------------------

    def staged_backbone(self, name: str, scratch: Path | None = None) -> Path | None:
        """A local directory holding the staged copy of backbone `name`, or None where none is staged.
        On a remote root it is downloaded into `scratch` (a pod's local disk) first."""
        marker = self.read_json(MODELS_DIR, name, STAGED_MARKER)
        if marker is None:
            return None
        if self.is_local:
            return Path(self._path(MODELS_DIR, name))
        target = Path(scratch or tempfile.mkdtemp(prefix="adaptune-models-")) / name
        if not (target / STAGED_MARKER).is_file():
            self._download(self._path(MODELS_DIR, name), target)
        return target

    def stage_backbone(self, name: str, source: Path) -> dict[str, Any]:
        """Copy a saved model directory (config, weights, tokenizer) to models/<name>/, the marker last;
        returns the marker: {name, files: {relative path: bytes}, bytes}. Staging again replaces it."""
        files = {p.relative_to(source).as_posix(): p.stat().st_size for p in sorted(source.rglob("*"))
                 if p.is_file() and p.name != STAGED_MARKER and not p.relative_to(source).as_posix().startswith(".")}
        if "config.json" not in files:
            raise StoreError(f"{source} holds no config.json: stage a directory written by save_pretrained")
        self.remove(MODELS_DIR, name, STAGED_MARKER)
        remote = self._path(MODELS_DIR, name)
        for relative in files:
            if self.is_local:
                target = Path(remote) / relative
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(source / relative, target)
            else:
                self.fs.put_file(str(source / relative), f"{remote}/{relative}")
        marker = {"name": name, "files": files, "bytes": sum(files.values()), "staged_at": time.time()}
        self.write_json(marker, MODELS_DIR, name, STAGED_MARKER)
        return marker

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

