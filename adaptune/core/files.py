"""Atomic file writes: a reader (or a restarted run) sees the old file or the new one, never half."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

_PARTIAL_PREFIX, _PARTIAL_SUFFIX = ".", ".tmp"  # atomic_write's temporary names (is_partial_write)


def atomic_write(target: str | os.PathLike[str], write: Callable[[Path], Any]) -> None:
    """Call `write(temporary_path)`, then move it over `target`; a failed write leaves `target` as it was.

    The file gets the permissions of an ordinary new file (0666 less the umask; mkstemp's are 0600),
    so that a results directory written by one user or service account stays readable by its group.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)  # a run's folder deleted while it trains comes back with its next save
    handle, temporary = tempfile.mkstemp(dir=target.parent, prefix=f"{_PARTIAL_PREFIX}{target.name}.", suffix=_PARTIAL_SUFFIX)
    os.close(handle)
    try:
        write(Path(temporary))
        os.chmod(temporary, 0o666 & ~current_umask())
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def is_partial_write(name: str) -> bool:
    """Whether a file name is atomic_write's temporary one (".<target>.<random>.tmp"): a file being written."""
    return name.startswith(_PARTIAL_PREFIX) and name.endswith(_PARTIAL_SUFFIX)


def json_text(data: Any, sort_keys: bool = True) -> str:
    """`data` as the project's JSON files hold it: indented, non-JSON values as their str, a final newline."""
    return json.dumps(data, indent=2, sort_keys=sort_keys, default=str) + "\n"


def write_json(target: str | os.PathLike[str], data: Any, sort_keys: bool = True) -> None:
    """`json_text(data)`, written atomically."""
    text = json_text(data, sort_keys)
    atomic_write(target, lambda temporary: temporary.write_text(text))


def current_umask() -> int:
    """The process umask, read without changing it where Linux reports it (/proc/self/status);
    elsewhere set and restored at once (os.umask has no read-only form)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask
