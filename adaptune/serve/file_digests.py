"""Bytes and sha256 of the files `serve` writes: a bundle's manifest and an export's CHECKSUMS name each file by them."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path
from typing import Any


def sha256_of(path: Path) -> str:
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def file_entry(path: Path) -> dict[str, Any]:
    return {"bytes": path.stat().st_size, "sha256": sha256_of(path)}


def copy_file(source: Path, target: Path) -> dict[str, Any]:
    """Copy byte for byte; the copy's entry."""
    shutil.copyfile(source, target)
    return file_entry(target)
