"""Before a local sweep runs anything: the data it plans to read is on this machine (or the hub is reachable)."""

from __future__ import annotations

from typing import Any

from adaptune.data.sources import local_files_status
from adaptune.data.tasks import get_task
from adaptune.model.backbone import hub_reachable
from adaptune.sweep.plan import Plan, PlanError


def check_local_data(planned: Plan, data_dir: Any) -> None:
    """Every planned task's files are in the local mirror (or, with no mirror, the hub is reachable).
    SQuAD needs only its dev file (the local stand-in split)."""
    if data_dir is None:
        if not hub_reachable():
            raise PlanError("no local data mirror was found and the Hugging Face hub cannot be reached: pass --data-dir "
                            "(a copy in the publishers' layout, like shared/data) or run where the hub is reachable")
        return
    missing = []
    for task in planned.tasks:
        status = local_files_status(task, data_dir)
        if status != "yes" and not (get_task(task).family == "squad" and status == "only validation"):
            missing.append(f"{task} ({status})")
    if missing:
        raise PlanError(f"the data mirror {data_dir} lacks the files of: {', '.join(missing)}; add them (python -m adaptune "
                        "tasks lists the expected paths), drop those tasks, or pass --data-dir hub where the hub is reachable")
