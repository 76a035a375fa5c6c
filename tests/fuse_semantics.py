"""Cloud Storage FUSE's refusals, emulated on a local directory (no FUSE mount can be made here).

Vertex AI mounts buckets at /gcs/<bucket> with Cloud Storage FUSE. Its documented semantics
(GoogleCloudPlatform/gcsfuse, docs/semantics.md):
- "Directory rename": refused in ordinary (flat) buckets unless `--rename-dir-limit` is set (default 0);
  gcsfuse answers the rename(2) of a directory with ENOSYS ("function not implemented");
- "Hard links": not supported (link(2) fails);
- file renames work (a copy then a delete, not atomic), as do O_EXCL creates and whole-file writes.
`fuse_semantics(root)` makes os.rename / os.replace / os.link behave so under `root` and counts the refusals.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def fuse_semantics(root: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    refused: list[str] = []
    root = Path(root).resolve()
    real_rename, real_replace, real_link = os.rename, os.replace, os.link

    def under_root(path: os.PathLike[str] | str) -> bool:
        return Path(path).resolve().is_relative_to(root)

    def guarded(real):  # type: ignore[no-untyped-def]
        def rename(source, target, *args, **kwargs):  # type: ignore[no-untyped-def]
            if under_root(source) and Path(source).is_dir():
                refused.append(f"rename {source} -> {target}")
                raise OSError(errno.ENOSYS, "Function not implemented (gcsfuse: directory rename needs --rename-dir-limit)", str(source))
            return real(source, target, *args, **kwargs)
        return rename

    def link(source, target, *args, **kwargs):  # type: ignore[no-untyped-def]
        if not (under_root(source) or under_root(target)):
            return real_link(source, target, *args, **kwargs)
        refused.append(f"link {source} -> {target}")
        raise OSError(errno.ENOSYS, "Function not implemented (gcsfuse: no hard links)", str(source))

    monkeypatch.setattr(os, "rename", guarded(real_rename))
    monkeypatch.setattr(os, "replace", guarded(real_replace))
    monkeypatch.setattr(os, "link", link)
    yield refused
