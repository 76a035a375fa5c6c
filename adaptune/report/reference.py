"""The paper's published numbers (analysis/paper_reference.json) and which suite each task is in."""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any

from adaptune.core import environment

REFERENCE_ENV = "ADAPTUNE_PAPER_REFERENCE"
_REPO_REFERENCE = Path(__file__).resolve().parents[2] / "analysis" / "paper_reference.json"


def reference_path() -> Path:
    """$ADAPTUNE_PAPER_REFERENCE, else analysis/paper_reference.json of this checkout."""
    path = Path(environment.settings().paper_reference or _REPO_REFERENCE)
    if not path.is_file():
        raise FileNotFoundError(
            f"paper reference file not found at {path}: set ${REFERENCE_ENV} to analysis/paper_reference.json "
            "(images must copy analysis/ beside adaptune/)"
        )
    return path


def load_reference(path: str | Path | None = None) -> dict[str, Any]:
    return _load(str(Path(path) if path else reference_path()))


@lru_cache(maxsize=4)
def _load(path: str) -> dict[str, Any]:
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


def glue_tasks(reference: dict[str, Any]) -> list[str]:
    """Table 1's GLUE tasks in the paper's column order, then any other GLUE task the registry knows."""
    tasks = list(reference["table1"]["tasks"])
    registry = _registry_names("GLUE_TASKS")
    return tasks + sorted(set(registry) - set(tasks))


def extra_tasks(reference: dict[str, Any]) -> list[str]:
    """Table 2's additional tasks in the paper's row order, then any other the registry knows."""
    tasks = list(reference["table2"]["tasks"])
    registry = _registry_names("EXTRA_TASKS")
    return tasks + sorted(set(registry) - set(tasks))


def task_suite(task: str, reference: dict[str, Any]) -> str:
    """"glue", "extra", "squad" or "other"."""
    if task in glue_tasks(reference):
        return "glue"
    if task in extra_tasks(reference):
        return "extra"
    if task.startswith("squad"):
        return "squad"
    return "other"


def _registry_names(attribute: str) -> list[str]:
    # The task registry is the source of truth when present; the reference file keeps the paper's order.
    try:
        from adaptune.data import tasks as registry
    except ImportError:
        return []
    names = getattr(registry, attribute, ())
    return [name if isinstance(name, str) else getattr(name, "name", str(name)) for name in names]
