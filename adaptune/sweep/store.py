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
    prepared/                        the data-preparation step's output (adaptune.sweep.data_prep)
    data/                            the publishers' data files, as a data mirror (adaptune.sweep.data_staging)

Run ids depend only on what determines a result (TrainConfig.run_id), so experiments share runs.
A run trains in a local working directory: the root itself where it is a filesystem path (this
machine, or Vertex AI's Cloud Storage FUSE mount `/gcs/<bucket>`), else a temporary directory that
is downloaded before the run and uploaded at every saved state, while training goes on
(adaptune.sweep.background_uploads), and at the end.

`RunStore` is the run domain (records, publishing, transient notes, run directories, staged
backbones); the files under the root, on a disk or a bucket, are its `files` (adaptune.sweep.store_files),
where nothing renames a directory: whatever must appear whole (a record, a lease, staged weights) is
published by one create-only write of a small file, made last (`StoreFiles.create_exclusive`).
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from adaptune.core.files import json_text
from adaptune.core.run_files import (  # noqa: F401 (the layout above)
    ATTEMPTS_FILE,
    CHECKPOINT_DIR,
    RECORD_FILE,
    STATE_FILE,
    TRACEBACK_FILE,
    UNREADABLE_SUFFIX,
    store_owned,
)
from adaptune.sweep.background_uploads import BackgroundUploads
from adaptune.sweep.store_files import StoreError, StoreFiles, UnreadableFileError

RUNS_DIR = "runs"
ABLATION_DIR = "ablation"
CACHE_DIR = "cache"
MODELS_DIR = "models"
DATA_MIRROR_DIR = "data"  # the staged data mirror: data/<the path adaptune.data.tasks names>
STAGED_MARKER = "STAGED.json"  # written last into models/<backbone>/: the copy is whole


class RunStore:
    """The runs under one root: their records, transient failures, working directories and staged
    backbones. `files` is the storage under the root (StoreFiles), for what is not a run's."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.files = StoreFiles(root)

    @property
    def root(self) -> str:
        """The root as a user (or another pod) can open it: a resolved local path, or the bucket URL."""
        return self.files.root

    def __repr__(self) -> str:
        return f"RunStore({self.root!r})"

    def require_existing(self) -> RunStore:
        """Refuse a root that does not exist (StoreFiles.require_existing), for commands that read a store."""
        self.files.require_existing()
        return self

    def require_writable(self) -> RunStore:
        """Refuse a root no run could be written under (StoreFiles.require_writable), before any run trains."""
        self.files.require_writable()
        return self

    # --- runs -------------------------------------------------------------------------------------

    def record(self, run_id: str) -> dict[str, Any] | None:
        """The run's published record, None where it has none; UnreadableFileError where the file is
        not a record of this run."""
        record = self.files.read_json(RUNS_DIR, run_id, RECORD_FILE)
        if record is not None and (not isinstance(record, dict) or record.get("run_id") != run_id):
            raise UnreadableFileError(f"{self.files.url(RUNS_DIR, run_id, RECORD_FILE)} is not the record of run {run_id} "
                                      f"(it names {record.get('run_id') if isinstance(record, dict) else type(record).__name__!r})")
        return record

    def publish_record(self, record: dict[str, Any]) -> bool:
        """Make a run's record visible, once: False (nothing written) when the run already has one,
        so a second writer never overwrites the first. Everything else of the run is uploaded first."""
        return self.files.create_exclusive(json_text(record).encode(), RUNS_DIR, record["run_id"], RECORD_FILE)

    def run_files(self) -> dict[str, dict[str, str]]:
        """{run_id: {file name: version}} for every run in the store, from one recursive listing (a few
        paginated calls on a bucket, not one per run). The version (GCS generation, else mtime and size)
        changes whenever the file is written again; a subdirectory (checkpoint/) shows as its name."""
        runs: dict[str, dict[str, str]] = {}
        for path, version in self.files.file_versions(RUNS_DIR).items():
            parts = path.split("/")
            if len(parts) >= 2:
                runs.setdefault(parts[0], {})[parts[1]] = "" if len(parts) > 2 else version
        return runs

    def records(self, run_ids: Iterable[str] | None = None, files: dict[str, dict[str, str]] | None = None,
                unreadable: dict[str, str] | None = None) -> dict[str, dict[str, Any]]:
        """{run_id: record} of the runs among run_ids (None: every run in the store) that have one, in
        that order: one listing of runs/ (or `files`, run_files' answer already at hand), then only the
        records that exist are read, concurrently (thousands of small objects). The one way to read a
        store's records in bulk: the fan-in, the status, the bundle all come here.
        A record that cannot be read is left out: named in `unreadable` ({run_id: reason}) where given,
        else in one line on stderr."""
        files = self.run_files() if files is None else files
        present = [run_id for run_id in (files if run_ids is None else run_ids) if RECORD_FILE in files.get(run_id, ())]
        bad: dict[tuple[str, ...], str] = {}
        found = self.files.read_json_many(((RUNS_DIR, run_id, RECORD_FILE) for run_id in present), bad)
        records = {}
        for run_id in present:
            record = found.get((RUNS_DIR, run_id, RECORD_FILE))
            if isinstance(record, dict) and record.get("run_id") == run_id:
                records[run_id] = record
            elif record is not None:
                bad[(RUNS_DIR, run_id, RECORD_FILE)] = f"{self.files.url(RUNS_DIR, run_id, RECORD_FILE)} is not the record of run {run_id}"
        for (_, run_id, _), reason in bad.items():
            if unreadable is not None:
                unreadable[run_id] = reason
            else:
                print(f"skipped run {run_id}: {reason}", file=sys.stderr, flush=True)
        return records

    def note_transient_failure(self, run_id: str, reason: str) -> int:
        """Count one more transient failure of the run; returns the count so far."""
        attempts = self.files.read_json(RUNS_DIR, run_id, ATTEMPTS_FILE) or {"transient_failures": 0, "reasons": []}
        attempts["transient_failures"] += 1
        attempts["reasons"] = [*attempts["reasons"], reason][-5:]
        self.files.write_json(attempts, RUNS_DIR, run_id, ATTEMPTS_FILE)
        return attempts["transient_failures"]

    def forget(self, run_id: str) -> None:
        """Drop a run's record and failure count (retry_failed): the next attempt trains it again,
        resuming from its saved state where there is one."""
        for name in (RECORD_FILE, ATTEMPTS_FILE, TRACEBACK_FILE):
            self.files.remove(RUNS_DIR, run_id, name)

    def remove_state(self, run_id: str) -> None:
        """A finished run's resumable state (the optimizer's moments: up to 3x the model) is not kept."""
        self.files.remove(RUNS_DIR, run_id, STATE_FILE)

    @contextlib.contextmanager
    def run_dir(self, run_id: str) -> Iterator[RunDir]:
        """A local directory for the run; on a remote root, downloaded first and uploaded by `sync()` on a worker
        thread (BackgroundUploads: the context's exit waits for the last upload and raises a failed one).
        The store's own files (record, attempts, leases: core.run_files.store_owned) are neither
        downloaded nor uploaded: only the store's calls write them, so a sync never puts back a stale
        attempt count or an old lease over a renewed one."""
        if self.files.is_local:
            path = Path(self.files.path(RUNS_DIR, run_id))
            path.mkdir(parents=True, exist_ok=True)
            yield RunDir(path, sync=lambda: None)
            return
        with tempfile.TemporaryDirectory(prefix=f"{run_id}-") as scratch:
            local = Path(scratch)
            self.files.download(self.files.path(RUNS_DIR, run_id), local, skip=store_owned)
            uploads = BackgroundUploads(lambda: self.files.upload(local, self.files.path(RUNS_DIR, run_id)))
            try:
                yield RunDir(local, sync=uploads.request)
            except BaseException:
                uploads.finish(raise_failure=False)
                raise
            uploads.finish()

    def cache_dir(self) -> Path | None:
        """The shared tokenization cache where the root is a local directory; None (the pod's own disk,
        adaptune.data.token_cache.default_cache_dir) on a bucket, mounted or not: the cache is memory-mapped Arrow
        files, read at random, and a task is tokenized once per shard in a minute or less."""
        return Path(self.files.path(CACHE_DIR)) if self.files.is_local and not self.files.is_bucket_mount else None

    def data_mirror(self) -> Path | None:
        """The staged data mirror (data/) as a local path where the root is one (this machine, or the /gcs
        mount a pod reads a bucket through), as data_dir takes it; None on a gs:// root."""
        return Path(self.files.path(DATA_MIRROR_DIR)) if self.files.is_local else None

    # --- staged backbones -------------------------------------------------------------------------

    def staged_backbone(self, name: str, scratch: Path | None = None) -> Path | None:
        """A local directory holding the staged copy of backbone `name`, or None where none is staged.
        On a remote root it is downloaded into `scratch` (a pod's local disk) first."""
        marker = self.files.read_json(MODELS_DIR, name, STAGED_MARKER)
        if marker is None:
            return None
        if self.files.is_local:
            return Path(self.files.path(MODELS_DIR, name))
        target = Path(scratch or tempfile.mkdtemp(prefix="adaptune-models-")) / name
        if not (target / STAGED_MARKER).is_file():
            self.files.download(self.files.path(MODELS_DIR, name), target)
        return target

    def stage_backbone(self, name: str, source: Path) -> dict[str, Any]:
        """Copy a saved model directory (config, weights, tokenizer) to models/<name>/, the marker last;
        returns the marker: {name, files: {relative path: bytes}, bytes}. Staging again replaces it."""
        files = {p.relative_to(source).as_posix(): p.stat().st_size for p in sorted(source.rglob("*"))
                 if p.is_file() and p.name != STAGED_MARKER and not p.relative_to(source).as_posix().startswith(".")}
        if "config.json" not in files:
            raise StoreError(f"{source} holds no config.json: stage a directory written by save_pretrained")
        self.files.remove(MODELS_DIR, name, STAGED_MARKER)
        for relative in files:
            self.files.put_file(source / relative, MODELS_DIR, name, relative)
        marker = {"name": name, "files": files, "bytes": sum(files.values()), "staged_at": time.time()}
        self.files.write_json(marker, MODELS_DIR, name, STAGED_MARKER)
        return marker


class RunDir:
    """A run's local working directory and the call that makes the store see its current content."""

    def __init__(self, path: Path, sync: Callable[[], None]) -> None:
        self.path, self.sync = path, sync
