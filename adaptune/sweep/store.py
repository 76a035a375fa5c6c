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
is downloaded before the run and uploaded at every saved state, while training goes on
(adaptune.sweep.background_uploads), and at the end.

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
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

from adaptune.core.files import is_partial_write, json_text, write_json
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

RUNS_DIR = "runs"
ABLATION_DIR = "ablation"
CACHE_DIR = "cache"
MODELS_DIR = "models"
STAGED_MARKER = "STAGED.json"  # written last into models/<backbone>/: the copy is whole
VERTEX_GCS_MOUNT = Path("/gcs")  # Vertex AI mounts every bucket the job can read here
READ_THREADS = 32  # object stores answer many small reads at once far faster than one by one


class StoreError(RuntimeError):
    """The run store cannot be opened; the message says which root and what to do."""


class UnreadableFileError(StoreError):
    """A file of the store that is not the JSON it should be (truncated, garbage, another run's): the
    message names the file; the sweep goes on without it."""


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

    def require_existing(self) -> RunStore:
        """Refuse a root that does not exist (a wrong path, prefix or bucket), for commands that read a
        store: an empty answer would look like a sweep that has not started."""
        self.require_folder()
        try:
            found = self.fs.isdir(self._base)
        except Exception as error:  # noqa: BLE001 -- a bucket we may not list, a broken mount: one line
            raise StoreError(f"cannot read run store {self.root}: {type(error).__name__}: {error}; check --runs-root (RUNS_ROOT=)") from None
        if not found:
            raise StoreError(f"run store {self.root} does not exist: check --runs-root (RUNS_ROOT=): the root a sweep ran with")
        return self

    def require_writable(self) -> RunStore:
        """Refuse a root no run could be written under, before any run trains: a local path under a
        regular file or a read-only or virtual filesystem (/proc), a bucket that does not exist."""
        self.require_folder()
        if self.is_local:
            try:
                Path(self._base).mkdir(parents=True, exist_ok=True)
                with tempfile.NamedTemporaryFile(dir=self._base, prefix=".write-check-"):
                    pass
            except OSError as error:
                raise StoreError(f"cannot write runs under {self.root}: {error.strerror or error}; pass a writable "
                                 "--runs-root (a directory, gs://bucket/prefix, or /gcs/<bucket>/...)") from None
            return self
        bucket = self._base.split("/", 1)[0]
        try:
            exists = self.fs.exists(bucket)
        except Exception as error:  # noqa: BLE001 -- credentials, network: one line, nothing trained
            raise StoreError(f"cannot reach the bucket of run store {self.root}: {type(error).__name__}: {error}") from None
        if not exists:
            raise StoreError(f"the bucket of run store {self.root} does not exist: create it (gcloud storage buckets "
                             "create) or fix --runs-root")
        return self

    def require_folder(self) -> RunStore:
        """The one rule for what a runs root is, shared by every command and the shard runner: a folder, or a
        path where one can be made. A regular file or a bucket object, or a path under one, is refused with
        the same line. On a bucket an object and a prefix may share a name, but the Cloud Storage FUSE mount
        Vertex AI jobs read through shows only one of them (gcsfuse docs/semantics.md, "Files and
        directories with the same name"), so such a root is refused too."""
        parts = self._base.split("/")
        first = 1 if self.is_local else 2  # a local path's "/" and a bucket's name are no files
        for end in range(len(parts), first - 1, -1):
            ancestor = "/".join(parts[:end]) or "/"
            try:
                is_file = self.fs.isfile(ancestor)
            except Exception:  # noqa: BLE001 -- unreachable or unlistable: require_existing / require_writable say why
                return self
            if is_file:
                where = "is" if end == len(parts) else f"lies under {self.root.removesuffix('/'.join(parts[end:])).rstrip('/')}, which is"
                raise StoreError(f"run store {self.root} {where} a file, not a folder: pass a folder as --runs-root (RUNS_ROOT=), "
                                 "for instance a new one beside it")
        return self

    def url(self, *parts: str) -> str:
        """Where `parts` live, as a path or URL a user (or another pod) can open."""
        return "/".join([self.root, *parts])

    def _path(self, *parts: str) -> str:
        return "/".join([self._base, *parts])

    # --- small JSON files -------------------------------------------------------------------------

    def read_json(self, *parts: str) -> Any | None:
        """The parsed file, or None where it does not exist. A file caught mid-write (a create-only
        write on a filesystem is visible before its content) is read again for up to a second; still
        unreadable then, it is an UnreadableFileError naming it."""
        for attempt in range(5):
            try:  # one whole-object read: no file object, whose read-ahead logs a vanished file as an error
                return json.loads(self.fs.cat_file(self._path(*parts)))
            except FileNotFoundError:
                return None
            except ValueError as error:  # JSONDecodeError, UnicodeDecodeError
                if attempt == 4:
                    raise UnreadableFileError(f"{self.url(*parts)} is not readable JSON ({type(error).__name__}: {error})") from None
                time.sleep(0.25)
        return None

    def modified_at(self, *parts: str) -> float | None:
        """When the file was last written (seconds since the epoch), or None where it does not exist."""
        try:
            info = self.fs.info(self._path(*parts))
        except FileNotFoundError:
            return None
        stamp = info.get("mtime") or info.get("updated") or info.get("created")
        if isinstance(stamp, str):  # GCS: RFC 3339
            import datetime as dt

            stamp = dt.datetime.fromisoformat(stamp.replace("Z", "+00:00"))
        return stamp.timestamp() if hasattr(stamp, "timestamp") else (float(stamp) if stamp is not None else None)

    def set_aside(self, *parts: str) -> str:
        """Move an unreadable file to <name>.unreadable-<unix time> beside it (kept, never deleted; a file
        rename, which Cloud Storage FUSE allows); returns the new name."""
        *where, name = parts
        kept = f"{name}{UNREADABLE_SUFFIX}{int(time.time())}"
        if self.is_local:
            self.fs.mv(self._path(*parts), self._path(*where, kept))
        else:  # an object has no rename: copy and delete (gcsfs's mv tries a folder move first and logs its refusal)
            self.fs.copy(self._path(*parts), self._path(*where, kept))
            self.fs.rm(self._path(*parts))
        return kept

    def version(self, *parts: str) -> str | None:
        """What changes whenever the file is written again (GCS generation; locally inode, mtime and size),
        None where it does not exist: compared for equality only, never read as a time."""
        try:
            info = self.fs.info(self._path(*parts))
        except FileNotFoundError:
            return None
        return _version(info)

    def modified_times(self, paths: Iterable[tuple[str, ...]]) -> dict[tuple[str, ...], float]:
        """When each existing file among `paths` was last written, by the store's own clock (a bucket's
        `updated`, a filesystem's mtime), read concurrently."""
        paths = list(paths)
        with ThreadPoolExecutor(READ_THREADS) as pool:
            found = list(pool.map(lambda parts: self.modified_at(*parts), paths))
        return {parts: stamp for parts, stamp in zip(paths, found) if stamp is not None}

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
        """The run's published record, None where it has none; UnreadableFileError where the file is
        not a record of this run."""
        record = self.read_json(RUNS_DIR, run_id, RECORD_FILE)
        if record is not None and (not isinstance(record, dict) or record.get("run_id") != run_id):
            raise UnreadableFileError(f"{self.url(RUNS_DIR, run_id, RECORD_FILE)} is not the record of run {run_id} "
                                      f"(it names {record.get('run_id') if isinstance(record, dict) else type(record).__name__!r})")
        return record

    def publish_record(self, record: dict[str, Any]) -> bool:
        """Make a run's record visible, once: False (nothing written) when the run already has one,
        so a second writer never overwrites the first. Everything else of the run is uploaded first."""
        return self.create_exclusive(json_text(record).encode(), RUNS_DIR, record["run_id"], RECORD_FILE)

    def run_files(self) -> dict[str, dict[str, str]]:
        """{run_id: {file name: version}} for every run in the store, from one recursive listing (a few
        paginated calls on a bucket, not one per run). The version (GCS generation, else mtime and size)
        changes whenever the file is written again; a subdirectory (checkpoint/) shows as its name."""
        runs: dict[str, dict[str, str]] = {}
        for path, version in self.file_versions(RUNS_DIR).items():
            parts = path.split("/")
            if len(parts) >= 2:
                runs.setdefault(parts[0], {})[parts[1]] = "" if len(parts) > 2 else version
        return runs

    def file_versions(self, *parts: str) -> dict[str, str]:
        """{path under the folder: version} of every file under a store folder, from one recursive listing."""
        base = self._path(*parts)
        self.fs.invalidate_cache(base)
        try:
            listing = self.fs.find(base, detail=True)
        except FileNotFoundError:
            return {}
        prefix = base.rstrip("/") + "/"
        return {path.removeprefix(prefix): _version(info) for path, info in listing.items() if path.startswith(prefix)}

    def get_file(self, target: Path, *parts: str) -> None:
        """Copy one store file to a local path, replaced whole (a reader never sees half of it)."""
        partial = target.with_name(f".partial-{target.name.replace('tfevents', 'events')}")
        self.fs.get_file(self._path(*parts), str(partial))
        partial.replace(target)

    def read_json_many(self, paths: Iterable[tuple[str, ...]], unreadable: dict[tuple[str, ...], str] | None = None
                       ) -> dict[tuple[str, ...], Any]:
        """The JSON files that exist among `paths` (each a tuple of parts), read concurrently. A file that
        cannot be read is left out and goes into `unreadable` ({parts: one-line reason}), where given."""
        paths = list(paths)

        def read(parts: tuple[str, ...]) -> Any:
            try:
                return self.read_json(*parts)
            except UnreadableFileError as error:
                return error

        with ThreadPoolExecutor(READ_THREADS) as pool:
            found = list(pool.map(read, paths))
        if unreadable is not None:
            unreadable.update({parts: str(data) for parts, data in zip(paths, found) if isinstance(data, UnreadableFileError)})
        return {parts: data for parts, data in zip(paths, found) if data is not None and not isinstance(data, UnreadableFileError)}

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
        found = self.read_json_many(((RUNS_DIR, run_id, RECORD_FILE) for run_id in present), bad)
        records = {}
        for run_id in present:
            record = found.get((RUNS_DIR, run_id, RECORD_FILE))
            if isinstance(record, dict) and record.get("run_id") == run_id:
                records[run_id] = record
            elif record is not None:
                bad[(RUNS_DIR, run_id, RECORD_FILE)] = f"{self.url(RUNS_DIR, run_id, RECORD_FILE)} is not the record of run {run_id}"
        for (_, run_id, _), reason in bad.items():
            if unreadable is not None:
                unreadable[run_id] = reason
            else:
                print(f"skipped run {run_id}: {reason}", file=sys.stderr, flush=True)
        return records

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
        """A local directory for the run; on a remote root, downloaded first and uploaded by `sync()` on a worker
        thread (BackgroundUploads: the context's exit waits for the last upload and raises a failed one).
        The store's own files (record, attempts, leases: core.run_files.store_owned) are neither
        downloaded nor uploaded: only the store's calls write them, so a sync never puts back a stale
        attempt count or an old lease over a renewed one."""
        if self.is_local:
            path = Path(self._path(RUNS_DIR, run_id))
            path.mkdir(parents=True, exist_ok=True)
            yield RunDir(path, sync=lambda: None)
            return
        with tempfile.TemporaryDirectory(prefix=f"{run_id}-") as scratch:
            local = Path(scratch)
            self._download(self._path(RUNS_DIR, run_id), local, skip=store_owned)
            uploads = BackgroundUploads(lambda: self._upload(local, self._path(RUNS_DIR, run_id)))
            try:
                yield RunDir(local, sync=uploads.request)
            except BaseException:
                uploads.finish(raise_failure=False)
                raise
            uploads.finish()

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

    def _download(self, remote: str, local: Path, skip: Callable[[str], bool] = lambda name: False) -> None:
        for path in self.fs.find(remote):
            if skip(path.rsplit("/", 1)[-1]):
                continue
            target = local / os.path.relpath(path, remote)
            target.parent.mkdir(parents=True, exist_ok=True)
            self.fs.get_file(path, str(target))

    def _upload(self, local: Path, remote: str) -> None:
        """Every file the run wrote (never the store's own: a record is published, leases and attempts
        are written in place; nor one still being written under its temporary name). Run off the training
        thread (BackgroundUploads): a file the run removed meanwhile (its finished state) is skipped."""
        files = sorted(p for p in local.rglob("*") if p.is_file() and not store_owned(p.name) and not is_partial_write(p.name))
        for path in files:
            try:
                self.fs.put_file(str(path), f"{remote}/{path.relative_to(local).as_posix()}")
            except FileNotFoundError:
                if path.exists():
                    raise


def _version(info: dict[str, Any]) -> str:
    return str(info.get("generation") or f"{info.get('ino', '')}:{info.get('mtime')}:{info.get('size')}")


class RunDir:
    """A run's local working directory and the call that makes the store see its current content."""

    def __init__(self, path: Path, sync: Callable[[], None]) -> None:
        self.path, self.sync = path, sync

