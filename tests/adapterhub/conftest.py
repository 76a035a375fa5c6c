"""The AdapterHub check's tests (marker `adapterhub`, declared in pyproject.toml) left out of every run that does not
name them in `-m` (a plain `pytest`, or `-m "not heavy"`, would otherwise build .venv-adapters)."""

from __future__ import annotations

import pytest

MARKER = "adapterhub"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if MARKER in (config.getoption("markexpr", "") or ""):
        return  # asked for (or excluded) by name: pytest's own -m selection decides
    left_out = [item for item in items if item.get_closest_marker(MARKER)]
    if left_out:
        config.hook.pytest_deselected(items=left_out)
        items[:] = [item for item in items if not item.get_closest_marker(MARKER)]
