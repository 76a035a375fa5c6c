"""The run store's storage adapter: files under one root, on a local disk or a bucket (fsspec, gcsfs).

`StoreFiles` reads, writes, lists, copies and versions files by their parts under the root; it knows
nothing of runs (adaptune.sweep.store.RunStore holds one and keeps the run domain).

Nothing here renames a directory: Cloud Storage FUSE refuses that in ordinary (flat) buckets unless
`rename-dir-limit` is set (gcsfuse docs/semantics.md, "Directory operations"). Whatever must appear
whole is published by one create-only write of a small file, made last: `create_exclusive` (O_EXCL on
a filesystem, GCS's `ifGenerationMatch=0` on a bucket).
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

from adaptune.core.errors import UserError
from adaptune.core.files import is_partial_write, json_text, write_json
from adaptune.core.run_files import UNREADABLE_SUFFIX, store_owned

VERTEX_GCS_MOUNT = Path("/gcs")  # Vertex AI mounts every bucket the job can read here
READ_THREADS = 32  # object stores answer many small reads at once far faster than one by one


class StoreError(UserError, RuntimeError):
    """The run store cannot be opened; the message says which root and what to do."""


class UnreadableFileError(StoreError):
    """A file of the store that is not the JSON it should be (truncated, garbage, another run's): the
    message names the file; the sweep goes on without it."""


class StoreFiles:
    """Files under a store root, named by their parts ("runs", run_id, "record.json")."""

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
        return f"StoreFiles({self.root!r})"

    # --- the root ---------------------------------------------------------------------------------

    def require_existing(self) -> StoreFiles:
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

    def require_writable(self) -> StoreFiles:
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

    def require_folder(self) -> StoreFiles:
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

    @property
    def is_bucket_mount(self) -> bool:
        """A root on Vertex AI's Cloud Storage FUSE mount: a filesystem path that is really a bucket."""
        return self.is_local and Path(self.root).is_relative_to(VERTEX_GCS_MOUNT)

    def url(self, *parts: str) -> str:
        """Where `parts` live, as a path or URL a user (or another pod) can open."""
        return "/".join([self.root, *parts])

    def path(self, *parts: str) -> str:
        """Where `parts` live for the filesystem object `fs` (a bucket's path has no gs://)."""
        return "/".join([self._base, *parts])

    # --- small JSON files -------------------------------------------------------------------------

    def read_json(self, *parts: str) -> Any | None:
        """The parsed file, or None where it does not exist. A file caught mid-write (a create-only
        write on a filesystem is visible before its content) is read again for up to a second; still
        unreadable then, it is an UnreadableFileError naming it."""
        for attempt in range(5):
            try:  # one whole-object read: no file object, whose read-ahead logs a vanished file as an error
                return json.loads(self.fs.cat_file(self.path(*parts)))
            except FileNotFoundError:
                return None
            except ValueError as error:  # JSONDecodeError, UnicodeDecodeError
                if attempt == 4:
                    raise UnreadableFileError(f"{self.url(*parts)} is not readable JSON ({type(error).__name__}: {error})") from None
                time.sleep(0.25)
        return None

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

    def write_json(self, data: Any, *parts: str) -> None:
        """Whole-file writes: atomic rename here, a single object put on a bucket."""
        if self.is_local:
            target = Path(self.path(*parts))
            target.parent.mkdir(parents=True, exist_ok=True)
            write_json(target, data)
        else:
            self.fs.pipe_file(self.path(*parts), json_text(data).encode())

    def create_exclusive(self, data: bytes, *parts: str) -> bool:
        """Write a new file only where none exists; False when one does (another writer was first).

        Filesystems (this machine, the /gcs FUSE mount): O_CREAT|O_EXCL. Buckets through gcsfs: a
        create-only upload (GCS precondition ifGenerationMatch=0, answered 412 when the object exists:
        https://cloud.google.com/storage/docs/request-preconditions).

        An answer that is an error may follow a write that was made: GCS can fail a request after it
        changed the object (https://cloud.google.com/storage/docs/retry-strategy: a conditional upload
        is retried, and its retry then finds the object its first try wrote: 412), and Cloud Storage
        FUSE passes such a failure on as EIO or EEXIST. So a refusal or an error is settled by reading
        back what is there: our own bytes mean the write was ours."""
        try:
            if self._create(data, self.path(*parts)):
                return True
        except Exception:
            if self._holds(data, parts) is not True:  # nothing there, or unreadable: the write's own error stands
                raise
            return True
        return self._holds(data, parts) is True

    def _create(self, data: bytes, path: str) -> bool:
        if self.is_local:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            try:
                create_local_file(path, data)
            except FileExistsError:
                return False
            return True
        try:
            self.fs.pipe_file(path, data, mode="create")
        except FileExistsError:
            return False
        return True

    def _holds(self, data: bytes, parts: tuple[str, ...]) -> bool | None:
        """Whether the file holds exactly `data`; None where it is absent or cannot be read now."""
        try:
            return self.fs.cat_file(self.path(*parts)) == data
        except Exception:  # noqa: BLE001 -- absent, or the store fails again: not known to be ours
            return None

    def set_aside(self, *parts: str) -> str:
        """Move an unreadable file to <name>.unreadable-<unix time> beside it (kept, never deleted; a file
        rename, which Cloud Storage FUSE allows); returns the new name."""
        *where, name = parts
        kept = f"{name}{UNREADABLE_SUFFIX}{int(time.time())}"
        if self.is_local:
            self.fs.mv(self.path(*parts), self.path(*where, kept))
        else:  # an object has no rename: copy and delete (gcsfs's mv tries a folder move first and logs its refusal)
            self.fs.copy(self.path(*parts), self.path(*where, kept))
            self.fs.rm(self.path(*parts))
        return kept

    def remove(self, *parts: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.fs.rm(self.path(*parts), recursive=True)

    # --- times, versions, listings ----------------------------------------------------------------

    def modified_at(self, *parts: str) -> float | None:
        """When the file was last written (seconds since the epoch), or None where it does not exist."""
        try:
            info = self.fs.info(self.path(*parts))
        except FileNotFoundError:
            return None
        stamp = info.get("mtime") or info.get("updated") or info.get("created")
        if isinstance(stamp, str):  # GCS: RFC 3339
            import datetime as dt

            stamp = dt.datetime.fromisoformat(stamp.replace("Z", "+00:00"))
        return stamp.timestamp() if hasattr(stamp, "timestamp") else (float(stamp) if stamp is not None else None)

    def modified_times(self, paths: Iterable[tuple[str, ...]]) -> dict[tuple[str, ...], float]:
        """When each existing file among `paths` was last written, by the store's own clock (a bucket's
        `updated`, a filesystem's mtime), read concurrently."""
        paths = list(paths)
        with ThreadPoolExecutor(READ_THREADS) as pool:
            found = list(pool.map(lambda parts: self.modified_at(*parts), paths))
        return {parts: stamp for parts, stamp in zip(paths, found) if stamp is not None}

    def version(self, *parts: str) -> str | None:
        """What changes whenever the file is written again (GCS generation; locally inode, mtime and size),
        None where it does not exist: compared for equality only, never read as a time."""
        try:
            info = self.fs.info(self.path(*parts))
        except FileNotFoundError:
            return None
        return _version(info)

    def names(self, *parts: str) -> list[str]:
        """File names directly under a directory of the store (fresh, never a cached listing)."""
        path = self.path(*parts)
        self.fs.invalidate_cache(path)
        try:
            return sorted(entry.rstrip("/").rsplit("/", 1)[-1] for entry in self.fs.ls(path, detail=False))
        except FileNotFoundError:
            return []

    def file_versions(self, *parts: str) -> dict[str, str]:
        """{path under the folder: version} of every file under a store folder, from one recursive listing."""
        base = self.path(*parts)
        self.fs.invalidate_cache(base)
        try:
            listing = self.fs.find(base, detail=True)
        except FileNotFoundError:
            return {}
        prefix = base.rstrip("/") + "/"
        return {path.removeprefix(prefix): _version(info) for path, info in listing.items() if path.startswith(prefix)}

    # --- copies -----------------------------------------------------------------------------------

    def get_file(self, target: Path, *parts: str) -> None:
        """Copy one store file to a local path, replaced whole (a reader never sees half of it)."""
        partial = target.with_name(f".partial-{target.name.replace('tfevents', 'events')}")
        self.fs.get_file(self.path(*parts), str(partial))
        partial.replace(target)

    def put_file(self, source: Path, *parts: str) -> None:
        """Copy one local file into the store (its folders made on a filesystem)."""
        if self.is_local:
            target = Path(self.path(*parts))
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, target)
        else:
            self.fs.put_file(str(source), self.path(*parts))

    @contextlib.contextmanager
    def local_copy(self, *parts: str) -> Iterator[Path]:
        """A directory of the store (a checkpoint) as a local path, downloaded where the root is remote."""
        if self.is_local:
            yield Path(self.path(*parts))
            return
        with tempfile.TemporaryDirectory(prefix="adaptune-") as scratch:
            self.download(self.path(*parts), Path(scratch))
            yield Path(scratch)

    def download(self, remote: str, local: Path, skip: Callable[[str], bool] = lambda name: False) -> None:
        """Every file under `remote` (a `path()`) into `local`, but those whose name `skip` refuses."""
        for path in self.fs.find(remote):
            if skip(path.rsplit("/", 1)[-1]):
                continue
            target = local / os.path.relpath(path, remote)
            target.parent.mkdir(parents=True, exist_ok=True)
            self.fs.get_file(path, str(target))

    def upload(self, local: Path, remote: str) -> None:
        """Every file a run wrote under `local` to `remote` (a `path()`): never the store's own (a record is
        published, leases and attempts are written in place), nor one still being written under its
        temporary name. Run off the training thread (BackgroundUploads): a file the run removed meanwhile
        (its finished state) is skipped."""
        files = sorted(p for p in local.rglob("*") if p.is_file() and not store_owned(p.name) and not is_partial_write(p.name))
        for path in files:
            try:
                self.fs.put_file(str(path), f"{remote}/{path.relative_to(local).as_posix()}")
            except FileNotFoundError:
                if path.exists():
                    raise


def create_local_file(path: str, data: bytes) -> None:
    """A new file holding `data`; FileExistsError where one exists (O_CREAT|O_EXCL, which Cloud Storage FUSE keeps)."""
    with open(path, "xb") as handle:
        handle.write(data)


def _version(info: dict[str, Any]) -> str:
    return str(info.get("generation") or f"{info.get('ino', '')}:{info.get('mtime')}:{info.get('size')}")
