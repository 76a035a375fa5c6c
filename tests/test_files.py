"""atomic_write: the written file has an ordinary file's permissions (umask), not mkstemp's 0600."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from adaptune.core.files import atomic_write, current_umask


@pytest.fixture
def umask() -> Iterator[Callable[[int], int]]:
    saved = os.umask(0o022)
    os.umask(saved)
    yield os.umask
    os.umask(saved)


def test_written_file_is_group_readable_under_umask_022(tmp_path: Path, umask) -> None:
    umask(0o022)
    target = tmp_path / "runs.parquet"
    atomic_write(target, lambda temporary: temporary.write_text("rows"))
    mode = stat.S_IMODE(target.stat().st_mode)
    assert mode == 0o644
    assert mode & stat.S_IRGRP and mode & stat.S_IROTH
    assert target.read_text() == "rows"


def test_written_file_follows_a_stricter_umask_and_overwrites_keep_it(tmp_path: Path, umask) -> None:
    target = tmp_path / "record.json"
    umask(0o077)
    assert current_umask() == 0o077
    atomic_write(target, lambda temporary: temporary.write_text("1"))
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    umask(0o002)
    atomic_write(target, lambda temporary: temporary.write_text("2"))
    assert stat.S_IMODE(target.stat().st_mode) == 0o664 and target.read_text() == "2"


def test_a_failed_write_leaves_the_target_and_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "record.json"
    target.write_text("old")

    def fail(temporary: Path) -> None:
        temporary.write_text("half")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        atomic_write(target, fail)
    assert target.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["record.json"]
