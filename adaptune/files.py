"""Atomic file writes: a reader (or a restarted run) sees the old file or the new one, never half."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any


def atomic_write(target: str | os.PathLike[str], write: Callable[[Path], Any]) -> None:
    """Call `write(temporary_path)`, then move it over `target`; a failed write leaves `target` as it was."""
    target = Path(target)
    handle, temporary = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    os.close(handle)
    try:
        write(Path(temporary))
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
