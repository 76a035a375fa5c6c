"""The AdapterHub check: its marker, and its tests left out of every run that does not ask for them with
`-m adapterhub` (make test runs `-m "not heavy"`: without this they would build .venv-adapters there)."""

from __future__ import annotations

import pytest

MARKER = "adapterhub"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", f"{MARKER}: loads exports with AdapterHub's adapters 1.3 in its own venv, .venv-adapters "
                                       "(made on first use by tests/adapterhub/make_env.sh); run only with -m adapterhub")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if MARKER in (config.getoption("markexpr", "") or ""):
        return  # asked for (or excluded) by name: pytest's own -m selection decides
    left_out = [item for item in items if item.get_closest_marker(MARKER)]
    if left_out:
        config.hook.pytest_deselected(items=left_out)
        items[:] = [item for item in items if not item.get_closest_marker(MARKER)]
